"""The data-movement family (core/codegen/lower_move.py): cat, slicing, split / chunk / unbind,
constant padding, permute / transpose copies, standalone flips, index_select, gather, advanced
indexing, unfold and diagonal become one gather kernel per chain, alone or next to the other families' kernels.

The generated programs run on the CPU under test_codegen_scan's emulation of CUDA (AddressSanitizer
on: a read past an operand fails the run) and are compared with eager PyTorch; they compile with
NVRTC for sm_80 and sm_90. The GPU runs them in tests/gpu/test_codegen_cases_gpu.py."""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

import pytest
import torch

from core.codegen import CodegenError, Graph, generate
from core.codegen.capture import capture
from core.codegen.interpret import interpret
from core.codegen.lower_move import MOVE
from core.codegen.partition import canonicalize
from core.program import KernelProgram
from core.search.space import env_from_task
from core.tasks import load_task, load_task_from_source
from core.toolchain import CompileCache, compile_cuda, nvrtc_info
from tests.test_codegen_scan import EMULATION, GXX, SANITIZE, emulated_launch

TASKS = Path(__file__).resolve().parents[1] / "resources" / "tasks"
needs_nvrtc = pytest.mark.skipif(not nvrtc_info()[0], reason="NVRTC is not available")
needs_gxx = pytest.mark.skipif(GXX is None, reason="g++ is not available")
DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8,
          "uint8": torch.uint8, "bool": torch.bool}

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"


def _source(forward: str, inputs: str, init: str = "[]", init_body: str = "") -> str:
    return HEADER + f'''
class Model(nn.Module):
    def __init__(self, *args):
        super().__init__()
        self.args = args
{init_body}
    def forward(self, {forward}

def get_inputs():
    return {inputs}

def get_init_inputs():
    return {init}
'''


# name -> source. Small shapes: the emulation runs one OS thread per CUDA thread.
CASES = {
    # KernelBench level 1's exclusive cumsum, as written there (its [:-1] cuts dim 0, not dim 1).
    "exclusive_cumsum": _source(
        "x):\n        dim = self.args[0]\n        e = torch.cat((torch.zeros_like(x.select(dim, 0).unsqueeze(dim)), x), "
        "dim=dim)[:-1]\n        return torch.cumsum(e, dim=dim)", "[torch.randn(5, 37)]", "[1]"),
    "glu_chunk": _source("x):\n        a, b = x.chunk(2, dim=-1)\n        return a * torch.sigmoid(b)",
                         "[torch.randn(3, 4, 18)]"),
    # An elementwise epilogue on the move's result: one kernel.
    "transpose_scale": _source("x):\n        return x.transpose(1, 2).contiguous() * 2.0",
                               "[torch.randn(2, 7, 9)]"),
    "tiled_epilogue_fp16": _source("x, b):\n        t = x.transpose(0, 1)\n        return torch.relu(t + b), t",
                                   "[torch.randn(40, 36).half(), torch.randn(40).half()]"),
    "transpose_tiles": _source("x):\n        return x.transpose(1, 2).contiguous()", "[torch.randn(3, 40, 37)]"),
    "pad_crop_fp16": _source("x):\n        return F.pad(x, (1, -2, 3, 0), value=0.5)",
                             "[torch.randn(2, 5, 11).half()]"),
    "roll": _source("x):\n        return torch.roll(x, 3, dims=1)", "[torch.randn(4, 10)]"),
    "cat_three": _source("x, y):\n        return torch.cat([x, y, x[:, 1:3]], dim=1)",
                         "[torch.randn(3, 5), torch.randn(3, 2)]"),
    "flip_two_dims": _source("x):\n        return torch.flip(x, [0, 2])", "[torch.randn(3, 4, 6)]"),
    "unbind_mix": _source("x):\n        a, b, c = x.unbind(1)\n        return a + b * c", "[torch.randn(4, 3, 5)]"),
    "select_int64": _source("x):\n        return x[:, 2] * 3", "[torch.randint(-9, 9, (6, 5))]"),
    "slice_steps": _source("x):\n        return x[1:-1:2, ::3]", "[torch.randn(9, 10)]"),
    "permute_bf16": _source("x):\n        return x.permute(0, 3, 1, 2).contiguous()",
                            "[torch.randn(2, 3, 4, 5).bfloat16()]"),
    # Index arithmetic: tril / triu decompose to aranges compared with each other (iota leaves).
    "tril_triu": _source("x):\n        return torch.tril(x), torch.triu(x, diagonal=1) * 2", "[torch.randn(2, 5, 7)]"),
    "arange_float": _source("x):\n        return x * torch.arange(0.5, 3.5, 0.25, device=x.device)", "[torch.randn(3, 12)]"),
    # Gathers through index tables computed when lowering: replicate / reflect pads (arange, clamp
    # or abs, then index.Tensor), nearest upsampling (2x, and 3 -> 7 / 4 -> 5 through float scales).
    "replicate_pad": _source("x):\n        return F.pad(x, (2, 3, 1, 1), mode='replicate')", "[torch.randn(2, 3, 6, 5)]"),
    "reflect_pad": _source("x):\n        return F.pad(x, (2, 1), mode='reflect') + 1", "[torch.randn(2, 3, 6)]"),
    "upsample_2x": _source("x):\n        return F.interpolate(x, scale_factor=2, mode='nearest')", "[torch.randn(2, 3, 4, 5)]"),
    "upsample_sizes": _source("x):\n        return F.interpolate(x, size=(7, 5), mode='nearest')", "[torch.randn(1, 2, 3, 4)]"),
    "advanced_index": _source("x, i):\n        return x[:, i] * 2", "[torch.randn(4, 6), torch.randint(0, 6, (9,))]"),
    # Sliding windows (Tensor.unfold, twice: 2-D patches) and diagonals (offsets both ways, trace).
    "unfold_patches": _source("x):\n        return x.unfold(2, 3, 2).unfold(3, 3, 2) * 2", "[torch.randn(2, 3, 9, 8)]"),
    "diagonals": _source("x):\n        return torch.diagonal(x, 1, 1, 2), torch.diagonal(x, -2, 2, 1) + 1",
                         "[torch.randn(3, 7, 9)]"),
    # Advanced indexing: two index tensors (negative values count from the end), dims not adjacent.
    "take_two": _source("x, i, j):\n        return x[i, j]", "[torch.randn(12, 9), torch.randint(-12, 12, (6,)), torch.randint(-9, 9, (6,))]"),
    "take_apart_fp16": _source("x, i, j):\n        return x[i, :, j] + 1",
                               "[torch.randn(5, 4, 7).half(), torch.randint(0, 5, (3, 2)), torch.randint(0, 7, (3, 2))]"),
    # torch.gather: an index of the result's shape.
    "gather_fp16": _source("x, i):\n        return torch.gather(x, 0, i) + 1", "[torch.randn(7, 5).half(), torch.randint(0, 7, (4, 5))]"),
    "split_sizes_pad": _source("x):\n        a, b = torch.split(x, [3, 5], dim=0)\n        return F.pad(b, (2, 2)), a.t()",
                               "[torch.randn(8, 6)]"),
}


