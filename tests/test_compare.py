"""compare.fast_match on the CPU: it declines, and compare() decides (the GPU side is in tests/gpu)."""
from __future__ import annotations

import torch

from core.evaluation.compare import compare, fast_match


def test_fast_match_leaves_cpu_tensors_to_compare():
    ref = torch.randn(100, dtype=torch.float64)
    assert fast_match(ref.float(), ref, 1e-4, 1e-4) is None
    assert compare(ref.float(), ref, 1e-4, 1e-4) is None
