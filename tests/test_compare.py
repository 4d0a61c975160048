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

    def no_compiler(dtype, ref_dtype):
        assert ref_dtype == torch.float32          # the judge keeps float32 outputs' references in float32
        raise RuntimeError("nvrtc: error: failed to open libnvrtc-builtins.so.13.0\nmore detail")

    monkeypatch.setattr(compare_module, "_fast_kernel", no_compiler)
    assert compare_module.fast_match_unavailable(torch.float32) == \
        "RuntimeError: nvrtc: error: failed to open libnvrtc-builtins.so.13.0"


def test_a_reference_kept_in_float32_gives_the_float64_references_verdicts():
    """The judge keeps float64 results for float32 and narrower outputs in float32: every case gets the
    same verdict as against the float64 reference, including values beyond the output's range, and
    outputs that miss by a little more or a little less than the tolerance."""
    from core.evaluation.compare import keep_reference, kept_reference_dtype

    assert kept_reference_dtype(torch.float64) == torch.float64
    assert {kept_reference_dtype(d) for d in (torch.float32, torch.float16, torch.bfloat16)} == {torch.float32}
    g = torch.Generator().manual_seed(1)
    ref = torch.randn(4096, generator=g, dtype=torch.float64) * 10.0 ** torch.randint(-3, 4, (4096,), generator=g)
    cases = dict(_cases())
    for dtype, (atol, rtol) in ((torch.float32, (1e-4, 1e-4)), (torch.float16, (1e-2, 1e-2)),
                                (torch.bfloat16, (1e-2, 1e-2))):
        for factor in (0.9, 1.1):        # every element just inside / just outside its tolerance
            off = (ref + factor * (atol + rtol * ref.abs())).to(dtype)
            cases[f"{dtype} x{factor}"] = (off, ref)
        cases[f"{dtype} beyond range"] = (torch.full((5,), float("inf"), dtype=dtype),
                                          torch.full((5,), 4e38, dtype=torch.float64))
    for name, (out, ref64) in cases.items():
        kept = keep_reference(ref64, out.dtype)
        assert kept.dtype == kept_reference_dtype(out.dtype), name
        tol = (1e-4, 1e-4) if out.dtype == torch.float32 else (1e-2, 1e-2)
        assert (compare(out, kept, *tol) is None) == (compare(out, ref64, *tol) is None), name
    assert keep_reference(torch.ones(3, dtype=torch.int64), torch.int64).dtype == torch.int64
