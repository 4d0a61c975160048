"""The supervisor's process logic, with fake workers: deadlines kill, deaths are survived, the
spare takes over at once, ModelNew candidates get fresh processes, repeat offenders are quarantined."""
from __future__ import annotations

import time

import pytest

from core.evaluation import protocol as P
from core.evaluation.results import Status
from core.evaluation.supervisor import GpuSupervisor, SupervisorSettings
from tests.support.fake_workers import fake_judge_main, fake_runner_main


def program(behaviour: str, tag: str = "") -> P.ProgramArtifact:
    return P.ProgramArtifact({"behaviour": behaviour}, b"", f"{behaviour}{tag}")


@pytest.fixture
def supervisor():
    s = SupervisorSettings(check_timeout_s=2.0, time_timeout_s=2.0, modelnew_timeout_s=2.0, startup_timeout_s=60)
    sup = GpuSupervisor(0, "task", "source", s, runner_target=fake_runner_main, judge_target=fake_judge_main)
    yield sup
    sup.close()


def test_good_candidate_is_measured(supervisor):
    out = supervisor.evaluate(program("ok"))
    assert out.status is Status.MEASURED
    assert len(out.samples_ms) == 21
    # Where its time went: every phase, the waits for the judge's bundles included.
    assert set(out.seconds) == {"check", "wait", "judge", "time", "bundle"}
    assert all(v >= 0 for v in out.seconds.values())


def test_the_timed_phase_setting_reaches_the_runner():
    s = SupervisorSettings(startup_timeout_s=60, timed_ms=250)
    sup = GpuSupervisor(0, "task", "source", s, runner_target=fake_runner_main, judge_target=fake_judge_main)
    try:
        assert len(sup.evaluate(program("ok")).samples_ms) == 51     # the fake times 5 ms per repetition
    finally:
        sup.close()


def test_work_left_on_another_stream_is_rejected_after_a_second_timing(supervisor):
    out = supervisor.evaluate(program("side_stream"))
    assert out.status is Status.REJECTED and "outside the timed stream" in out.reason
    # one stray reading (a host hiccup) is not a verdict: the second, clean timing is kept
    out = supervisor.evaluate(program("stray_once"))
    assert out.status is Status.MEASURED and out.stray_ms == 0.0


def test_hang_is_killed_at_the_deadline_and_service_resumes(supervisor):
    old_pid = supervisor.runner.proc.pid
    t0 = time.monotonic()
    out = supervisor.evaluate(program("hang"))
    elapsed = time.monotonic() - t0
    assert out.status is Status.TIMEOUT
    assert "still running after 2 s" in out.reason
    assert elapsed < 2.0 + 5.0
    assert supervisor.runner.proc.pid != old_pid
    assert supervisor.recoveries and supervisor.recoveries[-1] < 3.0
    assert supervisor.evaluate(program("ok", "again")).status is Status.MEASURED


@pytest.mark.parametrize("behaviour", ["die", "cuda_error"])
def test_crash_is_survived(supervisor, behaviour):
    old_pid = supervisor.runner.proc.pid
    out = supervisor.evaluate(program(behaviour))
    assert out.status is Status.CRASHED
    assert supervisor.runner.proc.pid != old_pid
    assert supervisor.evaluate(program("ok")).status is Status.MEASURED
    assert supervisor.recoveries[-1] < 3.0


def test_back_to_back_crashes_are_served_by_spares_started_before_them(supervisor):
    first_spares = [w.proc.pid for w in supervisor.spares]
    assert len(first_spares) == 2
    for tag in ("a", "b"):
        assert supervisor.evaluate(program("die", tag)).status is Status.CRASHED
    # Both replacements were processes already started when the run began, and the pool is full again.
    assert supervisor.runner.proc.pid == first_spares[1]
    assert len(supervisor.spares) == 2 and not {w.proc.pid for w in supervisor.spares} & set(first_spares)
    for phases in supervisor.recovery_phases:
        assert set(phases) >= {"spare_age_s", "spare_start_wait_s", "spare_startup_s", "activate_s"}
    assert supervisor.evaluate(program("ok")).status is Status.MEASURED


def test_dead_process_reason_names_the_signal_or_code(supervisor):
    out = supervisor.evaluate(program("die"))
    assert "exited with code 9" in out.reason


def test_candidate_that_crashes_twice_is_quarantined(supervisor):
    assert supervisor.evaluate(program("die")).status is Status.CRASHED
    assert supervisor.evaluate(program("die")).status is Status.CRASHED
    out = supervisor.evaluate(program("die"))
    assert out.status is Status.REJECTED and "quarantined" in out.reason
    assert supervisor.evaluate(program("ok")).status is Status.MEASURED


def test_modelnew_candidates_get_a_fresh_process_each(supervisor):
    warm = supervisor.runner.proc.pid
    pids = set()
    for i in range(2):
        art = P.ModelNewArtifact("class ModelNew: pass", "m", f"hash{i}")
        out = supervisor.evaluate(art)
        assert out.status is Status.MEASURED
        pids.add(out.kernels[0]["pid"])
    assert warm not in pids and len(pids) == 2
    assert supervisor.runner.proc.pid == warm


