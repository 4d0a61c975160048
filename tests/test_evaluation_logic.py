"""CPU tests of the evaluator's pure logic: comparisons, poison, the no-fallback guard, tensor
files, timing statistics, ptxas parsing, cache keys of baselines and ceilings."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from core.evaluation.channel import read_tensor, remove_scratch, scratch_dir, write_tensor
from core.evaluation.compare import _poison_word, close_mask, compare, count_poisoned, fingerprint, poison_, poisoned_mask
from core.evaluation.evaluator import Baselines, baselines_path
from core.evaluation.guard import guarded
from core.evaluation.results import EvalResult, Status, Timing
from core.evaluation.roofline import (FLOOR_MARGIN, Ceilings, below_floor, ceilings_path, floor_ms, load_ceilings,
                                     save_json_atomic, warm_up)


# ---- compare ---------------------------------------------------------------------------------------

def test_compare_accepts_within_tolerance_and_names_the_worst_element():
    ref = torch.randn(64, 32, dtype=torch.float64)
    assert compare(ref.float(), ref, 1e-4, 1e-4) is None
    out = ref.float().clone()
    out[3, 7] += 0.5
    reason = compare(out, ref, 1e-4, 1e-4)
    assert "1 of 2048 elements" in reason and "(3, 7)" in reason


def test_compare_checks_the_relative_error_norm():
    ref = torch.ones(10000, dtype=torch.float64)
    out = (ref * (1 + 0.9e-4)).float()          # each element within rtol, the norm is not
    assert compare(out, ref, 1e-4, 1e-4) is None or "norm" in compare(out, ref, 1e-4, 1e-4)
    out = (ref * (1 + 1.5e-4)).float()
    assert compare(out, ref, 1e-4, 1e-4) is not None


def test_compare_nan_and_inf_must_match():
    ref = torch.tensor([1.0, float("nan"), float("inf"), 2.0], dtype=torch.float64)
    assert compare(ref.float(), ref, 1e-4, 1e-4) is None
    bad = ref.float().clone()
    bad[0] = float("nan")
    assert "NaN output" in compare(bad, ref, 1e-4, 1e-4)
    bad = ref.float().clone()
    bad[1] = 0.0
    assert "not NaN" in compare(bad, ref, 1e-4, 1e-4)
    bad = ref.float().clone()
    bad[2] = -float("inf")
    assert "Inf" in compare(bad, ref, 1e-4, 1e-4)


def test_a_float64_reference_beyond_the_output_range_expects_inf():
    # A float32 product past FLT_MAX is inf in any float32 output; the float64 reference is finite.
    ref = torch.tensor([3.5e38, -4e38, 3.0e38, 1.0], dtype=torch.float64)
    out = torch.tensor([math.inf, -math.inf, 3.0e38, 1.0], dtype=torch.float32)
    assert compare(out, ref, 1e-4, 1e-4) is None
    assert bool(close_mask(out, ref, 1e-4, 1e-4).all())
    # 3.0e38 fits in float32: inf there is still wrong.
    wrong = torch.tensor([math.inf, -math.inf, math.inf, 1.0], dtype=torch.float32)
    assert "+-Inf" in compare(wrong, ref, 1e-4, 1e-4)
    assert not bool(close_mask(wrong, ref, 1e-4, 1e-4)[2])
    # A finite output where the reference rounds to inf is wrong too.
    finite = torch.tensor([3.4e38, -math.inf, 3.0e38, 1.0], dtype=torch.float32)
    assert "+-Inf" in compare(finite, ref, 1e-4, 1e-4)


def test_compare_rejects_shape_and_non_tensor():
    ref = torch.zeros(4, dtype=torch.float64)
    assert "shape" in compare(torch.zeros(5), ref, 1e-4, 1e-4)

    class Sneaky(torch.Tensor):
        pass

    assert "not a plain torch.Tensor" in compare(torch.zeros(4).as_subclass(Sneaky), ref, 1e-4, 1e-4)


def test_integer_outputs_compare_exactly():
    ref = torch.tensor([1, 2, 3])
    assert compare(ref.clone(), ref, 0, 0) is None
    assert compare(torch.tensor([1, 2, 4]), ref, 0, 0) is not None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32])
def test_poison_is_detected_and_differs_from_arithmetic(dtype):
    t = torch.empty(100, dtype=dtype)
    poison_(t)
    assert bool(poisoned_mask(t).all())
    if dtype.is_floating_point:
        assert bool(torch.isnan(t).all())
        computed = torch.zeros(100, dtype=dtype) / torch.zeros(100, dtype=dtype)   # arithmetic NaN
        assert not bool(poisoned_mask(computed).any())
    t[:10] = 1
    assert int(poisoned_mask(t).sum()) == 90
    poison_(t, 1)
    assert bool(poisoned_mask(t, 1).all())


@pytest.mark.parametrize("variant", [0, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.bool,
                                   torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64])
def test_the_one_read_count_looks_for_the_bits_poison_writes(dtype, variant):
    """count_poisoned compares each element's bits with _poison_word on the GPU: that word must be
    exactly what poison_ wrote (the CPU count goes through the mask, which the GPU test checks)."""
    t = torch.empty(8, dtype=dtype)
    poison_(t, variant)
    word = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    width = t.element_size() * 8
    assert {int(b) % (1 << width) for b in t.view(word)} == {_poison_word(t, variant)}
    if dtype == torch.bool:
        t[:3] = variant == 1                                # the other truth value
    else:
        flipped = _poison_word(t, variant) ^ 1              # one bit off: a NaN, but not the poison
        t.view(word)[:3] = flipped - (1 << width) if flipped >= 1 << (width - 1) and word != torch.uint8 else flipped
    assert count_poisoned(t, variant) == 5


def test_the_second_run_holds_integer_outputs_to_both_poisons_and_floats_to_their_own():
    """Runner.check_unwritten as the first set's second run calls it: a float output is judged by
    its own poison alone (no mask of the first run is made for it); an integer output is unwritten
    only where it held each run's poison, since an integer result may equal one pattern."""
    from core.evaluation.runner import CandidateFailure, Runner

    floats, ints = torch.ones(6), torch.zeros(6, dtype=torch.int32)
    first_ints = ints.clone()
    poison_(first_ints[:2], 0)
    poison_(ints[:2], 1)                    # elements 0 and 1 held both patterns: never written
    poison_(ints[2:3], 1)                   # element 2 held only the second: a result, written
    also = [None, poisoned_mask(first_ints, 0)]
    with pytest.raises(CandidateFailure, match="partial write: 2 of 6 elements of output 1"):
        Runner.check_unwritten(None, [floats, ints], poisoned_mask, variant=1, only_floats=True, also=also)
    poison_(floats[5:], 1)
    with pytest.raises(CandidateFailure, match="partial write: 1 of 6 elements of output 0"):
        Runner.check_unwritten(None, [floats, ints], poisoned_mask, variant=1, only_floats=True, also=also)