@lru_cache(maxsize=None)
def case(name: str):
    task = load_task_from_source(CASES[name], name)
    return task, generate(task)


@lru_cache(maxsize=None)
def case_graph(name: str) -> Graph:
    """The captured graph (torch.export is not thread-safe: capture before any pool starts)."""
    return capture(case(name)[0])


def _reference(task) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    inputs = task.make_inputs(3, "cpu")
    out = task.make_model(0, "cpu")(*inputs)
    return inputs, list(out) if isinstance(out, (tuple, list)) else [out]


# ---- canonical form -------------------------------------------------------------------------------

def test_a_chain_of_moves_folds_into_one_node_with_its_constant():
    canon = canonicalize(case_graph("exclusive_cumsum"), rows=True)
    moves = [n for n in canon.nodes if n.op == MOVE]
    assert len(moves) == 1 and [n.op for n in canon.nodes] == [MOVE, "cumsum.default"]
    tree = moves[0].attrs["tree"]          # slice(dim 0) of cat(dim 1: zeros, x)
    assert tree["op"] == "slice" and tree["dim"] == 0 and tree["child"]["op"] == "cat"
    assert [p["child"]["op"] for p in tree["child"]["parts"]] == ["const", "in"]


def test_a_gather_is_a_move_unless_a_row_group_picks_with_it():
    canon = canonicalize(case_graph("gather_fp16"), rows=True)
    tree = next(n for n in canon.nodes if n.op == MOVE).attrs["tree"]
    assert tree["op"] == "gather" and tree["dim"] == 0 and tree["child"]["op"] == "in"
    # nn.Embedding: an index_select of its rows (its CUDA runs in tests/test_codegen_kernelbench_more.py).
    source = _source("i):\n        return self.e(i)", "[torch.randint(0, 11, (3, 4))]", "[]", "        self.e = nn.Embedding(11, 6)")
    embedding = canonicalize(capture(load_task_from_source(source, "embedding")), rows=True)
    assert [n.attrs["tree"]["op"] for n in embedding.nodes if n.op == MOVE] == ["index"]
    # Cross-entropy picks the target's logit with a gather: that stays in the row group's reduction.
    loss = canonicalize(capture(load_task(TASKS / "loss_cross_entropy.py")), rows=True)
    assert not any(n.op in (MOVE, "gather.default") for n in loss.nodes)


