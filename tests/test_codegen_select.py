"""The selection family (core/codegen/lower_select.py): sort, argsort, msort, topk, kthvalue, median and
nanmedian. Each case generates one select group (beside other groups where the Model computes
around it), and its CUDA matches the Model under the fuzz harness's CPU emulation (AddressSanitizer
on) at the default and a random legal schedule: rows along the last dim and along middle or first
dims (strided), many short rows per block and single long rows, descending orders, ties (integers,
rounded fp16: the stable order, indices compared exactly), NaN (median returns it, nanmedian skips
it), -0.0 beside 0.0, fp16 / bf16 / fp64 / integer inputs, and torch.quantile / nanquantile (a sort,
then picks and interpolation by the other families). The sources compile with NVRTC for sm_80
and sm_90. The GPU runs them against PyTorch's CUDA kernels in tests/gpu/test_codegen_cases_gpu.py."""
from __future__ import annotations

import pytest

from core.codegen import CodegenError, generate
from core.codegen.lower_select import LONG_MAX_ROW, MAX_ROW
from core.tasks import load_task_from_source
from core.toolchain import nvrtc_info
from tests.test_codegen_fuzz import GXX
from tests.test_codegen_kernelbench_style import _task as T
from tests.test_codegen_kernelbench_style import compile_cases, emulate_cases