def test_close_mask_treats_matching_nans_as_equal():
    a = torch.tensor([float("nan"), 1.0])
    assert bool(close_mask(a, a.clone(), 0, 0).all())


def test_fingerprint_is_sensitive_to_order_and_values():
    a, b = torch.arange(10.0), torch.arange(10.0).flip(0)
    assert fingerprint([a]) == fingerprint([a.clone()])
    assert fingerprint([a]) != fingerprint([b])
    assert fingerprint([a, 3]) != fingerprint([a, 4])
    ints = torch.arange(1000, dtype=torch.int32)
    bumped = ints.clone()
    bumped[999] += 1
    assert fingerprint([ints])[0] != fingerprint([bumped])[0]
    assert fingerprint([torch.ones(10, dtype=torch.float16)])[0] == 10.0


# ---- guard -----------------------------------------------------------------------------------------

def test_guard_allows_allocation_views_and_metadata():
    x = torch.randn(4, 4)

    def ok():
        y = torch.empty_like(x).view(16).reshape(4, 4).t()
        z = torch.zeros(3)
        return y.shape, x.stride(), z, x.numel()

    _, guard = guarded(ok)
    assert guard.reason is None


@pytest.mark.parametrize("fn", [lambda x: x @ x, lambda x: x.relu(), lambda x: x + 1, lambda x: x.t().contiguous(),
                                lambda x: torch.nn.functional.gelu(x), lambda x: x.clone(), lambda x: x.sum()])
def test_guard_catches_compute(fn):
    _, guard = guarded(fn, torch.randn(4, 4))
    assert guard.reason and "calls PyTorch" in guard.reason


def test_guard_records_even_when_the_candidate_swallows_the_error():
    x = torch.randn(4)

    def sneaky():
        try:
            return x * 2
        except Exception:
            return torch.empty_like(x)

    _, guard = guarded(sneaky)
    assert "aten.mul" in guard.reason


# ---- tensor files ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.float16])
def test_tensor_file_round_trip(dtype):
    folder = scratch_dir(min_free_bytes=1 << 20)
    try:
        x = (torch.randn(7, 5) * 100).to(dtype)
        ref = write_tensor(folder, x.t(), "a")           # non-contiguous input is handled
        y = read_tensor(ref, "cpu")
        assert torch.equal(y, x.t())
        assert not list(folder.iterdir()), "the file is removed after reading"
    finally:
        remove_scratch(folder)


