"""GUI tests for the desktop app (pytest-qt, offscreen). Nothing here may wait on a modal dialog."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("pytestqt", reason="GUI tests need pytest-qt")
from PySide6.QtCore import QSettings, Qt, QThread  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from app import gpu_status  # noqa: E402
from app.files import EXAMPLES_DIR, file_kind  # noqa: E402
from app.main import main, parse_args  # noqa: E402
from app.main_window import MainWindow  # noqa: E402
from app.settings import GEOMETRY_KEY, STATE_KEY, open_settings, read_recent  # noqa: E402
from app.workers import ResultBridge  # noqa: E402
from core.evaluation.probe import GpuProbe, probe_gpus  # noqa: E402
from core.program import KernelProgram, ProgramError, load_solution  # noqa: E402
from core.tasks import TaskError, load_task  # noqa: E402
from core.toolchain import nvrtc_info  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "resources" / "tasks"
PROGRAMS = ROOT / "resources" / "programs"
BAD_TASKS = ROOT / "tests" / "data" / "bad_tasks"
LOAD_MS = 60_000
needs_nvrtc = pytest.mark.skipif(not nvrtc_info()[0], reason=f"NVRTC unavailable: {nvrtc_info()[2]}")

GOOD_KERNEL = (
    'extern "C" __global__ void scale(const float* x, float* y, long long n) {\n'
    "    long long i = (long long)blockIdx.x * BLOCK + threadIdx.x;\n"
    "    if (i < n) y[i] = 2.0f * x[i];\n"
    "}\n"
)
BROKEN_KERNEL = GOOD_KERNEL.replace("2.0f * x[i]", "2.0f * x[i] + not_declared")


def program_json(source: str, name: str = "scale", kernel: str = "scale") -> str:
    return json.dumps({
        "format": "cuda-agent/program@1", "name": name, "source": source,
        "tunables": {"BLOCK": [256, 128]},
        "buffers": [{"name": "y", "shape": ["x.shape[0]"], "dtype": "dtype(x)"}],
        "launches": [{"kernel": kernel, "grid": ["cdiv(x.numel, BLOCK)"], "block": ["BLOCK"],
                      "args": ["x", "y", "int64(x.numel)"]}],
        "outputs": ["y"],
    }, indent=2)


@pytest.fixture(autouse=True)
def isolated_settings(tmp_path, monkeypatch):
    """Settings and the compile cache live in tmp_path: tests never see or change the user's."""
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, str(tmp_path / "settings"))
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.SystemScope, str(tmp_path / "system"))
    monkeypatch.setenv("CUDA_AGENT_CACHE", str(tmp_path / "cache"))
    yield tmp_path / "settings"


@pytest.fixture
def make_window(qtbot):
    def make(examples_dir: Path | None = None) -> MainWindow:
        window = MainWindow(examples_dir=examples_dir)
        qtbot.addWidget(window)  # closed (layout saved, workers stopped) at teardown
        window.show()
        return window
    return make


def wait_for_task(qtbot, window: MainWindow) -> None:
    qtbot.waitUntil(lambda: window.task is not None or window.banner.isVisible(), timeout=LOAD_MS)


def wait_for_program(qtbot, window: MainWindow) -> None:
    qtbot.waitUntil(lambda: window.program is not None or window.banner.isVisible(), timeout=LOAD_MS)


def log_text(window: MainWindow) -> str:
    return window.log_view.toPlainText()


# ---- window and welcome page -------------------------------------------------------------------

def test_window_opens_with_no_file(make_window):
    window = make_window()
    assert window.pages.currentWidget() is window.welcome
    assert window.windowTitle() == "CUDA Agent"
    assert window.task is None and window.program is None
    assert not window.act_run.isEnabled()
    assert not window.act_check.isEnabled()
    assert "kernel program" in window.act_check.toolTip()
    assert not window.banner.isVisible()
    assert window.task_panel.stack.currentIndex() == 0


def test_examples_are_listed_and_open(qtbot, make_window):
    window = make_window(EXAMPLES_DIR)
    qtbot.waitUntil(lambda: bool(window.welcome.example_names()), timeout=LOAD_MS)
    names = window.welcome.example_names()
    assert names == sorted(p.stem for p in TASKS.glob("*.py"))
    item = window.welcome.find_example("act_gelu")
    assert item.text(1) == "activation"
    assert item.text(2) == "GELU, exact erf form, of a large fp32 matrix."

    window.welcome.examples.setCurrentItem(item)
    window.welcome.examples.itemActivated.emit(item, 0)
    assert window.task is not None and window.task.name == "act_gelu"
    assert window.pages.currentWidget() is window.splitter
    assert window.reference_pane.view.toPlainText() == (TASKS / "act_gelu.py").read_text()
    assert window.task_panel.name_label.text() == "act_gelu"
    assert "act_gelu" in window.windowTitle()