CASES = {
    "sort_rows": T(["return torch.sort(x, dim=1)"], "[torch.randn(6, 37)]"),
    "sort_descending_dim0": T(["return torch.sort(x, dim=0, descending=True)"], "[torch.randn(37, 6)]"),
    "argsort_middle_dim": T(["return torch.argsort(x, dim=1)"], "[torch.randn(3, 20, 5)]"),
    "argsort_descending_many_rows": T(["return torch.argsort(x, dim=-1, descending=True)"], "[torch.randn(300, 7)]"),
    "sort_one_long_row": T(["return torch.sort(x, dim=-1)"], f"[torch.randn(1, {MAX_ROW})]"),
    "sort_rows_of_one": T(["return torch.sort(x, dim=1)"], "[torch.randn(5, 1)]"),
    "sort_int_ties": T(["return torch.sort(x, dim=1, stable=True)"], "[torch.randint(-5, 5, (7, 33))]"),
    "sort_int64_descending_ties": T(["return torch.sort(x, dim=0, descending=True, stable=True)"],
                                    "[torch.randint(-3, 3, (40, 3))]"),
    "sort_uint8": T(["return torch.sort(x, dim=1, stable=True)"], "[torch.randint(0, 255, (4, 50), dtype=torch.uint8)]"),
    "sort_half_ties": T(["return torch.sort(x.half().round(), dim=1, stable=True)"], "[torch.randn(7, 40)]"),
    "sort_bf16_descending": T(["return torch.sort(x.bfloat16(), dim=1, descending=True, stable=True)"],
                              "[torch.randn(5, 64)]"),
    "sort_double": T(["return torch.sort(x.double(), dim=1, descending=True)[0].float()"], "[torch.randn(7, 40)]"),
    "sort_signed_zeros": T(["return torch.sort(x * 0.0, dim=1, stable=True)"], "[torch.randn(4, 40)]"),
    "sort_nan_last_or_first": T(["a = torch.sqrt(x)", "u, i = torch.sort(a, dim=1, stable=True)", "d, j = torch.sort(a, dim=1, descending=True, stable=True)", "return u, i, d, j"],
                                "[torch.randn(6, 45)]"),
    "msort": T(["return torch.msort(x)"], "[torch.randn(33, 4)]"),
    "topk_rows": T(["return torch.topk(x, 5, dim=1)"], "[torch.randn(16, 100)]"),
    "topk_smallest_dim0": T(["v, i = torch.topk(x, 3, dim=0, largest=False)", "return v * 2, i"], "[torch.randn(50, 9)]"),
    "topk_long_rows_sum": T(["return torch.topk(torch.relu(x), 8, dim=-1).values.sum(-1)"], "[torch.randn(16, 300)]"),
    "topk_one": T(["return torch.topk(x, 1, dim=-1)"], "[torch.randn(64, 1000)]"),
    # Long rows, small k: each thread's best candidates in registers first (LOCAL=1, the default here).
    "topk_local_candidates": T(["return torch.topk(x, 5, dim=-1)"], "[torch.randn(3, 9000)]"),
    "topk_local_smallest_past_nan": T(["return torch.topk(torch.sqrt(x), 3, dim=-1, largest=False)"],
                                      "[torch.randn(2, 8500)]"),
    "kthvalue": T(["return torch.kthvalue(x, 4, dim=1)"], "[torch.randn(6, 9)]"),
    "kthvalue_keepdim_strided": T(["return torch.kthvalue(x, 30, dim=0, keepdim=True)"], "[torch.randn(33, 7, 3)]"),
    "median_dim_keepdim": T(["return torch.median(x, dim=-1, keepdim=True)"], "[torch.randn(6, 9)]"),
    "median_even_rows": T(["return torch.median(x, dim=1)"], "[torch.randn(40, 10)]"),
    "median_whole_tensor": T(["return torch.median(x)"], "[torch.randn(6, 9)]"),
    "median_nan": T(["return torch.median(torch.sqrt(x), dim=1).values"], "[torch.randn(6, 9)]"),
    "median_int": T(["return torch.median(x, dim=0).values"], "[torch.randint(-100, 100, (11, 5))]"),
    "nanmedian": T(["return torch.nanmedian(torch.log(x), dim=1).values"], "[torch.randn(6, 9)]"),
    "nanmedian_whole_tensor": T(["return torch.nanmedian(torch.log(x))"], "[torch.randn(5, 7)]"),
    # torch.quantile sorts, then picks and interpolates with elementwise ops and gathers (its index
    # cast, _to_copy with layout=torch.strided spelt out, was refused until 2026-12-07).
    "quantile_rows": T(["return torch.quantile(x, 0.3, dim=1)"], "[torch.randn(6, 9)]"),
    "quantile_whole_tensor": T(["return torch.quantile(x, 0.75)"], "[torch.randn(6, 9)]"),
    "nanquantile_columns": T(["return torch.nanquantile(torch.log(x + 1), 0.5, dim=0)"], "[torch.randn(6, 9)]"),
    # Rows longer than MAX_ROW: chunks sorted in shared memory, then merged in global memory.
    "sort_long_rows": T(["return torch.sort(x, dim=-1, stable=True)"], f"[torch.randn(2, {MAX_ROW + 3000})]"),
    "argsort_long_strided_descending_ties": T(["return torch.argsort(x, dim=0, descending=True, stable=True)"],
                                              f"[torch.randint(-20, 20, ({MAX_ROW + 77}, 2))]"),
    "topk_long_row_past_nan": T(["return torch.topk(torch.sqrt(x), 20, dim=-1, largest=False)"],
                                f"[torch.randn(1, {2 * MAX_ROW + 5})]"),
    # topk of a few on long rows: each chunk's first k from per-thread candidates, then the merges.
    "topk_long_local_rows": T(["return torch.topk(x, 5, dim=-1)"], f"[torch.randn(2, {2 * MAX_ROW + 5})]"),
    "topk_long_local_strided_smallest": T(["v, i = torch.topk(torch.sqrt(x), 16, dim=0, largest=False)", "return v, i"],
                                          f"[torch.randn({MAX_ROW + 300}, 3)]"),
    "topk_long_local_int_ties": T(["return torch.topk(x, 1, dim=-1).values"], f"[torch.randint(-50, 50, (3, {MAX_ROW + 9}))]"),
    "median_whole_large_tensor": T(["return torch.median(x)"], "[torch.randn(33, 1001)]"),
    "nanmedian_long_rows_fp16": T(["return torch.nanmedian(torch.log(x.half()), dim=1).values"], f"[torch.randn(2, {MAX_ROW + 1})]"),
    # kthvalue / median / nanmedian of long rows: a radix select (counting passes, then the position).
    "kthvalue_long_strided_indices": T(["return torch.kthvalue(x, 7000, dim=0)"], f"[torch.randn({MAX_ROW + 50}, 3)]"),
    "median_long_rows_nan": T(["return torch.median(torch.sqrt(x), dim=1).values"],
                              f"[torch.cat([torch.randn(1, {MAX_ROW + 40}).abs(), torch.randn(2, {MAX_ROW + 40})])]"),
    "median_double_long": T(["return torch.median(x.double(), dim=-1)"], f"[torch.randn(2, {MAX_ROW + 5})]"),
    "nanmedian_whole_bf16": T(["return torch.nanmedian(torch.log(x.bfloat16()))"], "[torch.randn(200, 100)]"),
    "kthvalue_long_int64": T(["return torch.kthvalue(x, 17000, dim=1).values"], f"[torch.randint(-9, 9, (2, {MAX_ROW + 900}))]"),
    "linear_topk_softmax": T(["v, i = torch.topk(self.m(x), 4, dim=-1)", "return torch.softmax(v, -1), i"],
                             "[torch.randn(32, 64)]", ["self.m = nn.Linear(i, o)"], ", i, o", "[64, 48]"),
}