def test_tensor_file_with_wrong_size_is_refused(tmp_path):
    x = torch.randn(10)
    ref = write_tensor(tmp_path, x, "b")
    with open(ref.path, "ab") as f:
        f.write(b"1234")
    with pytest.raises(ValueError, match="expected 40"):
        read_tensor(ref, "cpu")


# ---- timing, results, caches ------------------------------------------------------------------------

def test_timing_statistics():
    t = Timing.from_samples([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (t.median_ms, t.min_ms, t.max_ms, t.reps) == (3.0, 1.0, 5.0, 5)
    assert t.q1_ms == 2.0 and t.q3_ms == 4.0
    assert math.isclose(t.spread, 2.0 / 3.0)
    with pytest.raises(ValueError):
        Timing.from_samples([])


def test_eval_result_serialises_its_status():
    r = EvalResult(Status.WRONG, "bad")
    assert r.to_dict()["status"] == "wrong" and not r.ok


def test_roofline_floor():
    c = Ceilings(copy_gbps=4000.0, gemm_tflops={"float32": 50.0, "bfloat16": 800.0})
    # memory bound: 4 GB at 4 TB/s = 1 ms
    assert math.isclose(floor_ms(4_000_000_000, 0, "float32", c), 1.0)
    # compute bound: 100 TFLOP at 50 TFLOP/s = 2 s
    assert math.isclose(floor_ms(1000, 100 * 10**12, "float32", c), 2000.0)
    assert math.isclose(floor_ms(1000, 800 * 10**12, "bfloat16", c), 1000.0)


def test_a_time_within_the_floors_margin_is_not_suspicious():
    # the floor's own measurement error (FLOOR_MARGIN) is not evidence of skipped work
    assert not below_floor(1.0, 1.0)
    assert not below_floor(0.997, 1.0)          # a good kernel 0.3 % under the cached floor
    assert not below_floor(1.0 - FLOOR_MARGIN + 1e-9, 1.0)
    assert below_floor(1.0 - FLOOR_MARGIN - 1e-9, 1.0)
    assert below_floor(0.5, 1.0)                # half the work skipped


def test_the_evaluator_flags_only_times_beyond_the_floors_margin():
    import types

    from core.evaluation.evaluator import Evaluator
    from core.evaluation.roofline import minimum_bytes
    from core.evaluation.supervisor import Outcome
    from core.tasks import load_task

    task = load_task(Path(__file__).resolve().parents[1] / "resources" / "tasks" / "act_gelu.py")
    ceilings = Ceilings(copy_gbps=4000.0, gemm_tflops={"float32": 50.0}, gpu="stand-in")
    sup = types.SimpleNamespace(gpu={"name": "stand-in"}, task_info=types.SimpleNamespace(flops=0),
                                ceilings=lambda: ceilings)
    ev = Evaluator(task, devices=None)
    floor = minimum_bytes(task) / 4000e9 * 1e3

    def flagged(ms: float) -> bool:
        outcome = Outcome(Status.MEASURED, samples_ms=[ms] * 20)
        m = ev._result(sup, types.SimpleNamespace(content_hash="h"), outcome, {}, None).measurement
        assert math.isclose(m.floor_ms, floor) and math.isclose(m.roofline_fraction, floor / ms)
        return m.below_floor

    assert not flagged(1.5 * floor)
    assert not flagged(0.997 * floor)        # at the floor within its measurement error
    assert flagged((1 - FLOOR_MARGIN) * 0.99 * floor)
    assert flagged(0.5 * floor)


def test_warm_ceilings_reads_each_gpu_model_once_and_leaves_a_failure_to_the_first_candidate():
    import types

    from core.evaluation.evaluator import Evaluator
    from core.tasks import load_task

    task = load_task(Path(__file__).resolve().parents[1] / "resources" / "tasks" / "act_gelu.py")
    calls = []

    def supervisor(name: str, fails: bool = False):
        def ceilings():
            calls.append(name)
            if fails:
                raise RuntimeError("could not measure the GPU's ceilings: stand-in")
            return Ceilings(copy_gbps=4000.0, gemm_tflops={"float32": 50.0}, gpu=name)
        return types.SimpleNamespace(gpu={"name": name}, ceilings=ceilings)

    sups = [supervisor("A"), supervisor("A"), supervisor("B", fails=True)]
    ev = Evaluator(task, devices=None)
    ev._gpus = types.SimpleNamespace(supervisors=sups, close=lambda: None)
    ev.warm_ceilings()                          # no exception: B's failure waits for a candidate
    assert calls == ["A", "B"]                  # two GPUs of one model measure once
    assert ev.ceilings(sups[1]).gpu == "A" and calls == ["A", "B"]     # kept, not measured again
    with pytest.raises(RuntimeError, match="ceilings"):
        ev.ceilings(sups[2])                    # tried again by the first measured candidate


def test_ceiling_warm_up_runs_by_time_and_old_caches_are_measured_again(tmp_cache):
    now = [0.0]
    calls = []

    def fn():
        calls.append(now[0])
        now[0] += 0.03                     # each call takes 30 ms of (synchronised) wall time

    syncs = []
    n = warm_up(fn, 0.2, lambda: syncs.append(1), clock=lambda: now[0])
    assert n == 7 and len(calls) == 7 and now[0] >= 0.2     # 7 x 30 ms is the first total past 200 ms
    assert len(syncs) == n - 2                               # synchronised once the first three are queued
    assert warm_up(fn, 0.0, lambda: None, clock=lambda: now[0]) == 3     # at least three calls
    # A cache written by the version that warmed up with three calls is ignored: measured again.
    path = ceilings_path("H200-old")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": 1, "copy_gbps": 3989.0, "gemm_tflops": {}, "gpu": "H200",
                                "measured_at": ""}))
    assert load_ceilings("H200-old") is None
    # Nor one written before the copy ceiling became the fastest of several copy kernels.
    path.write_text(json.dumps({"version": 2, "copy_gbps": 3989.0, "gemm_tflops": {}, "gpu": "H200",
                                "measured_at": "", "samples": 3}))
    assert load_ceilings("H200-old") is None