def test_example_filter_hides_other_families(qtbot, make_window):
    window = make_window(EXAMPLES_DIR)
    qtbot.waitUntil(lambda: bool(window.welcome.example_names()), timeout=LOAD_MS)
    window.welcome.filter.setText("softmax")
    tree = window.welcome.examples
    shown = [tree.topLevelItem(i).text(0) for i in range(tree.topLevelItemCount())
             if not tree.topLevelItem(i).isHidden()]
    assert shown and all("softmax" in " ".join(tree.findItems(n, Qt.MatchFlag.MatchExactly)[0].text(c)
                                                 for c in range(3)).lower() for n in shown)
    assert "act_gelu" not in shown


def test_open_task_file_shows_name_source_and_details(qtbot, make_window):
    path = TASKS / "softmax_lastdim.py"
    window = make_window()
    window.open_path(path)
    wait_for_task(qtbot, window)
    assert not window.banner.isVisible(), window.banner.text()
    task = load_task(path)
    assert window.task.name == "softmax_lastdim"
    assert window.reference_pane.view.toPlainText() == path.read_text()
    assert window.reference_pane.view.language == "python"
    atol, rtol = task.tolerance()
    assert window.task_panel.facts["Tolerance"].text() == f"atol {atol:g} · rtol {rtol:g}"
    tensors = window.task_panel.tensors
    inputs = tensors.topLevelItem(0)
    assert inputs.text(0) == f"Inputs ({len(task.input_names)})"
    assert inputs.child(0).text(0) == task.input_names[0]
    assert inputs.child(0).text(1) == task.input_specs[0].dtype
    assert "Opened task softmax_lastdim" in log_text(window)


def test_a_slower_earlier_load_never_replaces_a_later_one(qtbot, make_window):
    window = make_window()
    window.open_task_file(TASKS / "conv_2d.py")
    window.open_task_file(TASKS / "act_gelu.py")
    wait_for_task(qtbot, window)
    qtbot.wait(1500)  # give the first load time to finish: its result must be dropped
    assert window.task.name == "act_gelu"


def test_recent_files_are_recorded_and_listed(qtbot, make_window):
    window = make_window()
    window.open_task_file(TASKS / "act_gelu.py")
    wait_for_task(qtbot, window)
    window.open_program_file(PROGRAMS / "act_gelu.json")
    wait_for_program(qtbot, window)
    expected = [str((PROGRAMS / "act_gelu.json").resolve()), str((TASKS / "act_gelu.py").resolve())]
    assert read_recent(open_settings()) == expected
    assert window.welcome.recent_paths() == expected
    assert make_window().welcome.recent_paths() == expected  # a new window reads them back


def test_recent_files_survive_a_bad_settings_value(make_window, isolated_settings):
    settings = open_settings()
    settings.setValue("recentFiles", 42)  # typed reads must not crash on junk
    settings.sync()
    assert make_window().welcome.recent_paths() == []


def test_window_layout_is_saved_and_restored(qtbot, make_window):
    window = make_window()
    window.resize(720, 520)  # inside the offscreen screen (800 x 600): restoreGeometry clamps
    window.close()
    settings = open_settings()
    assert settings.contains(GEOMETRY_KEY) and settings.contains(STATE_KEY)
    again = make_window()
    assert (again.width(), again.height()) == (720, 520)


# ---- errors never block ------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["syntax_error.py", "missing_names.py", "forward_fails.py"])
def test_malformed_task_shows_error_without_blocking(qtbot, make_window, name):
    path = BAD_TASKS / name
    with pytest.raises(TaskError) as expected:
        load_task(path.resolve())
    window = make_window()
    window.open_path(path)
    qtbot.waitUntil(window.banner.isVisible, timeout=LOAD_MS)
    assert window.banner.text() == str(expected.value)
    assert str(expected.value) in log_text(window)
    assert QApplication.activeModalWidget() is None
    assert window.task is None
    assert read_recent(open_settings()) == []  # only files that opened are remembered
    window.banner.dismiss()
    assert not window.banner.isVisible()


def test_missing_file_is_reported(qtbot, make_window, tmp_path):
    window = make_window()
    window.open_path(tmp_path / "nowhere.py")
    qtbot.waitUntil(window.banner.isVisible, timeout=LOAD_MS)
    assert "does not exist" in window.banner.text()


