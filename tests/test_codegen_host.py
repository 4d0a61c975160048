"""The generated element body, compiled for the CPU with g++, against the task's Model.

The pointwise family's `<kernel>_body` (everything before the `__global__` kernel: the helpers
and the fused elementwise chain) is plain C++ when CA_HD is `inline`: the fp16 conversions and
bit casts have host branches. This runs the real generated formulas, constants, promotions and
fp16/bf16 roundings on small inputs (each input pre-broadcast to the output shape) and compares
with eager PyTorch on the CPU. It does not exercise the kernel's indexing, vector path or the
CUDA math library: that needs the GPU.
"""
from __future__ import annotations

import shutil
import subprocess
from functools import lru_cache

import pytest
import torch

from core.codegen import Ref, generate
from tests.test_codegen_cases import POINTWISE_SYNTHETIC, POINTWISE_TASKS, load, small_inputs

CASES = POINTWISE_TASKS + POINTWISE_SYNTHETIC
CTYPES = {"float32": "float", "float64": "double", "float16": "unsigned short", "bfloat16": "unsigned short",
          "int64": "long long", "int32": "int", "int16": "short", "int8": "signed char", "uint8": "unsigned char",
          "bool": "unsigned char"}
GXX = shutil.which("g++")


@lru_cache(maxsize=None)
def _generated(name: str):
    return generate(load(name))


def _used_inputs(graph) -> list:
    used = {o.name for n in graph.nodes for o in n.operands if isinstance(o, Ref)} | set(graph.outputs)
    return [v for v in graph.inputs if v.name in used]


def _case_code(index: int, name: str) -> tuple[str, str]:
    gen = _generated(name)
    graph = gen.graph
    body = gen.program.source.split('extern "C" __global__')[0]
    kernel = gen.program.launches[0].kernel
    ins = _used_inputs(graph)
    outs = [graph.value(o) for o in graph.outputs]
    lines = [f"    case {index}: {{"]
    for i, v in enumerate(ins):
        lines.append(f"        const {CTYPES[v.dtype]}* a{i} = (const {CTYPES[v.dtype]}*)read_file(argv[{3 + i}], n * sizeof({CTYPES[v.dtype]}));")
    for j, v in enumerate(outs):
        lines.append(f"        {CTYPES[v.dtype]}* o{j} = ({CTYPES[v.dtype]}*)malloc(n * sizeof({CTYPES[v.dtype]}));")
    # The body's output parameters follow the launch's output arguments; model output j is the
    # program's outputs[j], which need not be the j-th of them.
    program = gen.program
    order = [a for a in program.launches[0].args if a in program.outputs]
    call = [f"a{i}[e]" for i in range(len(ins))] + [f"o{program.outputs.index(a)}[e]" for a in order]
    lines.append(f"        for (long long e = 0; e < n; ++e) case{index}::{kernel}_body({', '.join(call)});")
    for j, v in enumerate(outs):
        lines.append(f"        write_file(argv[{3 + len(ins) + j}], o{j}, n * sizeof({CTYPES[v.dtype]}));")
    lines.append("        return 0;\n    }")
    return f"namespace case{index} {{\n{body}\n}}\n", "\n".join(lines)


@lru_cache(maxsize=1)
def _harness(tmp: str) -> str:
    spaces, cases = zip(*(_case_code(i, name) for i, name in enumerate(CASES)))
    code = ["#include <cmath>", "#include <cstdio>", "#include <cstdlib>",
            "// CUDA math functions the C library lacks.",
            "static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }",
            "static inline double rsqrt(double x) { return 1.0 / sqrt(x); }",
            "static inline float erfcxf(float x) { return (float)(exp((double)x * x) * erfc((double)x)); }",
            "static inline float cyl_bessel_i0f(float x) { return std::cyl_bessel_if(0.0f, fabsf(x)); }",
            "static inline float erfinvf(float y) {     // Newton on erf from the right of the root",
            "    if (y <= -1.0f || y >= 1.0f) return y == 0.0f ? 0.0f : (float)copysign(INFINITY, y);",
            "    double x = y * 0.886226925452758, t = y;  // sqrt(pi)/2 y >= the root in magnitude",
            "    for (int k = 0; k < 100; ++k) x -= (erf(x) - t) / (1.1283791670955126 * exp(-x * x));",
            "    return (float)x; }", *spaces,
            "static void* read_file(const char* p, long long bytes) {",
            "    void* b = malloc(bytes > 0 ? bytes : 1); FILE* f = fopen(p, \"rb\");",
            "    if (!f || fread(b, 1, bytes, f) != (size_t)bytes) { perror(p); exit(2); } fclose(f); return b; }",
            "static void write_file(const char* p, const void* b, long long bytes) {",
            "    FILE* f = fopen(p, \"wb\"); fwrite(b, 1, bytes, f); fclose(f); }",
            "int main(int argc, char** argv) {",
            "    const int which = atoi(argv[1]); const long long n = atoll(argv[2]);",
            "    switch (which) {", *cases, "    }", "    return 1;", "}"]
    src = f"{tmp}/harness.cpp"
    with open(src, "w") as f:
        f.write("\n".join(code))
    exe = f"{tmp}/harness"
    done = subprocess.run([GXX, "-O1", "-std=c++17", "-DCA_HD=inline", "-w", src, "-o", exe, "-lm"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[:4000]
    return exe


@pytest.mark.skipif(GXX is None, reason="no host C++ compiler")
@pytest.mark.parametrize("name", CASES)
def test_generated_body_matches_model_on_cpu(name, tmp_path_factory):
    exe = _harness(str(tmp_path_factory.getbasetemp()))
    task = load(name)
    graph = _generated(name).graph
    model = task.make_model(seed=0, device="cpu")
    inputs = small_inputs(task, seed=1)
    with torch.no_grad():
        expected = model(*inputs)
    expected = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    shape = expected[0].shape
    n = expected[0].numel()
    values = {k: v for k, v in zip(task.input_names, inputs) if isinstance(v, torch.Tensor)}
    values.update(model.state_dict())
    work = tmp_path_factory.mktemp(name)
    args = [exe, str(CASES.index(name)), str(n)]
    for i, v in enumerate(_used_inputs(graph)):
        path = work / f"in{i}.bin"
        path.write_bytes(values[v.name].detach().expand(shape).contiguous().view(torch.uint8).numpy().tobytes())
        args.append(str(path))
    out_paths = [work / f"out{j}.bin" for j in range(len(expected))]
    args += [str(p) for p in out_paths]
    done = subprocess.run(args, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    atol, rtol = task.tolerance()
    for path, ref in zip(out_paths, expected):
        got = torch.frombuffer(bytearray(path.read_bytes()), dtype=ref.dtype).reshape(shape)
        torch.testing.assert_close(got, ref, atol=atol, rtol=rtol, equal_nan=True)