def test_ceilings_are_measured_at_the_first_starts_and_each_keeps_its_largest_value(tmp_cache, monkeypatch):
    """A measurement taken while another process shares the GPU reads low; the largest of the first
    CEILING_SAMPLES measurements is kept, and later starts measure nothing."""
    from core.evaluation import roofline

    readings = iter([Ceilings(1500.0, {"float32": 25.0, "float16": 300.0}, "H100", copy_kernel="a"),   # shared GPU
                     Ceilings(3000.0, {"float32": 51.0, "float16": 290.0}, "H100", copy_kernel="b"),
                     Ceilings(2900.0, {"float32": 50.0, "float16": 650.0, "float64": 60.0}, "H100", copy_kernel="c")])
    measured = []
    monkeypatch.setattr(roofline, "measure_ceilings", lambda device, name: measured.append(1) or next(readings))
    first = roofline.get_ceilings(None, "H100", "H100-key")
    assert (first.copy_gbps, first.gemm_tflops["float32"], first.samples) == (1500.0, 25.0, 1)
    for _ in range(roofline.CEILING_SAMPLES + 2):
        c = roofline.get_ceilings(None, "H100", "H100-key")
    assert len(measured) == roofline.CEILING_SAMPLES == c.samples == 3
    assert c.copy_gbps == 3000.0 and c.gemm_tflops == {"float32": 51.0, "float16": 650.0, "float64": 60.0}
    assert c.copy_kernel == "b"          # the name of the copy that set the kept bandwidth
    assert load_ceilings("H100-key") == c


def test_ceilings_and_baselines_cache_round_trip(tmp_cache):
    c = Ceilings(copy_gbps=4270.0, gemm_tflops={"float32": 51.2}, gpu="H200")
    save_json_atomic(ceilings_path("H200-9.0-torch"), c.to_json())
    assert load_ceilings("H200-9.0-torch") == c
    ceilings_path("broken").write_text("{not json")
    assert load_ceilings("broken") is None
    b = Baselines(eager=Timing.from_samples([1.0, 2.0, 3.0]), task_hash="abc", gpu="H200")
    assert Baselines.from_json(b.to_json()) == b
    assert baselines_path("abc", "k1") != baselines_path("abd", "k1") != baselines_path("abc", "k2")


@pytest.mark.parametrize("cpus, ahead, workers", [
    (2, 2, 2), (4, 4, 2), (8, 6, 2),          # small machines keep two compile processes
    (12, 6, 6),                                # hosts of 12 or more cores keep six for the rest
    (16, 0, 2), (16, 1, 5), (16, 2, 9), (16, 6, 10), (16, 12, 10),   # up to 4 x ahead + the loop's own
    (32, 4, 17), (32, 20, 26),
])
def test_compile_workers_follow_compile_ahead(monkeypatch, cpus, ahead, workers):
    from core.evaluation import evaluator

    monkeypatch.setattr(evaluator.os, "cpu_count", lambda: cpus)
    assert evaluator.default_compile_workers(ahead) == workers


