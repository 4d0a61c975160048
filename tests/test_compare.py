"""compare.fast_match on the CPU: it declines, and compare() decides (the GPU side is in tests/gpu)."""
from __future__ import annotations

import torch

from core.evaluation.compare import compare, fast_match


def test_fast_match_leaves_cpu_tensors_to_compare():
    ref = torch.randn(100, dtype=torch.float64)
    assert fast_match(ref.float(), ref, 1e-4, 1e-4) is None
    assert compare(ref.float(), ref, 1e-4, 1e-4) is None


def _cases() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(10, 23, generator=g, dtype=torch.float64)
    out = ref.float()
    cases = {"match": (out, ref), "zero reference": (torch.zeros(5, 7), torch.zeros(5, 7, dtype=torch.float64))}
    nan = out.clone()
    nan[3, 4] = float("nan")
    cases["nan where the reference is not"] = (nan, ref)
    ref_nan = ref.clone()
    ref_nan[9, 22] = float("nan")
    cases["nan missing"] = (out, ref_nan)
    inf = out.clone()
    inf[0, 1] = float("inf")
    cases["inf"] = (inf, ref)
    far = out.clone()
    far[2, 5] += 0.5          # two equal worst elements in different slices: the first one is named
    far[7, 20] += 0.5
    far[4, 4] += 0.01
    cases["outside tolerance"] = (far, ref)
    cases["biased"] = (out + 5e-5, ref)     # within each element's tolerance, not the error norm's
    cases["beyond float16"] = (torch.full((3, 3), float("inf"), dtype=torch.float16),
                               torch.full((3, 3), 7e4, dtype=torch.float64))
    return cases


def test_compare_in_slices_answers_as_one_pass():
    for name, (out, ref) in _cases().items():
        whole = compare(out, ref, 1e-4, 1e-4, chunk=1 << 30)
        for chunk in (1, 7, 64):
            assert compare(out, ref, 1e-4, 1e-4, chunk=chunk) == whole, (name, chunk)
    assert compare(*_cases()["match"], 1e-4, 1e-4) is None
    reason = compare(*_cases()["outside tolerance"], 1e-4, 1e-4, chunk=7)
    assert reason.startswith("3 of 230 elements outside") and "worst at (2, 5)" in reason, reason
    assert "relative error norm" in compare(*_cases()["biased"], 1e-4, 1e-6, chunk=7)
    assert compare(*_cases()["beyond float16"], 1e-4, 1e-4, chunk=2) is None


def test_fast_match_unavailable_says_why(monkeypatch):
    from core.evaluation import compare as compare_module

    assert compare_module.fast_match_unavailable(torch.int64) is None        # not one it handles

    def no_compiler(dtype):
        raise RuntimeError("nvrtc: error: failed to open libnvrtc-builtins.so.13.0\nmore detail")

    monkeypatch.setattr(compare_module, "_fast_kernel", no_compiler)
    assert compare_module.fast_match_unavailable(torch.float32) == \
        "RuntimeError: nvrtc: error: failed to open libnvrtc-builtins.so.13.0"