@pytest.mark.skipif(GXX is None, reason="no host C++ compiler")
@pytest.mark.timeout(900)
def test_selections_generate_and_match_the_model(monkeypatch):
    for name in CASES:
        gen = generate(load_task_from_source(CASES[name], name))
        assert "select" in [g.family for g in gen.groups], (name, gen.family)
    outcomes = emulate_cases(CASES, 17, monkeypatch)
    assert sum(o.runs == 2 for o in outcomes) >= len(outcomes) - 3, [(o.case.name, o.runs) for o in outcomes]


@pytest.mark.skipif(not nvrtc_info()[0], reason="NVRTC is not available")
def test_selections_compile_for_sm80_and_sm90(tmp_path_factory):
    compile_cases(CASES, tmp_path_factory.getbasetemp() / "select-cache")


def test_the_schedule_space_keeps_shared_memory_and_threads_in_use():
    gen = generate(load_task_from_source(T(["return torch.sort(x, dim=1)"], "[torch.randn(100, 12000)]"), "s"))
    assert gen.spec.default() == {"BLOCK": 256, "ROWS": 1}
    assert not gen.spec.legal({"BLOCK": 256, "ROWS": 2})          # 2 x 16384 pairs of 8 bytes: 256 KB
    short = generate(load_task_from_source(T(["return torch.sort(x, dim=1)"], "[torch.randn(1000, 7)]"), "s"))
    assert short.spec.default() == {"BLOCK": 256, "ROWS": 64}     # 64 rows of 8 pairs per block
    assert not short.spec.legal({"BLOCK": 1024, "ROWS": 1})       # 1024 threads for 4 compare-exchanges
    # topk of a few of long rows: per-thread candidates (16 KB of pairs) instead of a 16384-pair sort.
    topk = generate(load_task_from_source(T(["return torch.topk(x, 5, dim=-1)"], "[torch.randn(8, 16384)]"), "t"))
    assert topk.spec.default() == {"BLOCK": 256, "ROWS": 1, "LOCAL": 1}
    assert topk.spec.legal({"BLOCK": 256, "ROWS": 1, "LOCAL": 0})
    assert not topk.spec.legal({"BLOCK": 256, "ROWS": 2, "LOCAL": 1})
    # Rows of 4096, k = 16: 128 threads of 16 candidates, each walking 2 of them.
    mid = generate(load_task_from_source(T(["return torch.topk(x, 16, dim=-1)"], "[torch.randn(8, 4096)]"), "t"))
    assert mid.spec.default() == {"BLOCK": 128, "ROWS": 1, "LOCAL": 1}
    few = generate(load_task_from_source(T(["return torch.topk(x, 5, dim=-1)"], "[torch.randn(8, 1000)]"), "t"))
    assert few.spec.default()["LOCAL"] == 0 and not few.spec.legal({"BLOCK": 256, "ROWS": 1, "LOCAL": 1})