def test_replay_reason_names_a_time_that_needs_inputs_seen_before():
    from core.evaluation.evaluator import replay_reason

    assert replay_reason(0.010, [], 1.5) == ""                             # nothing unseen was timed
    assert replay_reason(0.010, [0.011, 0.010, 0.012, 0.030], 1.5) == ""   # honest, one slow call
    assert replay_reason(0.010, [0.015] * 5, 1.5) == ""                    # at the limit: not beyond it
    reason = replay_reason(0.004, [0.060, 0.058, 0.061], 1.5)
    assert "4.0 us on the timing inputs" in reason and "60.0 us on 3 inputs it had never seen" in reason
    assert "15.0x" in reason


def test_unseen_sets_are_drawn_as_the_judge_draws_them_and_timed_once_each():
    """Runner._time_unseen on the CPU with a stand-in timer: one call per unseen set, on that set's
    inputs (the judge draws them from the same seed), one output each."""
    import types

    from core.evaluation import protocol as P
    from core.evaluation.runner import Runner
    from core.tasks import load_task

    task = load_task(Path(__file__).resolve().parents[1] / "resources" / "tasks" / "act_gelu.py")
    live = [torch.zeros_like(x) for x in task.make_inputs(0, "cpu")]
    seen: list[torch.Tensor] = []

    class StandInTimer:
        def run(self, call, live_inputs, input_sets, **kw):
            assert kw["reps"] == 1 and kw["warmup"] is False and len(input_sets) == 1
            for dst, src in zip(live_inputs, input_sets[0]):
                dst.copy_(src)
            out = call()
            seen.append(live_inputs[0].clone())
            return types.SimpleNamespace(samples_ms=[float(len(seen))], first_outputs=[[o.clone() for o in out]])

    bound = types.SimpleNamespace(call=lambda: [torch.nn.functional.gelu(live[0])], fixed_outputs=False,
                                  poison=None, raise_violations=lambda: None)
    runner = Runner.__new__(Runner)
    runner.torch, runner.task, runner.device, runner.timer = torch, task, "cpu", StandInTimer()
    sets = tuple(P.InputSet(f"unseen{i}", 1, 100 + i) for i in range(3))
    bundle = P.Bundle(1, (), (), {}, sets)
    outputs: list = []
    samples = runner._time_unseen(bundle, bound, live, 5.0, (1e-4, 1e-4), outputs.append)
    assert samples == [1.0, 2.0, 3.0] and len(outputs) == 3
    for s, x, out in zip(sets, seen, outputs):
        expected = task.make_inputs(s.input_seed, "cpu")[0]
        assert torch.equal(x, expected)
        assert torch.allclose(out[0], torch.nn.functional.gelu(expected))
    assert not torch.equal(seen[0], seen[1])
    assert runner._time_unseen(P.Bundle(2, (), (), {}), bound, live, 5.0, (1e-4, 1e-4), outputs.append) == []
    assert len(outputs) == 3


def _cpu_judge(task_source: str, memory_bytes: int):
    """A Judge on the CPU (its GPU start-up skipped), for the logic of bundles and verdicts."""
    import torch

    from core.evaluation.judge import Judge
    from core.tasks import load_task_from_source

    judge = Judge.__new__(Judge)
    judge.torch, judge.device, judge.gpu = torch, "cpu", {"memory_bytes": memory_bytes}
    judge.task = load_task_from_source(task_source, "tiny_scale")
    judge.tolerance, judge.reference_dtype, judge.fallback_note = (1e-4, 1e-4), "float64", ""
    judge.bundles, judge.next_id = {}, 1
    judge.reference_fraction, judge.computed_again = 0.2, False
    judge.fused, judge.fused_failure = None, ""
    return judge


TINY_TASK = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return x * 2.0

def get_inputs():
    return [torch.randn(64, 32)]

def get_init_inputs():
    return []
