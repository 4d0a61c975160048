"""The judge's one-pass check (compare.fast_match) against compare() itself, on the GPU: it may only
say "matches" where compare() passes the output, for every output dtype and every kind of mismatch."""
from __future__ import annotations

import pytest
import torch

from core.evaluation.compare import compare, fast_match, keep_reference

pytestmark = pytest.mark.gpu

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
TOL = {torch.float16: (1e-2, 1e-2), torch.bfloat16: (2e-2, 2e-2), torch.float32: (1e-4, 1e-4),
       torch.float64: (1e-6, 1e-6)}


def _case(name: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(1)
    ref = torch.randn(1 << 20, dtype=torch.float64, device="cuda", generator=g)
    out = ref.to(dtype).clone()       # a copy even for float64, where .to() returns ref itself
    atol, _ = TOL[dtype]
    if name == "one element off":
        out[12345] += 50 * atol + 1.0
    elif name == "nan in output":
        out[7] = float("nan")
    elif name == "nan missing":
        ref[9] = float("nan")
    elif name == "nan in both":
        ref[9] = float("nan")
        out[9] = float("nan")
    elif name == "inf disagrees":
        out[3] = float("inf")
    elif name == "bias spread thin":
        out = (ref + 0.9 * atol + 0.9 * TOL[dtype][1] * ref.abs()).to(dtype)
    elif name == "beyond the dtype's range":
        if dtype == torch.float64:
            pytest.skip("no narrower dtype")
        ref[5] = 1e39 if dtype != torch.float16 else 1e6
        out[5] = float("inf")
    elif name == "zero reference":
        ref.zero_()
        out = ref.to(dtype).clone()
    return out, ref


CASES = ["match", "one element off", "nan in output", "nan missing", "nan in both", "inf disagrees",
         "bias spread thin", "beyond the dtype's range", "zero reference"]


@pytest.mark.parametrize("kept", [False, True], ids=["float64 reference", "kept reference"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", CASES)
def test_fast_match_passes_only_what_compare_passes(dtype, name, kept):
    out, ref = _case(name, dtype)
    if kept:        # as the judge keeps it: float32 for float32 and narrower outputs
        ref = keep_reference(ref, dtype)
        if name == "beyond the dtype's range" and bool(torch.isinf(ref).any()):
            # 1e39 is inf in the float32 kept reference itself (float32 and bf16 outputs), so the
            # fast pass may decide it.
            assert fast_match(out, ref, *TOL[dtype]) in (True, None) and compare(out, ref, *TOL[dtype]) is None
            return
    atol, rtol = TOL[dtype]
    fast, slow = fast_match(out, ref, atol, rtol), compare(out, ref, atol, rtol)
    assert fast in (True, None)
    if fast:
        assert slow is None, f"fast_match passed what compare() rejects: {slow}"
    if name in ("match", "nan in both"):
        assert slow is None and fast is True          # the fast pass does decide the common case
    if name in ("beyond the dtype's range", "zero reference"):   # left to compare() (see fast_match)
        assert slow is None and fast is None
    if name in ("one element off", "nan in output", "nan missing", "inf disagrees"):
        assert slow is not None and fast is None


def test_fast_match_declines_what_it_does_not_cover():
    ref = torch.randn(64, 64, dtype=torch.float64, device="cuda")
    assert fast_match(ref.t().float(), ref.t(), 1e-4, 1e-4) is None             # not contiguous
    assert fast_match(ref.argmax(1), ref.argmax(1).double(), 0, 0) is None      # integer output
    assert fast_match(ref.float().cpu(), ref.cpu(), 1e-4, 1e-4) is None         # not on the GPU


POISON_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool, torch.uint8,
                 torch.int8, torch.int16, torch.int32, torch.int64]


@pytest.mark.parametrize("variant", [0, 1])
@pytest.mark.parametrize("dtype", POISON_DTYPES)
def test_count_poisoned_counts_what_the_mask_counts(dtype, variant):
    """The runner's one-read count of unwritten elements agrees with poisoned_mask(...).sum() on
    partial writes, at a size that is no multiple of the block, and reads only the tensor's own
    elements (a poisoned neighbour in the same storage is not counted)."""
    from core.evaluation.compare import count_poisoned, poison_, poisoned_mask

    storage = torch.empty((1 << 20) + 77, dtype=dtype, device="cuda")
    poison_(storage, variant)
    t = storage[5:-9]
    assert count_poisoned(t, variant) == t.numel()
    g = torch.Generator(device="cuda").manual_seed(3)
    written = torch.rand(t.numel(), device="cuda", generator=g) < 0.3
    # Any value but the poison: for bool, the other truth value (variant 0 poisons with True).
    t[written] = torch.tensor(variant == 1, device="cuda") if dtype == torch.bool else torch.ones((), dtype=dtype, device="cuda")
    expected = int(poisoned_mask(t, variant).sum())
    assert 0 < expected < t.numel()
    assert count_poisoned(t, variant) == expected
    if dtype.is_floating_point:
        t.fill_(float("nan"))                       # arithmetic NaNs are not the poison
        assert count_poisoned(t, variant) == 0