def test_bad_program_shows_program_error(qtbot, make_window, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(program_json(GOOD_KERNEL, kernel="no_such_kernel"))
    with pytest.raises(ProgramError) as expected:
        load_solution(bad.resolve())
    window = make_window()
    window.open_path(bad)
    qtbot.waitUntil(window.banner.isVisible, timeout=LOAD_MS)
    assert window.banner.text() == str(expected.value)
    assert window.program is None
    assert QApplication.activeModalWidget() is None


# ---- programs and compile checks ---------------------------------------------------------------

def test_open_kernel_program_shows_cuda_source(qtbot, make_window):
    window = make_window()
    window.open_path(PROGRAMS / "act_gelu.json")
    wait_for_program(qtbot, window)
    program = KernelProgram.load(PROGRAMS / "act_gelu.json")
    pane = window.program_pane
    assert pane.view.toPlainText() == program.source
    assert pane.view.language == "cuda"
    assert "gelu_f32" in pane.summary.full_text() and "BLOCK=256" in pane.summary.full_text()
    assert pane.file_label.full_text().endswith("act_gelu.cu")
    assert window.act_check.isEnabled()
    # Highlighting really ran: line 2 (extern "C" __global__ ...) carries pygments formats.
    assert pane.view.document().findBlockByNumber(1).layout().formats()


def test_open_modelnew_solution_shows_python(qtbot, make_window):
    path = PROGRAMS / "act_gelu_modelnew.py"
    assert file_kind(path) == "program"
    window = make_window()
    window.open_path(path)
    wait_for_program(qtbot, window)
    assert window.program_pane.view.toPlainText() == path.read_text()
    assert window.program_pane.view.language == "python"
    assert not window.act_check.isEnabled()
    assert "ModelNew" in window.act_check.toolTip()


@needs_nvrtc
def test_compile_check_good_and_broken(qtbot, make_window, tmp_path):
    good, broken = tmp_path / "good.json", tmp_path / "broken.json"
    good.write_text(program_json(GOOD_KERNEL))
    broken.write_text(program_json(BROKEN_KERNEL))
    window = make_window()

    window.open_program_file(good)
    wait_for_program(qtbot, window)
    window.check_compile()
    assert not window.act_check.isEnabled()  # busy until the result arrives
    qtbot.waitUntil(lambda: window.last_compile is not None, timeout=120_000)
    assert window.last_compile.ok, window.last_compile.log
    assert window.program_pane.badge.text() == "compiles · sm_90"
    assert window.program_pane.view.marks == {}
    assert "Compiled scale for sm_90" in log_text(window)
    assert window.act_check.isEnabled()

    window.open_program_file(broken)
    qtbot.waitUntil(lambda: window.program is not None and window.program.path == broken.resolve(),
                    timeout=LOAD_MS)
    window.check_compile()
    qtbot.waitUntil(lambda: window.last_compile is not None, timeout=120_000)
    result = window.last_compile
    assert not result.ok and result.status == "error"
    marks = window.program_pane.view.marks
    assert set(marks) == {3} and marks[3].severity == "error" and "not_declared" in marks[3].message
    assert "line 3: " in log_text(window) and "not_declared" in log_text(window)
    assert window.program_pane.badge.text() == "1 error"
    assert not window.banner.isVisible()


# ---- GPU state, CUDA contexts, threads ---------------------------------------------------------

def test_gpu_status_eventually_shows_the_probe(qtbot, make_window):
    window = make_window()
    qtbot.waitUntil(lambda: window.gpu is not gpu_status.CHECKING, timeout=150_000)
    probe = probe_gpus()
    text = window.gpu_label.full_text()
    assert not window.act_run.isEnabled()                 # no task open yet
    if probe.gpus:
        assert text.startswith("GPU 0: ")
    else:
        assert text == f"No GPU: {probe.reason} — {gpu_status.STILL_WORKS}"
        assert probe.reason in window.act_run.toolTip() and gpu_status.REPLAY_ONLY in window.act_run.toolTip()
        assert window.gpu.gpu_reason and probe.reason in window.gpu.gpu_reason


def test_gpu_state_text():
    none = gpu_status.gpu_state(GpuProbe(error="torch.cuda.is_available() is False"))
    assert none.text.startswith("No GPU: no CUDA GPU found (torch.cuda.is_available() is False)")
    assert not none.has_gpu and none.arch is None
    h200 = {"index": 0, "name": "NVIDIA H200", "capability": "9.0", "memory_bytes": 150 * 2**30, "sms": 132}
    state = gpu_status.gpu_state(GpuProbe(gpus=[h200, {**h200, "index": 1}], cupy="14.2"))
    assert state.text == "GPU 0: NVIDIA H200 (sm_90, 150 GiB, 132 SMs) (+1 more)"
    assert state.arch == "sm_90" and state.has_gpu
    assert state.run_tooltip == "Run a search on the open task, measured on NVIDIA H200." and state.gpu_reason is None
    no_cupy = gpu_status.gpu_state(GpuProbe(gpus=[h200], cupy_error="ImportError: no cupy"))
    assert "kernels cannot run" in no_cupy.text and "CuPy is missing" in no_cupy.run_tooltip
    assert "CuPy is missing" in no_cupy.gpu_reason and gpu_status.REPLAY_ONLY in no_cupy.run_tooltip


def test_gui_process_creates_no_cuda_context(qtbot, make_window):
    import torch

    window = make_window(EXAMPLES_DIR)
    window.open_task_file(TASKS / "act_gelu.py")
    wait_for_task(qtbot, window)
    qtbot.waitUntil(lambda: window.gpu is not gpu_status.CHECKING, timeout=150_000)
    qtbot.waitUntil(lambda: bool(window.welcome.example_names()), timeout=LOAD_MS)
    if nvrtc_info()[0]:  # a compile check loads NVRTC here (through CuPy) but needs no context
        window.open_program_file(PROGRAMS / "act_gelu.json")
        wait_for_program(qtbot, window)
        window.check_compile()
        qtbot.waitUntil(lambda: window.last_compile is not None, timeout=120_000)
        assert window.last_compile.ok, window.last_compile.log
    assert not torch.cuda.is_initialized()


def test_ten_thousand_emits_from_a_worker_thread_arrive_in_the_gui_thread(qtbot):
    """Guards the PySide6 6.12.0 fault (each emit of a Python-declared Signal drops a ref to True)."""
    bridge = ResultBridge()
    received: list[int] = []
    threads: set[bool] = set()
    gui_thread = QApplication.instance().thread()

    def on_value(value: int) -> None:
        received.append(value)
        threads.add(QThread.currentThread() is gui_thread)

    tokens = [bridge.register(on_value) for _ in range(10_000)]
    worker = threading.Thread(target=lambda: [bridge.post(t, i) for i, t in enumerate(tokens)])
    worker.start()
    worker.join()
    qtbot.waitUntil(lambda: len(received) == 10_000, timeout=60_000)
    assert received == list(range(10_000))
    assert threads == {True}


def test_a_worker_never_drops_the_last_reference_to_a_qt_object(qtbot):
    """A QObject whose only reference was a background job's callback is destroyed in the GUI
    thread, not in the worker (where ~QObject deadlocked against the GUI thread's connect())."""
    import time
    import weakref

    from PySide6.QtCore import QObject

    from app.workers import Background

    dropped_in: list[str] = []

    class Holder(QObject):
        def done(self, outcome) -> None:
            pass

        def __del__(self) -> None:
            dropped_in.append(threading.current_thread().name)

    parent = QObject()
    background = Background(parent, workers=1)
    holder = Holder()
    alive = weakref.ref(holder)
    started = threading.Event()

    def job() -> int:
        started.set()
        time.sleep(0.2)
        return 1

    background.submit(job, on_done=holder.done)
    started.wait(5)
    del holder                     # the window went away while its job ran
    qtbot.waitUntil(lambda: alive() is None, timeout=10_000)
    assert dropped_in == [threading.main_thread().name]
    background.shutdown()


# ---- command line ------------------------------------------------------------------------------

def test_cli_parsing(capsys):
    assert main(["--help"]) == 0
    assert "usage: cuda-agent-gui" in capsys.readouterr().out
    assert main(["--no-such-option"]) == 2
    args = parse_args(["task.py", "--quit-after", "1.5"])
    assert args.file == "task.py" and args.quit_after == 1.5
    assert parse_args([]).file is None


def test_file_kind(tmp_path):
    assert file_kind(TASKS / "act_gelu.py") == "task"
    assert file_kind(PROGRAMS / "act_gelu.json") == "program"
    assert file_kind(PROGRAMS / "act_gelu_modelnew.py") == "program"
    assert file_kind(BAD_TASKS / "syntax_error.py") == "task"
    assert file_kind(tmp_path / "missing.py") == "task"


def test_main_py_help_runs_without_a_display():
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    done = subprocess.run([sys.executable, "main.py", "--help"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "FILE" in done.stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="X11/Wayland display check is Linux-only")
def test_main_py_without_a_display_explains_instead_of_aborting():
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    done = subprocess.run([sys.executable, "main.py"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert "No display found" in done.stderr and "QT_QPA_PLATFORM=offscreen" in done.stderr


def test_main_py_launches_opens_a_task_and_quits(tmp_path):
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "XDG_CONFIG_HOME": str(tmp_path / "config"),
           "CUDA_AGENT_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "main.py", str(TASKS / "act_gelu.py"), "--quit-after", "10"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    ini = tmp_path / "config" / "CUDA Agent" / "cuda-agent.ini"
    assert ini.exists(), done.stderr
    assert "act_gelu.py" in ini.read_text()  # the task opened (only opened files are remembered)