'''


def _outputs_for(judge, sets, tmp_path, make=lambda x: x * 2.0):
    from core.evaluation.channel import write_tensor

    return tuple((write_tensor(tmp_path, make(judge.task.make_inputs(s.input_seed, "cpu")[0]), f"{s.label}o0"),)
                 for s in sets)


def test_judge_keeps_references_within_its_memory_budget_and_computes_the_rest_when_judging(tmp_path):
    from core.evaluation import protocol as P
    from core.evaluation.judge import REFERENCE_MEMORY_FRACTION

    one_set = 64 * 32 * 4              # one set's reference: float64 results kept in float32 (float32 output)
    judge = _cpu_judge(TINY_TASK, int(3.5 * one_set / REFERENCE_MEMORY_FRACTION))
    assert judge.reference_bytes() == one_set
    bundle = judge.prepare(P.Prepare(check_sets=3, scaled_variants=2, timing_sets=2, unseen_sets=4))
    refs = judge.bundles[bundle.id]["refs"]
    # 3 fresh, 2 scaled and 4 unseen sets; the timing sets are the first two fresh ones
    assert bundle.timing_sets == bundle.check_sets[:2]
    assert sum(r is not None for r in refs.values()) == 3 and len(refs) == 9
    assert all(r[0].dtype == torch.float32 for r in refs.values() if r is not None)
    assert len(bundle.fingerprints) == 9                    # every set is fingerprinted, kept or not
    sets = bundle.timing_sets + bundle.unseen_sets
    assert refs[bundle.unseen_sets[-1].label] is None
    ok = judge.judge(P.Judge(bundle.id, "timing", _outputs_for(judge, sets, tmp_path)))
    assert ok.ok, ok.reason
    assert not list(tmp_path.iterdir())                     # the judge removes the files it read

    # Wrong only on the last unseen set, whose reference was not kept: still found, and named.
    wrong = _outputs_for(judge, sets[:-1], tmp_path) + _outputs_for(judge, sets[-1:], tmp_path, lambda x: x * 3.0)
    verdict = judge.judge(P.Judge(bundle.id, "timing", wrong))
    assert not verdict.ok and verdict.status == "wrong" and bundle.unseen_sets[-1].label in verdict.reason
    assert not list(tmp_path.iterdir())


def test_the_timing_sets_are_the_first_check_sets_and_share_their_references(tmp_path, monkeypatch):
    from core.evaluation import protocol as P

    judge = _cpu_judge(TINY_TASK, 1 << 30)
    real, computed = judge.reference_for, []
    monkeypatch.setattr(judge, "reference_for", lambda s: computed.append(s.label) or real(s))
    bundle = judge.prepare(P.Prepare(check_sets=3, scaled_variants=2, timing_sets=2, unseen_sets=2))
    fresh = [s for s in bundle.check_sets if s.scale is None]
    assert bundle.timing_sets == tuple(fresh[:2])
    # one model (the timer binds one) for the timing and unseen sets, other inputs for each
    assert len({s.model_seed for s in bundle.timing_sets + bundle.unseen_sets}) == 1
    assert fresh[2].model_seed != fresh[0].model_seed
    assert len({s.input_seed for s in fresh + list(bundle.unseen_sets)}) == 5
    assert sorted(computed) == sorted({s.label for s in bundle.check_sets + bundle.unseen_sets})   # each once
    computed.clear()
    sets = bundle.timing_sets + bundle.unseen_sets
    verdict = judge.judge(P.Judge(bundle.id, "timing", _outputs_for(judge, sets, tmp_path)))
    assert verdict.ok and verdict.details == {} and computed == []      # the check's references
    wrong = _outputs_for(judge, sets[:1], tmp_path) + _outputs_for(judge, sets[1:2], tmp_path, lambda x: x * 3.0)
    verdict = judge.judge(P.Judge(bundle.id, "timing", wrong + _outputs_for(judge, sets[2:], tmp_path)))
    assert verdict.status == "wrong" and bundle.timing_sets[1].label in verdict.reason, verdict.reason
    # More timing sets than check sets: drawn apart, as before.
    more = judge.prepare(P.Prepare(check_sets=1, scaled_variants=0, timing_sets=2))
    assert not set(more.timing_sets) & set(more.check_sets) and len(more.fingerprints) == 3


def test_judge_that_runs_out_of_gpu_memory_drops_its_references_and_judges_again(tmp_path, monkeypatch):
    # The candidate's process shares the GPU: a comparison that runs out of memory frees the kept
    # references and the allocator's cache, and the same outputs are judged again, not "crashed".
    from core.evaluation import compare as compare_module
    from core.evaluation import protocol as P

    judge = _cpu_judge(TINY_TASK, 1 << 30)
    bundle = judge.prepare(P.Prepare(check_sets=3, scaled_variants=0, timing_sets=2))
    refs = judge.bundles[bundle.id]["refs"]
    assert all(r is not None for r in refs.values())
    real, calls = compare_module.compare, []

    def compare_once_out_of_memory(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.50 GiB.")
        return real(*args, **kwargs)

    monkeypatch.setattr(compare_module, "compare", compare_once_out_of_memory)
    verdict = judge.judge(P.Judge(bundle.id, "check", _outputs_for(judge, bundle.check_sets, tmp_path)))
    assert verdict.ok, verdict.reason
    assert verdict.details == {"references_computed_again": True}     # recorded with the measurement
    assert all(r is None for r in refs.values())          # computed again where needed, not kept
    assert judge.reference_fraction == 0.1                 # the next bundles keep half as much
    assert not list(tmp_path.iterdir())                    # the outputs were read again, then removed
    calls.clear()
    wrong = _outputs_for(judge, bundle.check_sets, tmp_path, lambda x: x * 3.0)
    verdict = judge.judge(P.Judge(bundle.id, "check", wrong))
    assert verdict.status == "wrong" and bundle.check_sets[0].label in verdict.reason, verdict.reason


def test_judge_that_runs_out_of_gpu_memory_while_drawing_a_bundle_keeps_fewer_references(tmp_path, monkeypatch):
    from core.evaluation import protocol as P

    judge = _cpu_judge(TINY_TASK, 1 << 30)
    first = judge.prepare(P.Prepare(check_sets=2, scaled_variants=0, timing_sets=2))
    real, calls = judge.reference_for, []

    def reference_once_out_of_memory(s):
        calls.append(s.label)
        if len(calls) == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.50 GiB.")
        return real(s)

    monkeypatch.setattr(judge, "reference_for", reference_once_out_of_memory)
    bundle = judge.prepare(P.Prepare(check_sets=3, scaled_variants=0, timing_sets=2))
    refs = judge.bundles[bundle.id]["refs"]
    assert refs[bundle.check_sets[0].label] is not None                 # kept before memory ran out
    assert all(refs[s.label] is None for s in bundle.check_sets[1:])
    assert len(bundle.fingerprints) == 3 and not bundle.room_for_next   # every set is still drawn
    assert all(r is None for r in judge.bundles[first.id]["refs"].values())
    assert judge.reference_fraction == 0.1
    verdict = judge.judge(P.Judge(bundle.id, "check", _outputs_for(judge, bundle.check_sets, tmp_path)))
    assert verdict.ok, verdict.reason
    assert verdict.details == {"references_computed_again": True}
    kept = judge.prepare(P.Prepare(check_sets=1, scaled_variants=0, timing_sets=0))
    verdict = judge.judge(P.Judge(kept.id, "check", _outputs_for(judge, kept.check_sets, tmp_path)))
    assert verdict.ok and verdict.details == {}         # its one reference was kept: nothing to record


def test_judge_names_constant_output_before_comparing_values(tmp_path):
    from core.evaluation import protocol as P

    judge = _cpu_judge(TINY_TASK, 1 << 30)
    bundle = judge.prepare(P.Prepare(check_sets=3, scaled_variants=1, timing_sets=2))
    constant = torch.ones(64, 32)
    outs = _outputs_for(judge, bundle.check_sets, tmp_path, lambda x: constant)
    verdict = judge.judge(P.Judge(bundle.id, "check", outs))
    assert verdict.status == "rejected" and "constant output" in verdict.reason, verdict.reason
    assert not list(tmp_path.iterdir())
    # A wrong shape is refused before anything is read, and its files are removed too.
    from core.evaluation.channel import write_tensor

    bad = tuple((write_tensor(tmp_path, torch.zeros(3), f"b{i}"),) for i in range(len(bundle.check_sets)))
    verdict = judge.judge(P.Judge(bundle.id, "check", bad))
    assert verdict.status == "rejected" and "expected float32 (64, 32)" in verdict.reason, verdict.reason
    assert not list(tmp_path.iterdir())


OVERFLOW_TASK = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return x * torch.isfinite(1e38 * x).float() + 1.0

def get_inputs():
    return [2.0 * torch.randn(64, 32)]

def get_init_inputs():
    return []
'''