def test_long_rows_select_one_pair_by_radix_passes_over_the_key_bytes():
    from core.program import TensorInfo

    med = generate(load_task_from_source(T(["return torch.median(x, dim=-1)"], "[torch.randn(3, 100000)]"), "m"))
    assert med.spec.default() == {"BLOCK": 256, "SEG": 16384}
    # 32-bit keys: 4 passes of 8 bits, then the one that finds the position
    assert [launch.kernel for launch in med.program.launches] == ["m_select_count"] * 4 + ["m_select_find"]
    plan = med.program.with_schedule({"BLOCK": 128, "SEG": 4096}).resolve({"x": TensorInfo((3, 100000), "float32")})
    assert {launch.grid[0] for launch in plan.launches} == {3 * 25}
    work = next(b for b in plan.buffers if b.name == "m_select_work")
    assert work.zeroed and work.shape == (3, 258)       # left zeroed: bins and counters set back by the last block
    big = generate(load_task_from_source(T(["return torch.kthvalue(x, 9, dim=0).values"], "[torch.randint(0, 9, (40000, 2))]"), "k"))
    assert [launch.kernel for launch in big.program.launches].count("k_select_count") == 8     # int64 keys


def test_long_rows_sort_in_chunks_then_merge_passes_the_chunk_size_needs():
    from core.program import TensorInfo

    gen = generate(load_task_from_source(T(["return torch.sort(x, dim=-1)"], "[torch.randn(3, 100000)]"), "s"))
    assert gen.spec.default() == {"BLOCK": 256, "CHUNK": 8192}
    kernels = [launch.kernel for launch in gen.program.launches]
    # chunks of 2048 (the smallest CHUNK) need 6 merge passes for 49 runs; then the pick
    assert kernels == ["s_select_chunks"] + ["s_select_merge"] * 6 + ["s_select"]
    env = {"x": TensorInfo((3, 100000), "float32")}
    plan = gen.program.with_schedule({"BLOCK": 256, "CHUNK": 16384}).resolve(env)
    # 7 chunks of 16384 a row: 3 passes; the other 3 are one block that returns; tiles of 1024 pairs
    assert [launch.grid[0] for launch in plan.launches[1:7]] == [3 * 98] * 3 + [1] * 3
    assert plan.launches[1].shared_bytes == 1024 * 8 and plan.launches[0].shared_bytes == 16384 * 8
    assert {b.name: b.shape for b in plan.buffers}["s_select_keys"] == (2, 3, 100000)
    # topk of a few: a chunk's first k from BLOCK * 8 candidates in shared memory, not the chunk sorted
    top = generate(load_task_from_source(T(["return torch.topk(x, 5, dim=-1)"], "[torch.randn(3, 100000)]"), "t"))
    assert top.spec.default() == {"BLOCK": 128, "CHUNK": 16384}
    assert not top.spec.legal({"BLOCK": 1024, "CHUNK": 8192})             # 8192 candidates: the whole chunk
    plan = top.program.resolve({"x": TensorInfo((3, 100000), "float32")})
    assert plan.launches[0].grid[0] == 3 * 7 and plan.launches[0].shared_bytes == 128 * 8 * 8


@pytest.mark.parametrize("body, op", [
    ("return torch.topk(x, 3, dim=1, sorted=False)", "topk.default"),      # PyTorch's order is unspecified
    ("return torch.sort(x, dim=1)", "sort.default"),                      # rows longer than LONG_MAX_ROW
    ("return torch.mode(x, dim=1)", "mode.default"),
])
def test_what_the_family_does_not_take_is_refused_with_the_op_named(body, op):
    shape = f"(1, {LONG_MAX_ROW + 1})" if "sort(" in body else "(4, 20)"
    with pytest.raises(CodegenError, match=op.replace(".", r"\.")):
        generate(load_task_from_source(T([body], f"[torch.randn{shape}]"), "refused"))
