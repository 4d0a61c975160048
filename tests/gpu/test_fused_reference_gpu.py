"""The judge's fused float64 references on the GPU: taken for large tasks whose op-by-op reference is
slow, and equal there to the op-by-op ones on sets the judge draws later."""
from __future__ import annotations

import gc
import time

import pytest
import torch

from core.evaluation import protocol as P
from core.evaluation.fused_reference import disagreement
from core.evaluation.judge import Judge

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _evaluator_settings_and_memory_restored():
    """Judge(0) sets up this process as an evaluator's (no gradients, no TF32): undo it for the tests
    that run after these in the same pytest process, and give its GPU memory back (the 2 GiB task's
    references stay in PyTorch's cache otherwise, and a later test's own judge process runs short)."""
    grad, tf32 = torch.is_grad_enabled(), (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    yield
    torch.set_grad_enabled(grad)
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    gc.collect()
    torch.cuda.empty_cache()

MISH = '''
import torch
import torch.nn as nn
import torch.nn.functional as F

class Model(nn.Module):
    def forward(self, x):
        return F.mish(x)

def get_inputs():
    return [torch.randn(1 << 29)]

def get_init_inputs():
    return []
'''

# fp16, parameters drawn per model seed, a reduction, two outputs.
RMSNORM = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter((torch.rand(d) + 0.5).half())

    def forward(self, x):
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
        return y, y.sum(-1)

def get_inputs():
    return [torch.randn(32768, 8192).half()]

def get_init_inputs():
    return [8192]
'''


@pytest.mark.parametrize("name,source", [("mish_2gib", MISH), ("rmsnorm_fp16_512mib", RMSNORM)])
def test_the_judge_fuses_slow_references_and_they_equal_the_op_by_op_ones(name, source):
    judge = Judge(0)
    t0 = time.perf_counter()
    ready = judge.set_task(P.SetTask(name, source))
    print(f"{name}: set_task {time.perf_counter() - t0:.1f} s; notes: {ready.notes}")
    assert ready.reference_dtype == "float64"
    fused_notes = [n for n in ready.notes if "fused pass" in n or "stay op by op" in n]
    assert fused_notes, ready.notes                        # these references are slow enough to try
    if judge.fused is None:
        pytest.fail(f"not fused: {fused_notes}")
    bundle = judge.prepare(P.Prepare(check_sets=2, scaled_variants=1, timing_sets=1))
    refs = judge.bundles[bundle.id]["refs"]
    fused = judge.fused
    judge.fused = None
    try:
        for s in bundle.check_sets + bundle.timing_sets:
            want, prints = judge.reference_for(s)
            assert prints == bundle.fingerprints[s.label]
            assert disagreement(refs[s.label], want) == "", s.label
            assert all(r.dtype == torch.float32 for r in refs[s.label])
    finally:
        judge.fused = fused