def test_judge_accepts_pytorchs_own_answer_where_the_float64_reference_leaves_it(tmp_path):
    """1e38 * x overflows in float32 (|x| > 3.4, and the scaled sets go to 4x) but not in the float64
    reference: a kernel that computes exactly what float32 PyTorch does is correct; one that is wrong
    elsewhere is still wrong, and one that follows the float64 reference passes as before."""
    from core.evaluation import protocol as P
    from core.evaluation.channel import write_tensor

    judge = _cpu_judge(OVERFLOW_TASK, 1 << 30)
    bundle = judge.prepare(P.Prepare(check_sets=3, scaled_variants=3, timing_sets=2))
    sets = bundle.check_sets

    def outputs(make):
        return tuple((write_tensor(tmp_path, make(judge.materialize(s)[1][0]), f"{s.label}o0"),) for s in sets)

    float32 = lambda x: x * torch.isfinite(1e38 * x).float() + 1.0          # noqa: E731
    assert any(bool((x.abs() > 3.5).any()) for x in (judge.materialize(s)[1][0] for s in sets))
    assert judge.judge(P.Judge(bundle.id, "check", outputs(float32))).ok
    float64 = lambda x: (x.double() + 1.0).float()                           # noqa: E731
    assert judge.judge(P.Judge(bundle.id, "check", outputs(float64))).ok
    wrong = lambda x: float32(x) + (x > 3.0).float()                         # noqa: E731
    verdict = judge.judge(P.Judge(bundle.id, "check", outputs(wrong)))
    assert not verdict.ok and verdict.status == "wrong", verdict.reason
    assert not list(tmp_path.iterdir())


