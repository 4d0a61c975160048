"""The GUI's run controller on a replayed record (no GPU): start, events in 30 Hz batches,
pause/resume, fork, stop, set-up errors, and the many-emits guard for PySide6 6.12.0."""
from __future__ import annotations

import time

import pytest

pytest.importorskip("pytestqt", reason="GUI tests need pytest-qt")
from app.run_controller import RunController  # noqa: E402
from core.search import events as ev  # noqa: E402
from core.search import session  # noqa: E402
from core.search.session import RunConfig  # noqa: E402
from tests.support.replay_run import TASK_PATH, record_project, search_program  # noqa: E402

WAIT_MS = 60_000


@pytest.fixture
def replay(tmp_path):
    """A recorded project (made-up test data) and the program file it was recorded for."""
    record = record_project(tmp_path / "record.cuagent")
    program = tmp_path / "act_gelu_search.json"
    program.write_text(search_program().to_json())
    return record, program


class _SlowPool:
    """Adds a delay per evaluation so that commands land mid-run."""

    def __init__(self, pool, delay: float):
        self.pool, self.delay = pool, delay

    def evaluate(self, candidate):
        time.sleep(self.delay)
        return self.pool.evaluate(candidate)

    def __getattr__(self, name):
        return getattr(self.pool, name)


@pytest.fixture
def slow(monkeypatch):
    real = session._pool

    def slow_pool(config, task, project, starting):
        pool, notes = real(config, task, project, starting)
        return _SlowPool(pool, 0.05), notes

    monkeypatch.setattr(session, "_pool", slow_pool)


def _collect(controller: RunController) -> list:
    got: list = []
    controller.events.connect(got.extend)
    return got


def _config(tmp_path, replay, **kw) -> RunConfig:
    record, program = replay
    kw.setdefault("program", program)
    return RunConfig(task=TASK_PATH, project=tmp_path / "run.cuagent", replay=[record], **kw)


def test_a_replayed_run_streams_its_events_and_finishes(qtbot, tmp_path, replay):
    c = RunController()
    got = _collect(c)
    states: list[str] = []
    c.state_changed.connect(states.append)
    with qtbot.waitSignal(c.finished, timeout=WAIT_MS) as done:
        c.start(_config(tmp_path, replay, policy="random", budget=12))
    summary = done.args[0]
    assert summary.evaluations == 12 and summary.reason == "evaluations"
    assert isinstance(got[0], ev.RunStarted) and isinstance(got[-1], ev.Finished)
    # Repeats of an earlier schedule are answered from the project and not counted again.
    evaluated = [e for e in got if isinstance(e, ev.CandidateEvaluated) and not e.from_record]
    assert [e.evaluations for e in evaluated] == list(range(1, 13))
    assert states == ["starting", "running", "idle"]
    assert c.state == "idle" and c.pending() == 0


def test_pause_resume_fork_and_stop(qtbot, tmp_path, replay, slow):
    c = RunController()
    got = _collect(c)
    c.start(_config(tmp_path, replay, policy="random", budget=1000))
    qtbot.waitUntil(lambda: sum(isinstance(e, ev.CandidateEvaluated) for e in got) >= 3, timeout=WAIT_MS)

    c.pause()
    assert c.state == "paused"
    qtbot.waitUntil(lambda: any(isinstance(e, ev.Paused) for e in got), timeout=WAIT_MS)
    count = sum(isinstance(e, ev.CandidateEvaluated) for e in got)
    qtbot.wait(300)                                   # six evaluation times: nothing new while paused
    assert sum(isinstance(e, ev.CandidateEvaluated) for e in got) == count

    first = next(e for e in got if isinstance(e, ev.CandidateEvaluated))
    branch = c.fork(first.candidate_id, "from-first")
    c.resume()
    assert c.state == "running"
    qtbot.waitUntil(lambda: any(isinstance(e, ev.Forked) for e in got), timeout=WAIT_MS)
    forked = next(e for e in got if isinstance(e, ev.Forked))
    assert forked.branch_id == branch.id and forked.from_candidate_id == first.candidate_id
    qtbot.waitUntil(lambda: any(isinstance(e, ev.CandidateProposed) and e.branch_id == branch.id for e in got),
                    timeout=WAIT_MS)

    with qtbot.waitSignal(c.finished, timeout=WAIT_MS) as done:
        c.stop()
    assert done.args[0].reason == "stopped"
    assert c.state == "idle"


def test_a_bad_setup_is_reported_not_raised(qtbot, tmp_path, replay):
    c = RunController()
    with qtbot.waitSignal(c.failed, timeout=WAIT_MS) as failed:
        c.start(_config(tmp_path, replay, policy="random", budget=5, program=tmp_path / "missing.json"))
    assert "no program" in failed.args[0] and "missing.json" in failed.args[0]
    assert c.state == "idle"
    with qtbot.waitSignal(c.failed, timeout=WAIT_MS) as failed:
        c.start(_config(tmp_path, replay, policy="nonsense"))
    assert "unknown policy" in failed.args[0]


def test_a_second_start_while_running_is_refused(qtbot, tmp_path, replay, slow):
    c = RunController()
    c.start(_config(tmp_path, replay, policy="random", budget=1000))
    with pytest.raises(RuntimeError, match="already in progress"):
        c.start(_config(tmp_path, replay))
    with qtbot.waitSignal(c.finished, timeout=WAIT_MS):
        c.stop()


def test_ten_thousand_emits_of_a_python_declared_signal(qtbot):
    """PySide6 6.12.0 crashed after many emits of a signal declared in Python (DESIGN section 9)."""
    c = RunController()
    received = []
    c.events.connect(received.append)
    for i in range(10_000):
        c.events.emit([i])
    assert len(received) == 10_000 and received[-1] == [9999]

