#!/usr/bin/env python3
"""Render the main window offscreen with an example task (and program) open and save a PNG.

    python scripts/screenshot.py docs/images/main-window.png
    python scripts/screenshot.py out.png --task resources/tasks/softmax_lastdim.py --program resources/programs/softmax_lastdim.json
    python scripts/screenshot.py docs/images/run-view.png --demo
    python scripts/screenshot.py out.png --run-replay

--demo opens the demo project shipped in resources/demo/ (a PPO search recorded on an H200) in the
run view and selects its fastest candidate.
--run-replay runs a PPO search that replays the made-up test record of tests/support/replay_run.py
(no GPU; its times come from a formula, not a measurement) and captures the run view.

Settings go to a temporary folder, so the screenshot never depends on (or changes) yours.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def wait_until(app, condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"screenshot: timed out after {timeout:.0f} s waiting for {what}")
        app.processEvents()
        time.sleep(0.02)


def run_replay(app, window, folder: Path) -> None:
    from core.search.session import RunConfig
    from tests.support.replay_run import TASK_PATH, record_project, search_program

    record = record_project(folder / "made-up-record.cuagent")
    program = folder / "act_gelu_search.json"
    program.write_text(search_program().to_json())
    finished = []
    window.run_controller.finished.connect(finished.append)
    window.run_controller.failed.connect(finished.append)
    window.start_run(RunConfig(task=TASK_PATH, project=folder / "act_gelu-replay.cuagent", program=program,
                               policy="ppo", budget=22, replay=[record]))
    wait_until(app, lambda: finished, 300, "the replayed search")
    window.run_page.plot.flush()
    if window.run_page.best is not None:
        window.run_page.select_candidate(window.run_page.best.candidate_id)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path, help="PNG file to write")
    parser.add_argument("--task", type=Path, default=ROOT / "resources/tasks/act_gelu.py")
    parser.add_argument("--program", type=Path, default=ROOT / "resources/programs/act_gelu.json",
                        help="program to open beside the task ('' for none)")
    parser.add_argument("--no-compile", action="store_true", help="do not run Check compile first")
    parser.add_argument("--size", default="1440x900", help="window size, WIDTHxHEIGHT")
    parser.add_argument("--welcome", action="store_true", help="capture the welcome page instead")
    parser.add_argument("--demo", action="store_true", help="capture the run view of the bundled demo project")
    parser.add_argument("--run-replay", action="store_true",
                        help="capture the run view after a replayed search over made-up test data")
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.lower().split("x"))

    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    settings_dir = tempfile.mkdtemp(prefix="cuda-agent-screenshot-")
    os.environ.setdefault("CUDA_AGENT_CACHE", str(Path(settings_dir) / "cache"))
    from PySide6.QtCore import QSettings

    from app.main import create_application
    from app.main_window import MainWindow

    app = create_application()
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, settings_dir)
    window = MainWindow()
    window.resize(width, height)
    window.show()
    wait_until(app, lambda: window.gpu.text != "Checking for GPUs…", 120, "the GPU probe")
    if args.welcome:
        wait_until(app, lambda: window.welcome.example_names(), 120, "the example tasks")
    elif args.demo:
        loaded = []
        window.run_controller.history_loaded.connect(loaded.append)
        window.open_demo()
        wait_until(app, lambda: loaded or window.banner.isVisible(), 120, "the demo project")
        window.run_page.plot.flush()
        if window.run_page.best is not None:
            window.run_page.select_candidate(window.run_page.best.candidate_id)
    else:
        window.open_task_file(args.task)
        wait_until(app, lambda: window.task is not None or window.banner.isVisible(), 120, "the task")
        if str(args.program):
            window.open_program_file(args.program)
            wait_until(app, lambda: window.program is not None or window.banner.isVisible(), 60, "the program")
            if not args.no_compile and window.act_check.isEnabled():
                window.check_compile()
                wait_until(app, lambda: window.last_compile is not None or window.banner.isVisible(), 120,
                           "the compile check")
        window.reference_pane.view.go_to_line(1)
        window.program_pane.view.go_to_line(1)
        if args.run_replay:
            run_replay(app, window, Path(settings_dir))
    if app.focusWidget() is not None:
        app.focusWidget().clearFocus()  # no text caret in the picture
    for _ in range(20):
        app.processEvents()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    if not window.grab().save(str(args.output)):
        raise SystemExit(f"screenshot: could not write {args.output}")
    print(f"saved {args.output} ({width}x{height})")
    window.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