def test_flips_next_to_a_scan_stay_with_the_scan():
    gen = generate(load_task(TASKS / "scan_cumsum_reverse.py"))
    assert gen.family == "scan" and len(gen.program.launches) == 1


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_generates_with_a_move_group(name):
    _, gen = case(name)
    assert "move" in gen.family.split("+"), gen.family
    assert any("data movement:" in n for n in gen.notes), gen.notes


def test_what_has_no_lowering_is_still_named():
    src = _source("x, y):\n        return torch.cat([x, y.double()], dim=0)", "[torch.randn(2, 3), torch.randn(2, 3)]")
    with pytest.raises(CodegenError, match="cat"):         # mixed dtypes: cat promotes, no copy does
        generate(load_task_from_source(src, "mixed_cat"))


# ---- the kernels on the CPU -----------------------------------------------------------------------

def emulate_moves(task, graph: Graph, program: KernelProgram,
                  inputs: list[torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Run the program's move kernels on the CPU; {buffer: (emulated, interpreted)} for each of their
    outputs. Buffers that other families' kernels write are filled with the interpreted graph's
    values instead (those families have their own emulations; the GPU test runs the whole program)."""
    plan = program.resolve(env_from_task(task))
    names = list(task.input_names)
    feeds = dict(zip(names, inputs))
    node_names = {n.name for n in graph.nodes}

    value_of = dict(zip(plan.outputs, graph.outputs))     # a lone group names its buffers its own way

    def interpreted(name: str) -> torch.Tensor:
        name = name if name in node_names else value_of[name]
        return interpret(Graph(graph.task, graph.inputs, graph.nodes, [name], graph.constants), feeds)[0]

    moves = [launch for launch in plan.launches if "_move" in launch.kernel]
    written = {launch.args[-1].name for launch in moves}
    # Only the move groups' code (the others' kernels are device code the host build lacks); their
    # kernels sit in namespaces ca_g<i> (extern "C": one symbol each on the GPU).
    sections = re.split(r"(?=\n// ==== group \d+: )", program.source)
    source = "".join(x for x in sections if not x.startswith("\n// ==== group") or ": move" in x.split("\n")[1])
    spaces = sorted(set(re.findall(r"namespace (ca_g\d+) \{", source)))
    lines = [EMULATION, source, *(f"using namespace {ns};" for ns in spaces), "int main() {"]
    files: dict[str, torch.Tensor] = dict(feeds)
    for buf in plan.buffers:
        if buf.name not in written and buf.name in node_names:
            files[buf.name] = interpreted(buf.name).reshape(buf.shape)
    for i, name in enumerate(files):
        lines.append(f'    unsigned char* b_{name} = ca_read("in{i}.bin");')
    for buf in plan.buffers:
        if buf.name not in files:
            nbytes = torch.empty(buf.shape, dtype=DTYPES[buf.dtype], device="meta").nbytes
            lines.append(f"    unsigned char* b_{buf.name} = ca_alloc({nbytes}, 0xA5);")
    for launch in moves:
        lines.append("    " + emulated_launch(launch, {b: f"b_{b}" for b in [*names, *(x.name for x in plan.buffers)]}))
    for i, name in enumerate(sorted(written)):
        buf = next(b for b in plan.buffers if b.name == name)
        nbytes = torch.empty(buf.shape, dtype=DTYPES[buf.dtype], device="meta").nbytes
        lines.append(f'    ca_write("out{i}.bin", b_{name}, {nbytes});')
    lines += ["    return 0;", "}"]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for i, t in enumerate(files.values()):
            (work / f"in{i}.bin").write_bytes(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        (work / "main.cpp").write_text("\n".join(lines))
        build = subprocess.run([GXX, "-std=c++17", "-O1", "-w", "-pthread", *SANITIZE, *program.compile_options(),
                                "main.cpp", "-o", "main"], cwd=work, capture_output=True, text=True, timeout=240)
        assert build.returncode == 0, f"g++ failed:\n{build.stderr[:4000]}"
        run = subprocess.run(["./main"], cwd=work, capture_output=True, text=True, timeout=240,
                             env={**os.environ, "ASAN_OPTIONS": "detect_leaks=0"})
        assert run.returncode == 0, f"the emulated kernels failed:\n{run.stderr[:2000]}"
        out = {}
        for i, name in enumerate(sorted(written)):
            buf = next(b for b in plan.buffers if b.name == name)
            data = bytearray((work / f"out{i}.bin").read_bytes())
            got = torch.frombuffer(data, dtype=DTYPES[buf.dtype]).reshape(buf.shape).clone()
            out[name] = (got, interpreted(name).reshape(buf.shape))
        return out


def _schedules(gen) -> list[dict]:
    """The default; every move group at BLOCK=128, ITEMS=8, gathering (tails inside a thread's
    items); and a transpose in its other form (TILED flipped)."""
    default = gen.spec.default()
    other = {k: (128 if k.endswith("BLOCK") else 8 if k.endswith("ITEMS") else 0 if k.endswith("TILED") else v)
             for k, v in default.items()}
    flipped = {k: (1 - v if k.endswith("TILED") else v) for k, v in default.items()}
    picks = [default] + [s for s in (other, flipped) if s != default and gen.spec.legal(s)]
    return [s for i, s in enumerate(picks) if s not in picks[:i]]


@needs_gxx
def test_generated_moves_run_correctly_under_cpu_emulation():
    jobs = [(name, schedule) for name in sorted(CASES) for schedule in _schedules(case(name)[1])]
    graphs = {name: case_graph(name) for name in CASES}

    def run(job):
        name, schedule = job
        task, gen = case(name)
        inputs, _ = _reference(task)
        return job, emulate_moves(task, graphs[name], gen.program.with_schedule(schedule), inputs)

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(run, jobs))
    assert len(results) >= len(CASES) + 8
    assert sum(s.get("TILED") == 1 for _, s in jobs) >= 2 and sum(s.get("TILED") == 0 for _, s in jobs) >= 2
    for (name, schedule), outs in results:
        assert outs, (name, "no move kernel ran")
        for buf, (got, want) in outs.items():       # copies: the same bits as PyTorch's
            assert got.dtype == want.dtype and got.shape == want.shape, (name, schedule, buf)
            if torch.equal(got, want):
                continue
            assert want.is_floating_point() and "epilogue" in " ".join(case(name)[1].notes), (name, buf)
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)   # an epilogue's math, in fp32


@needs_nvrtc
def test_moves_compile_for_sm80_and_sm90(tmp_path_factory):
    cache = CompileCache(tmp_path_factory.getbasetemp() / "move-cache")
    jobs = [(name, s, arch) for name in sorted(CASES) for s in _schedules(case(name)[1]) for arch in ("sm_80", "sm_90")]

    def build(job):
        name, schedule, arch = job
        program = case(name)[1].program.with_schedule(schedule)
        return job, compile_cuda(program.source, arch=arch, options=program.compile_options(), cache=cache)

    with ThreadPoolExecutor(2) as pool:
        for (name, schedule, arch), result in pool.map(build, jobs):
            assert result.ok, f"{name} {schedule} {arch}:\n{result.error_summary()}"


# ---- products with a diagonal matrix (partition._diagonal_product) ---------------------------------

DIAGONAL = {
    # KernelBench level 1's "Matmul with diagonal matrices": diag(A) @ B, and B @ diag(A) in fp16.
    "diag_left": _source("A, B):\n        return torch.diag(A) @ B", "[torch.randn(33), torch.randn(33, 20)]"),
    "diag_right_fp16": _source("A, B):\n        return B @ torch.diag(A)",
                               "[torch.randn(17).half(), torch.randn(9, 17).half()]"),
}


def test_a_product_with_a_diagonal_matrix_is_a_broadcast_multiply():
    from tests.test_codegen_fuzz import FuzzCase, run_fuzz

    for name, source in DIAGONAL.items():
        gen = generate(load_task_from_source(source, name))
        assert [g.family for g in gen.groups] == ["pointwise"], gen.family     # no n x n matrix, no matmul
    # The whole program against the Model, in the fuzz's emulation (several schedules).
    with tempfile.TemporaryDirectory() as tmp:
        outcomes = run_fuzz([FuzzCase(n, "move", s) for n, s in DIAGONAL.items()], 0, Path(tmp))
    assert len(outcomes) == 2 and all(not o.failures and not o.skipped for o in outcomes), \
        [o.failures for o in outcomes]
    # A lower-triangular matrix is not diagonal: its product stays a matrix product (the matmul family).
    tril = _source("A, B):\n        return torch.tril(A) @ B", "[torch.randn(8, 8), torch.randn(8, 3)]")
    assert "matmul" in [g.family for g in generate(load_task_from_source(tril, "tril_mm")).groups]