def test_evaluator_withdraws_the_very_compile_it_prepared():
    """Evaluator.withdraw must name the compile prepare() queued: same source, arch and options."""
    import threading
    import types

    from core.evaluation.evaluator import Evaluator
    from core.program import load_solution

    calls: dict[str, dict] = {}

    class RecordingPool:
        def compile(self, source, **kw):
            calls["compile"] = {"source": source, **kw}
            return types.SimpleNamespace(ok=False, status="error", log="", seconds=0.0, cached=False,
                                         error_summary=lambda: "recorded")

        def withdraw(self, source, **kw):
            calls["withdraw"] = {"source": source, **kw}
            return True

    class StandIn(Evaluator):
        gpu = {"arch": "sm_80"}                  # no GPU here: the arch prepare() compiles for

    ev = StandIn.__new__(StandIn)
    ev._pool, ev._lock = RecordingPool(), threading.Lock()
    program = load_solution(Path(__file__).resolve().parents[1] / "resources" / "programs" / "act_gelu.json")
    ev.prepare(program, speculative=True)
    assert ev.withdraw(program)
    compiled = dict(calls["compile"])
    assert compiled.pop("speculative") is True
    assert calls["withdraw"] == compiled and compiled["arch"] == "sm_80"


SWIGLU_BF16 = '''
import torch
import torch.nn as nn
import torch.nn.functional as F

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(512, 256, bias=False, dtype=torch.bfloat16)
        self.up = nn.Linear(512, 256, bias=False, dtype=torch.bfloat16)

    def forward(self, x):
        return F.silu(self.gate(x)) * self.up(x)

def get_inputs():
    return [torch.randn(256, 512, dtype=torch.bfloat16)]

def get_init_inputs():
    return []
'''


def test_the_tolerance_is_widened_where_eager_misses_it_on_scaled_inputs(monkeypatch):
    """A bf16 SwiGLU: eager PyTorch is within 1e-2 of float64 on the inputs as drawn (0.5-0.7 %) but not
    on inputs scaled by 4 (1.0-1.2 %), which the check sets use; the bar becomes twice eager's error."""
    from core.evaluation import judge as J
    from core.evaluation import protocol as P

    with torch.no_grad():                       # as init_evaluator_process leaves a judge
        judge = _cpu_judge(SWIGLU_BF16, 1 << 30)
        ready = judge.set_task(P.SetTask("swiglu", SWIGLU_BF16, None))
        assert 0.01 < ready.tolerance[0] == ready.tolerance[1] <= 0.03, ready
        assert judge.tolerance == ready.tolerance and "tolerance widened from 0.01" in ready.notes[-1]
        monkeypatch.setattr(J, "CALIBRATION_SCALES", ())        # the inputs as drawn only: not widened
        unscaled = _cpu_judge(SWIGLU_BF16, 1 << 30).set_task(P.SetTask("swiglu", SWIGLU_BF16, None))
        assert unscaled.tolerance == (0.01, 0.01) and not unscaled.notes


def test_other_processes_on_the_gpu_are_counted_by_pid_or_beyond_ours():
    from core.evaluation.gpuinfo import other_gpu_processes

    rows = [("GPU-aaaa", 10), ("GPU-aaaa", 11), ("GPU-aaaa", 500), ("GPU-bbbb", 600)]
    # torch's uuid has no "GPU-" prefix; only this GPU's processes count, ours left out.
    assert other_gpu_processes("aaaa", {10, 11}, lambda: rows) == 1
    assert other_gpu_processes("AAAA", {10, 11, 500}, lambda: rows) == 0
    # None of our pids listed (another pid namespace): what is beyond our own count.
    assert other_gpu_processes("aaaa", {1, 2}, lambda: rows) == 1
    assert other_gpu_processes("aaaa", {1, 2, 3}, lambda: rows) == 0
    assert other_gpu_processes("", {10}, lambda: rows) == 3             # unknown uuid: every GPU
    assert other_gpu_processes("aaaa", {10}, lambda: 1 / 0) == 0        # nvidia-smi cannot say

    def missing():
        raise FileNotFoundError("nvidia-smi")
    assert other_gpu_processes("aaaa", {10}, missing) == 0