def test_a_judge_that_dies_is_restarted(supervisor):
    old = supervisor.judge.proc.pid
    out = supervisor.evaluate(program("kill_judge"))
    assert out.status is Status.CRASHED and "evaluator error" in out.reason
    assert supervisor.judge.proc.pid != old and supervisor.judge.alive()
    assert supervisor.evaluate(program("ok")).status is Status.MEASURED


def test_baseline_goes_through_the_warm_runner(supervisor):
    out = supervisor.baseline("eager")
    assert out.status is Status.MEASURED and out.samples_ms[0] == 2.0


def test_close_ends_every_process():
    s = SupervisorSettings(startup_timeout_s=60)
    sup = GpuSupervisor(0, "task", "source", s, runner_target=fake_runner_main, judge_target=fake_judge_main)
    workers = [sup.runner, *sup.spares, sup.judge]
    sup.close()
    assert not any(w.alive() for w in workers)


def test_ctrl_c_in_the_terminal_does_not_reach_the_workers(supervisor):
    """SIGINT goes to the whole process group; the workers ignore it, so the parent alone decides
    what Ctrl-C means and the measurement in flight is not turned into a crash."""
    import os
    import signal

    workers = [supervisor.runner, *supervisor.spares, supervisor.judge]
    for w in workers:
        os.kill(w.proc.pid, signal.SIGINT)
    time.sleep(0.5)
    assert all(w.alive() for w in workers)
    assert supervisor.evaluate(program("ok")).status is Status.MEASURED


def test_unseen_input_times_come_back_from_a_bundle_that_asks_for_them(supervisor):
    plain = supervisor.evaluate(program("ok", "plain"))
    assert plain.status is Status.MEASURED and plain.unseen_samples_ms == []     # the normal bundle has none
    out = supervisor.evaluate(program("replay"), interleave_rounds=3, prepare=P.Prepare(unseen_sets=4))
    assert out.status is Status.MEASURED
    assert out.unseen_samples_ms == [10.0] * 4
    assert len(out.baseline_samples_ms) == 6


def test_after_a_second_timing_the_unseen_times_are_the_first_timings(supervisor):
    # A retimed candidate has met the unseen sets in its first timing: only those times are unseen.
    out = supervisor.evaluate(program("replay_stray_once"), prepare=P.Prepare(unseen_sets=2))
    assert out.status is Status.MEASURED and out.stray_ms == 0.0
    assert out.unseen_samples_ms == [10.0, 10.0]


@pytest.mark.parametrize("during_check", [True, False])
def test_every_bundle_drawn_is_used_whether_drawn_during_the_check_or_after(during_check):
    """The next candidate's bundle is asked for while this one is checked (or, turned off, after it):
    whatever the verdict, it is collected before the judge is asked anything and serves the next
    candidate, so no bundle is drawn twice or lost."""
    s = SupervisorSettings(check_timeout_s=2.0, time_timeout_s=2.0, startup_timeout_s=60,
                           prepare_during_check=during_check)
    sup = GpuSupervisor(0, "task", "source", s, runner_target=fake_runner_main, judge_target=fake_judge_main)
    try:
        verdicts = [sup.evaluate(program(b, str(i))).status
                    for i, b in enumerate(["ok", "die", "ok", "side_stream", "cuda_error", "ok"])]
        assert verdicts == [Status.MEASURED, Status.CRASHED, Status.MEASURED, Status.REJECTED, Status.CRASHED,
                            Status.MEASURED]
        sup.judge_bundle_wait()
        # Bundle 1 was drawn at start-up; each evaluation used one and drew exactly one more.
        assert sup.bundle is not None and sup.bundle.id == len(verdicts) + 1 and sup.judge.pending == 0
    finally:
        sup.close()


def test_a_judge_out_of_gpu_memory_makes_the_runners_lean_and_the_candidate_is_evaluated_again(supervisor):
    out = supervisor.evaluate(program("judge_oom_unless_lean"))
    assert out.status is Status.MEASURED, out.reason
    assert supervisor.lean
    assert out.details["memory"] == {"lean": True, "served_again": True}     # recorded with the measurement
    again = supervisor.evaluate(program("judge_oom_unless_lean", "-2"))
    assert again.status is Status.MEASURED   # lean from the start
    assert again.details["memory"] == {"lean": True}


def test_references_the_judge_computed_again_are_recorded_and_a_plain_evaluation_records_nothing(supervisor):
    out = supervisor.evaluate(program("judge_recomputes"))
    assert out.status is Status.MEASURED, out.reason
    assert out.details["memory"] == {"references_computed_again": True}
    assert "memory" not in supervisor.evaluate(program("ok")).details


def test_a_judge_still_out_of_memory_when_lean_reports_an_evaluator_error_once(supervisor):
    out = supervisor.evaluate(program("judge_oom"))
    assert out.status is Status.CRASHED and out.reason.startswith("evaluator error: judge error: OutOfMemoryError")
    assert supervisor.lean
    assert supervisor.evaluate(program("ok")).status is Status.MEASURED
