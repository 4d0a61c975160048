"""The judge's fused float64 references (core/evaluation/fused_reference.py), on the CPU: the same values
as the op-by-op reference, a new graph where a differently built model needs one, and the judge taking
them only where they agree and are faster."""
from __future__ import annotations

import math

import pytest
import torch

from core.evaluation import fused_reference as fr
from core.evaluation import protocol as P
from core.evaluation.compare import keep_reference
from tests.test_evaluation_logic import TINY_TASK, _cpu_judge


@pytest.fixture(autouse=True)
def _no_grad():
    """As in the judge's process (gpuinfo.init_evaluator_process), for these tests only."""
    with torch.no_grad():
        yield


def test_disagreement_names_each_kind_of_difference():
    e = torch.tensor([1.0, -2.0, math.inf, math.nan, 0.0])
    assert fr.disagreement([e.clone()], [e]) == ""
    assert fr.disagreement([e * (1 + 1e-7)], [e]) == ""          # within AGREEMENT
    assert "differs from eager's by up to" in fr.disagreement([e + torch.tensor([0, 1e-3, 0, 0, 0])], [e])
    assert "NaNs" in fr.disagreement([torch.tensor([1.0, -2.0, math.inf, 0.0, 0.0])], [e])
    assert "infinities" in fr.disagreement([torch.tensor([1.0, -2.0, -math.inf, math.nan, 0.0])], [e])
    assert "infinities" in fr.disagreement([torch.tensor([1.0, math.inf, math.inf, math.nan, 0.0])], [e])
    assert "returned 2 outputs" in fr.disagreement([e, e], [e])
    assert "float64" in fr.disagreement([e.double()], [e])
    assert fr.disagreement([torch.arange(3)], [torch.arange(3)]) == ""
    assert "differs" in fr.disagreement([torch.arange(3) + 1], [torch.arange(3)])


class _Scaled(torch.nn.Module):
    """Parameters and a python number drawn at build time: the compiled reference must follow both."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 8)
        self.k = float(torch.rand(()))

    def forward(self, x, y):
        return torch.nn.functional.gelu(self.lin(x)) * self.k, (x.exp() * y).sum(1)


def _built(seed: int):
    torch.manual_seed(seed)
    return _Scaled(), [torch.randn(32, 16), torch.randn(32, 16).half()]


def _eager(model, inputs, dtypes):
    outs = model.double()(*[x.double() for x in inputs])
    return [keep_reference(o, d) for o, d in zip(outs, dtypes)]


def test_fused_reference_gives_the_eager_float64_reference_of_each_model():
    dtypes = [torch.float32, torch.float16]
    fused = fr.FusedReference(dtypes)
    for seed in (1, 2):          # a second model with other weights and another k
        model, inputs = _built(seed)
        want = _eager(model, inputs, dtypes)
        model, inputs = _built(seed)
        got = fused(model, inputs)
        assert [g.dtype for g in got] == [torch.float32, torch.float32]      # kept as keep_reference keeps
        assert fr.disagreement(got, want) == ""
        # ... and not the float32 computation's values
        model, inputs = _built(seed)
        low = model(inputs[0], inputs[1].float())[0]
        assert not torch.equal(low, got[0])


def _fused_judge(monkeypatch):
    judge = _cpu_judge(TINY_TASK, 1 << 30)
    monkeypatch.setattr(fr, "FUSE_AFTER_MS", 0.0)
    return judge


def test_judge_takes_the_fused_reference_only_where_it_agrees_and_is_faster(monkeypatch):
    judge = _cpu_judge(TINY_TASK, 1 << 30)
    assert judge._fuse_references(eager_ms=fr.FUSE_AFTER_MS / 2) == "" and judge.fused is None   # not worth it

    judge = _fused_judge(monkeypatch)
    note = judge._fuse_references(eager_ms=1e9)
    assert "one fused pass" in note and isinstance(judge.fused, fr.FusedReference), note
    s = P.InputSet("a", 11, 12)
    got, prints = judge.reference_for(s)
    judge.fused = None
    want, want_prints = judge.reference_for(s)
    assert prints == want_prints and fr.disagreement(got, want) == "" and got[0].dtype == torch.float32

    judge = _fused_judge(monkeypatch)
    note = judge._fuse_references(eager_ms=1e-6)          # nothing runs that fast
    assert "not faster" in note and judge.fused is None, note


def test_judge_keeps_op_by_op_references_when_the_fused_one_is_wrong_or_fails(monkeypatch):
    real_call = fr.FusedReference.__call__

    monkeypatch.setattr(fr.FusedReference, "__call__", lambda self, m, x: [o * 1.001 for o in real_call(self, m, x)])
    judge = _fused_judge(monkeypatch)
    note = judge._fuse_references(eager_ms=1e9)
    assert "differs from eager's" in note and judge.fused is None, note

    def no_compiler(self, dtypes):
        raise RuntimeError("no C++ compiler")
    monkeypatch.setattr(fr.FusedReference, "__init__", no_compiler)
    judge = _fused_judge(monkeypatch)
    note = judge._fuse_references(eager_ms=1e9)
    assert "torch.compile of the reference failed (RuntimeError: no C++ compiler)" in note and judge.fused is None


def test_a_fused_reference_that_fails_later_leaves_the_task_on_eager_references(monkeypatch):
    judge = _fused_judge(monkeypatch)

    class Failing:
        def __call__(self, model, inputs):
            raise RuntimeError("guard failure")
    judge.fused = Failing()
    s = P.InputSet("a", 5, 6)
    got, _ = judge.reference_for(s)
    assert judge.fused is None and "failed on a later set (RuntimeError: guard failure)" in judge.fused_failure
    want, _ = judge.reference_for(s)
    assert torch.equal(got[0], want[0])

    class OutOfMemory:
        def __call__(self, model, inputs):
            raise torch.OutOfMemoryError("CUDA out of memory")
    judge.fused = OutOfMemory()
    with pytest.raises(torch.OutOfMemoryError):       # prepare() and judge() make room and try again
        judge.reference_for(s)


def test_large_models_are_left_op_by_op_and_set_task_counts_operations(monkeypatch):
    with fr.OpCounter() as ops:
        (torch.randn(4, 4) * 2.0 + 1.0).exp()
    assert ops.count == 4                   # randn, mul, add, exp

    judge = _fused_judge(monkeypatch)
    note = judge._fuse_references(eager_ms=1e9, ops=fr.FUSE_MAX_OPS + 1)
    assert f"runs {fr.FUSE_MAX_OPS + 1} operations" in note and judge.fused is None, note

    # set_task counts the model's operations beside its FLOPs and hands them over with the time of its
    # last calibration reference (only on a GPU unless told otherwise).
    seen = []
    monkeypatch.setattr(type(judge), "_fuse_references", lambda self, ms, ops=0: seen.append((ms, ops)) or "")
    assert judge.set_task(P.SetTask("tiny_scale", TINY_TASK)).reference_dtype == "float64" and seen == []
    monkeypatch.setattr(type(judge), "FUSE_ON", ("cpu", "cuda"))
    judge.set_task(P.SetTask("tiny_scale", TINY_TASK))
    assert len(seen) == 1 and seen[0][0] > 0 and seen[0][1] == 1      # x * 2.0: one multiplication
