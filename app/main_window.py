"""The main window: welcome page, task panel, reference and program side by side, log, GPU state.

Slow or risky work (loading a task runs its Python; the GPU probe starts a child process; a
compile waits on an NVRTC worker process) runs in Background threads; results come back to the
GUI thread through workers.ResultBridge. Nothing here touches CUDA.
"""
from __future__ import annotations

import gc
import threading
from functools import partial
from pathlib import Path

from PySide6.QtCore import QSettings, Qt
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import (QComboBox, QDockWidget, QFileDialog, QLabel, QMainWindow, QMenu,
                               QSplitter, QStackedWidget, QStyle, QVBoxLayout, QWidget)

from app import gpu_status
from app.export_dialog import PROJECT_FILTER, ExportDialog
from app.files import EXAMPLES_DIR, PROGRAM_FILTER, PROGRAMS_DIR, TASK_FILTER, demo_project, file_kind
from app.gpu_status import GpuState
from app.log_view import LogView
from app.run_controller import RunController
from app.run_dialog import RunDialog
from app.run_page import RunPage
from app.program_info import LoadedProgram, compile_unavailable_reason, load_program, summary
from app.settings import (GEOMETRY_KEY, SPLITTER_KEY, STATE_KEY, add_recent, open_settings,
                          read_bytes, read_recent)
from app.source_pane import SourcePane
from app.source_view import LineMark
from app.task_panel import TaskPanel
from app.welcome import WelcomePage
from app.widgets import ElidedLabel, ErrorBanner
from app.workers import Background, Outcome
from core.evaluation.probe import probe_gpus
from core.program import KernelProgram, ProgramError
from core.search import events as run_events
from core.search.session import RunConfig
from core.project.export import BuildCheck, build_check
from core.project.ship import ShippedCandidate, exportable_candidates, export_from_project
from core.tasks import SuiteResult, Task, TaskError, load_task, scan_suite
from core.toolchain import CompilePool, CompileResult, compile_ptx

APP_TITLE = "CUDA Agent"
ARCHS = ["sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"]
COMPILE_TIMEOUT_S = 60.0


class MainWindow(QMainWindow):
    def __init__(self, settings: QSettings | None = None, examples_dir: Path | None = EXAMPLES_DIR):
        super().__init__()
        self.setObjectName("mainWindow")
        self.setWindowTitle(APP_TITLE)
        self.settings = settings if settings is not None else open_settings()
        self.examples_dir = examples_dir
        self.background = Background(self)
        self.task: Task | None = None
        self.program: LoadedProgram | None = None
        self.last_compile: CompileResult | None = None
        self.gpu: GpuState = gpu_status.CHECKING
        self._requests = {"task": 0, "program": 0, "compile": 0, "export": 0}
        self.export_dialog: ExportDialog | None = None
        self.run_dialog: RunDialog | None = None
        self.last_export: ShippedCandidate | None = None
        self.last_build_check: BuildCheck | None = None   # of the last export, when one was asked for
        self._pool: CompilePool | None = None
        self._pool_lock = threading.Lock()
        self._closed = False

        self._make_actions()
        self._make_central()
        self._make_docks()
        self._make_menus_and_toolbar()
        self._make_status_bar()
        self._restore_layout()
        self._refresh_recent()
        self._update_compile_action()
        self.log("CUDA Agent started. Compile checks use NVRTC in worker processes; "
                 "this window never creates a CUDA context.")

        # What the imports and the window built lives for the session: out of the collector's
        # reach, so no full collection walks it again while candidates stream in.
        gc.freeze()
        self.background.submit(probe_gpus, on_done=self._probe_done)
        if examples_dir is not None:
            self.background.submit(scan_suite, examples_dir, on_done=self._examples_done)
        else:
            self.welcome.set_examples_error("No example folder configured.")

    # ---- construction ----------------------------------------------------------------------

    def _make_actions(self) -> None:
        icon = self.style().standardIcon
        sp = QStyle.StandardPixmap
        self.act_open_task = QAction(icon(sp.SP_DialogOpenButton), "Open Task…", self)
        self.act_open_task.setShortcut(QKeySequence.StandardKey.Open)
        self.act_open_task.setToolTip("Open a KernelBench-format task file (.py)")
        self.act_open_task.triggered.connect(self._choose_task)
        self.act_open_program = QAction(icon(sp.SP_FileIcon), "Open Program…", self)
        self.act_open_program.setShortcut(QKeySequence("Ctrl+Shift+O"))
        self.act_open_program.setToolTip("Open a kernel program (.json) or a ModelNew solution (.py)")
        self.act_open_program.triggered.connect(self._choose_program)
        self.act_export = QAction(icon(sp.SP_DialogSaveButton), "Export Candidate…", self)
        self.act_export.setShortcut(QKeySequence("Ctrl+E"))
        self.act_export.setToolTip("Export a candidate of a project (.cuagent) as NAME.cu with its PyTorch "
                                   "binding, a ModelNew file and a report")
        self.act_export.triggered.connect(self._choose_export_project)
        self.act_open_project = QAction(icon(sp.SP_DirOpenIcon), "Open Project…", self)
        self.act_open_project.setShortcut(QKeySequence("Ctrl+Alt+O"))
        self.act_open_project.setToolTip("Open a project (.cuagent): its candidates, rewards and lineage")
        self.act_open_project.triggered.connect(self._choose_project)
        self.act_open_demo = QAction(icon(sp.SP_FileDialogInfoView), "Open Demo Project", self)
        self.act_open_demo.setToolTip("A PPO search recorded on an NVIDIA H200 with `cuda-agent run`: "
                                      "real measurements, no GPU needed to look at them")
        self.act_open_demo.setEnabled(demo_project() is not None)
        self.act_open_demo.triggered.connect(self.open_demo)
        self.act_check = QAction(icon(sp.SP_DialogApplyButton), "Check compile", self)
        self.act_check.setShortcut(QKeySequence("Ctrl+B"))
        self.act_check.triggered.connect(self.check_compile)
        self.act_run = QAction(icon(sp.SP_MediaPlay), "Run…", self)
        self.act_run.setShortcut(QKeySequence("Ctrl+R"))
        self.act_run.setEnabled(False)  # needs an open task
        self.act_run.setToolTip(gpu_status.CHECKING.run_tooltip)
        self.act_run.triggered.connect(self.choose_run)
        self.act_pause = QAction(icon(sp.SP_MediaPause), "Pause", self)
        self.act_pause.setToolTip("Pause the search before its next proposal (Resume continues)")
        self.act_pause.triggered.connect(self.toggle_pause)
        self.act_stop = QAction(icon(sp.SP_MediaStop), "Stop", self)
        self.act_stop.setToolTip("Stop the search after the candidate in flight; everything measured is kept")
        self.act_stop.triggered.connect(self.stop_run)
        self.act_fork = QAction(icon(sp.SP_ArrowRight), "Fork", self)
        self.act_fork.setToolTip("Start a new branch of the search from the selected candidate")
        self.act_fork.triggered.connect(self.fork_selected)
        self.act_run_view = QAction(icon(sp.SP_FileDialogDetailedView), "Run View", self)
        self.act_run_view.setToolTip("Show the run: reward plot, candidates, lineage")
        self.act_run_view.triggered.connect(self.show_run_page)
        self.act_close_program = QAction("Close Program", self)
        self.act_close_program.triggered.connect(self.close_program)
        self.act_welcome = QAction(icon(sp.SP_DirHomeIcon), "Welcome Page", self)
        self.act_welcome.triggered.connect(self.show_welcome)
        self.act_quit = QAction("Quit", self)
        self.act_quit.setShortcut(QKeySequence.StandardKey.Quit)
        self.act_quit.triggered.connect(self.close)

    def _make_central(self) -> None:
        self.banner = ErrorBanner()
        self.welcome = WelcomePage(self.act_open_task, self.act_open_program, open_project=self.act_open_project,
                                   open_demo=self.act_open_demo)
        self.welcome.example_chosen.connect(self.show_task)
        self.welcome.recent_chosen.connect(self.open_path)

        self.reference_pane = SourcePane("Reference", "No task open: the PyTorch reference appears here.",
                                         self.act_open_task)
        self.program_pane = SourcePane(
            "Program", "No program open.\nOpen a kernel program (.json) or a ModelNew solution (.py) "
                       "to see its CUDA next to the reference.", self.act_open_program)
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.setObjectName("sourceSplitter")
        self.splitter.addWidget(self.reference_pane)
        self.splitter.addWidget(self.program_pane)
        self.splitter.setChildrenCollapsible(False)
        self.splitter.setSizes([1, 1])

        self.run_page = RunPage()
        self.run_page.candidate_selected.connect(lambda _id: self._update_run_actions())
        self.run_page.ptx_requested.connect(self.show_ptx)
        self.run_controller = RunController(self)
        self.run_controller.events.connect(self.run_page.add_events)
        self.run_controller.events.connect(self._run_events)
        self.run_controller.state_changed.connect(self._run_state)
        self.run_controller.status.connect(self._busy)
        self.run_controller.finished.connect(self._run_finished)
        self.run_controller.failed.connect(self._run_failed)
        self.run_controller.history_loaded.connect(self._history_loaded)

        self.pages = QStackedWidget()
        self.pages.addWidget(self.welcome)
        self.pages.addWidget(self.splitter)
        self.pages.addWidget(self.run_page)

        central = QWidget()
        box = QVBoxLayout(central)
        box.setContentsMargins(0, 0, 0, 0)
        box.setSpacing(0)
        banner_box = QVBoxLayout()
        banner_box.setContentsMargins(10, 8, 10, 0)
        banner_box.addWidget(self.banner)
        box.addLayout(banner_box)
        box.addWidget(self.pages, 1)
        self.setCentralWidget(central)

    def _make_docks(self) -> None:
        self.task_panel = TaskPanel()
        self.task_dock = QDockWidget("Task", self)
        self.task_dock.setObjectName("taskDock")
        self.task_dock.setWidget(self.task_panel)
        self.addDockWidget(Qt.DockWidgetArea.LeftDockWidgetArea, self.task_dock)
        self.log_view = LogView()
        self.log_dock = QDockWidget("Log", self)
        self.log_dock.setObjectName("logDock")
        self.log_dock.setWidget(self.log_view)
        self.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, self.log_dock)
        self.resizeDocks([self.task_dock], [360], Qt.Orientation.Horizontal)
        self.resizeDocks([self.log_dock], [170], Qt.Orientation.Vertical)

    def _make_menus_and_toolbar(self) -> None:
        menu = self.menuBar().addMenu("&File")
        menu.addAction(self.act_open_task)
        menu.addAction(self.act_open_program)
        menu.addAction(self.act_open_project)
        menu.addAction(self.act_open_demo)
        self.recent_menu = QMenu("Open &Recent", self)
        self.recent_menu.aboutToShow.connect(self._fill_recent_menu)
        menu.addMenu(self.recent_menu)
        menu.addSeparator()
        menu.addAction(self.act_export)
        menu.addSeparator()
        menu.addAction(self.act_close_program)
        menu.addAction(self.act_welcome)
        menu.addSeparator()
        menu.addAction(self.act_quit)
        build = self.menuBar().addMenu("&Build")
        build.addAction(self.act_check)
        run = self.menuBar().addMenu("&Run")
        for action in (self.act_run, self.act_pause, self.act_stop, self.act_fork):
            run.addAction(action)
        run.addSeparator()
        run.addAction(self.act_export)
        run.addAction(self.act_run_view)
        view = self.menuBar().addMenu("&View")
        view.addAction(self.task_dock.toggleViewAction())
        view.addAction(self.log_dock.toggleViewAction())

        bar = self.addToolBar("Main")
        bar.setObjectName("mainToolBar")
        bar.setMovable(False)
        bar.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        bar.addAction(self.act_welcome)
        bar.addSeparator()
        bar.addAction(self.act_open_task)
        bar.addAction(self.act_open_program)
        bar.addSeparator()
        bar.addAction(self.act_check)
        target = QLabel("  Target ")
        target.setObjectName("hint")
        bar.addWidget(target)
        self.arch_combo = QComboBox()
        self.arch_combo.addItems(ARCHS)
        self.arch_combo.setCurrentText(gpu_status.DEFAULT_ARCH)
        self.arch_combo.setToolTip("GPU architecture that Check compile builds a cubin for")
        bar.addWidget(self.arch_combo)
        bar.addSeparator()
        for action in (self.act_pause, self.act_stop, self.act_fork, self.act_export, self.act_run_view):
            action.setPriority(QAction.Priority.LowPriority)   # icon only in the toolbar: it stays narrow
        for action in (self.act_run, self.act_pause, self.act_stop, self.act_fork, self.act_export,
                       self.act_run_view):
            bar.addAction(action)
        self._update_run_actions()

    def _make_status_bar(self) -> None:
        bar = self.statusBar()
        bar.setSizeGripEnabled(False)
        self.activity = ElidedLabel("Ready")
        self.activity.setObjectName("activity")
        self.gpu_dot = QLabel("●")
        self.gpu_dot.setObjectName("gpuDot")
        self.gpu_label = ElidedLabel("")
        self.pool_label = ElidedLabel("Pool: idle")
        self.pool_label.setMinimumWidth(110)
        self.pool_label.setObjectName("poolState")
        self.pool_label.setToolTip("Where the search's candidates are measured, and what the search is doing")
        self._pool_kind = ""
        bar.addWidget(self.activity, 2)
        bar.addPermanentWidget(self.pool_label, 1)
        bar.addPermanentWidget(self.gpu_dot)
        bar.addPermanentWidget(self.gpu_label, 3)
        self._show_gpu(gpu_status.CHECKING, "busy")

    # ---- settings --------------------------------------------------------------------------

    def _restore_layout(self) -> None:
        geometry = read_bytes(self.settings, GEOMETRY_KEY)
        if geometry.isEmpty() or not self.restoreGeometry(geometry):
            available = self.screen().availableGeometry()
            self.resize(min(1360, int(available.width() * 0.9)), min(860, int(available.height() * 0.9)))
        state = read_bytes(self.settings, STATE_KEY)
        if not state.isEmpty():
            self.restoreState(state)
        splitter = read_bytes(self.settings, SPLITTER_KEY)
        if not splitter.isEmpty():
            self.splitter.restoreState(splitter)

    def save_layout(self) -> None:
        self.settings.setValue(GEOMETRY_KEY, self.saveGeometry())
        self.settings.setValue(STATE_KEY, self.saveState())
        self.settings.setValue(SPLITTER_KEY, self.splitter.saveState())
        self.settings.sync()

    def _remember(self, path: Path) -> None:
        add_recent(self.settings, path)
        self.settings.sync()
        self._refresh_recent()

    def _refresh_recent(self) -> None:
        self.welcome.set_recent([p for p in read_recent(self.settings) if Path(p).exists()])

    def _fill_recent_menu(self) -> None:
        self.recent_menu.clear()
        paths = [p for p in read_recent(self.settings) if Path(p).exists()]
        for path in paths:
            action = self.recent_menu.addAction(Path(path).name)
            action.setToolTip(path)
            action.triggered.connect(partial(self.open_path, path))
        if not paths:
            self.recent_menu.addAction("No recent files").setEnabled(False)

    # ---- logging and errors ----------------------------------------------------------------

    def log(self, text: str, level: str = "info") -> None:
        self.log_view.add(text, level)

    def show_error(self, message: str) -> None:
        """Inline banner plus the log: never a modal dialog, so nothing waits on the user."""
        self.banner.show_error(message)
        self.log(message, "error")
        self.activity.set_full_text("Error: " + message.splitlines()[0])

    def _busy(self, text: str) -> None:
        self.activity.set_full_text(text)

    def _next(self, kind: str) -> int:
        """A new request number; results of older requests of the same kind are dropped."""
        self._requests[kind] += 1
        return self._requests[kind]

    # ---- search runs -----------------------------------------------------------------------

    def _update_run_actions(self) -> None:
        state = self.run_controller.state
        live = state in ("running", "paused")
        self.act_run.setEnabled(self.task is not None and self.task.path is not None and state == "idle")
        self.act_pause.setEnabled(live)
        self.act_pause.setText("Resume" if state == "paused" else "Pause")
        self.act_stop.setEnabled(state in ("starting", "running", "paused"))
        self.act_fork.setEnabled(live and self.run_page.selected_id() is not None)
        self.act_run_view.setEnabled(self.run_page.project_path is not None)

    def choose_run(self) -> None:
        """Ask for the run's settings (non-blocking dialog), then start it."""
        if self.task is None or self.task.path is None:
            self.show_error("Open a task file first: the search tunes a program for a task.")
            return
        program = None
        if self.program is not None and self.program.path.suffix == ".json":
            program = self.program.path
        dialog = RunDialog(self.task.path, self.task.name, self.settings, self.gpu.gpu_reason, program, self)
        self.run_dialog = dialog

        def accepted() -> None:
            dialog.remember()
            self.start_run(dialog.config())

        dialog.accepted.connect(accepted)
        dialog.open()

    def start_run(self, config: RunConfig) -> None:
        self.banner.dismiss()
        try:
            program_name = KernelProgram.load(config.program).name if config.program else ""
        except Exception:  # reported by the run itself, with the file named
            program_name = ""
        self.run_page.begin(config.project, config.budget, self.task.name if self.task else "", config.policy)
        self.pages.setCurrentWidget(self.run_page)
        where = "replaying " + ", ".join(str(p) for p in config.replay) if config.replay else "on this GPU"
        self._pool_kind = (f"replay of {len(config.replay)} record{'s' if len(config.replay) > 1 else ''}"
                           if config.replay else f"GPU {config.device}")
        self.log(f"Starting a {config.policy} search of {program_name or 'the program'} ({config.budget} evaluations, "
                 f"{where}) into {config.project}")
        self.run_controller.start(config)
        self._update_run_actions()

    def toggle_pause(self) -> None:
        if self.run_controller.state == "paused":
            self.run_controller.resume()
        else:
            self.run_controller.pause()

    def stop_run(self) -> None:
        self.run_controller.stop()
        self._busy("Stopping after the candidate in flight…")

    def fork_selected(self) -> None:
        candidate = self.run_page.selected_id()
        if candidate is None:
            self.show_error("Select a candidate in the table or the lineage to fork from.")
            return
        try:
            branch = self.run_controller.fork(candidate)
        except (RuntimeError, KeyError, ValueError) as exc:
            self.show_error(f"Cannot fork from candidate {candidate}: {exc}")
            return
        self.log(f"Forked branch '{branch.name}' from candidate {candidate}; it starts after the current episode")

    def show_ptx(self, candidate_id: int | None) -> None:
        """Compile a run's candidate to PTX for the toolbar's target (NVRTC in a worker thread)."""
        rec = self.run_page.shown_record        # read from the project when it was selected
        if candidate_id is None or rec is None or rec.id != candidate_id:
            return
        arch = self.arch_combo.currentText()
        if rec.kind != "program" or not rec.program:
            self.run_page.show_ptx(candidate_id, arch, False, "PTX is shown for kernel programs; this candidate "
                                                              "is a ModelNew solution (Python).")
            return
        try:
            program = KernelProgram.from_json(rec.program)
        except ProgramError as exc:
            self.run_page.show_ptx(candidate_id, arch, False, f"The stored program is not valid: {exc}")
            return
        self._busy(f"Compiling candidate {candidate_id} to PTX for {arch}…")
        self.background.submit(compile_ptx, program.source, arch=arch, options=program.compile_options(),
                               on_done=partial(self._ptx_done, candidate_id, arch))

    def _ptx_done(self, candidate_id: int, arch: str, outcome: Outcome) -> None:
        ok, text = outcome.value if outcome.ok else (False, f"{type(outcome.error).__name__}: {outcome.error}")
        self.run_page.show_ptx(candidate_id, arch, ok, text)
        self._busy(f"PTX of candidate {candidate_id} ({arch})" if ok else f"No PTX for candidate {candidate_id}")

    def show_run_page(self) -> None:
        if self.run_page.project_path is not None:
            self.pages.setCurrentWidget(self.run_page)

    def _run_state(self, state: str) -> None:
        self.run_page.set_state(state)
        self._update_run_actions()
        self.pool_label.set_full_text(f"Pool: {self._pool_kind} · {state}" if self._pool_kind and state != "idle"
                                      else "Pool: idle")
        if state in ("running", "paused"):
            self._busy(f"Search {state}")

    def _run_events(self, batch: list) -> None:
        for e in batch:
            if isinstance(e, run_events.NewBest):
                speed = f" ({e.speedup_eager:.2f}x eager)" if e.speedup_eager else ""
                self.log(f"New best: candidate {e.candidate_id}, {e.median_ms * 1e3:.1f} us{speed}", "ok")
            elif isinstance(e, run_events.Forked):
                self.log(f"Branch '{e.branch_name}' starts from candidate {e.from_candidate_id}")
            elif isinstance(e, run_events.PolicyUpdated):
                self.log(f"Policy update {e.updates}: " + ", ".join(f"{k}={v:.3g}" for k, v in e.metrics.items()))
            elif isinstance(e, run_events.RunError):
                self.log(f"Run error: {e.message}", "error")
            elif isinstance(e, run_events.BestConfirmed):
                if e.reason:
                    self.log(f"Best candidate {e.candidate_id} could not be re-measured against eager: {e.reason}",
                             "warning")
                else:
                    self.log(f"Best candidate {e.candidate_id} re-measured in {e.rounds} rounds interleaved with "
                             f"eager: {e.median_ms * 1e3:.1f} us against {e.eager_ms * 1e3:.1f} us, "
                             f"{e.speedup_eager:.2f}x eager", "ok")

    def _run_finished(self, summary) -> None:
        counts = ", ".join(f"{k} {v}" for k, v in summary.counts.items())
        best = (f"; best candidate {summary.best_candidate_id}: {summary.best_ms * 1e3:.1f} us"
                if summary.best_candidate_id and summary.best_ms else "")
        self.log(f"Search finished ({summary.reason}): {summary.evaluations} evaluations ({counts}){best}", "ok")
        self._busy(f"Search finished ({summary.reason}), {summary.evaluations} evaluations{best}")
        self._update_run_actions()

    def _run_failed(self, message: str) -> None:
        self.show_error(message)
        self._update_run_actions()

    # ---- export ----------------------------------------------------------------------------

    def _choose_export_project(self) -> None:
        """Export from the run on screen (its selected candidate first), else from a chosen project."""
        if self.pages.currentWidget() is self.run_page and self.run_page.project_path is not None:
            self.export_from(self.run_page.project_path, self.run_page.selected_id())
            return
        path, _ = QFileDialog.getOpenFileName(self, "Export from Project", str(Path.home()), PROJECT_FILTER)
        if path:
            self.export_from(path)

    def export_from(self, path: str | Path, preselect: int | None = None) -> None:
        """Read the project's measured candidates (in a worker), then ask which one to export."""
        path = Path(path).resolve()
        token = self._next("export")
        self._busy(f"Reading project {path.name}…")
        self.background.submit(exportable_candidates, path,
                               on_done=partial(self._export_choices, token, path, preselect))

    def _export_choices(self, token: int, path: Path, preselect: int | None, outcome: Outcome) -> None:
        if token != self._requests["export"]:
            return
        if outcome.error is not None:
            self.show_error(f"Project '{path}' could not be read: {outcome.error}")
            return
        if not outcome.value:
            self.show_error(f"Project '{path}' has no measured candidate yet: nothing to export.")
            return
        self.export_dialog = dialog = ExportDialog(path, outcome.value, self, preselect=preselect)
        dialog.accepted.connect(lambda: self.export_candidate(path, dialog.candidate_id(), dialog.out_dir(),
                                                              dialog.overwrite(), dialog.check_build()))
        self._busy(f"Choose a candidate of {path.name} to export")
        dialog.open()

    def export_candidate(self, path: str | Path, candidate_id: int | None, out_dir: str | Path,
                         overwrite: bool = False, check: bool = False) -> None:
        """Write the candidate's files (the fastest measured one when candidate_id is None); with
        `check`, then build its .cu with nvcc, in the same worker."""
        token = self._next("export")
        which = "the fastest candidate" if candidate_id is None else f"candidate {candidate_id}"
        self._busy(f"Exporting {which} to {out_dir}{' and building it with nvcc' if check else ''}…")
        self.log(f"Exporting {which} of {path} to {out_dir}")
        self.background.submit(_export_and_check, Path(path), Path(out_dir), candidate_id, overwrite, check,
                               on_done=partial(self._exported, token, Path(out_dir)))

    def _exported(self, token: int, out_dir: Path, outcome: Outcome) -> None:
        if token != self._requests["export"]:
            return
        if outcome.error is not None:
            hint = " (tick 'Replace files' to overwrite them)" if "would overwrite" in str(outcome.error) else ""
            self.show_error(f"Export failed: {outcome.error}{hint}")
            return
        shipped, check = outcome.value
        self.last_export = shipped
        self.last_build_check = check
        self.log(f"Exported candidate {shipped.candidate_id} ({shipped.status}) of {shipped.task_name}:")
        for f in shipped.files:
            self.log(f"  {f}")
        self.activity.set_full_text(f"Exported candidate {shipped.candidate_id} to {out_dir}")
        if check is not None:
            self.log(check.summary())
            if check.built is False:
                self.show_error(f"Exported candidate {shipped.candidate_id}, but its .cu does not build with nvcc "
                                "(the log has nvcc's errors)")

    # ---- opening files ---------------------------------------------------------------------

    def _choose_task(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open Task", str(self._dialog_dir(EXAMPLES_DIR)), TASK_FILTER)
        if path:
            self.open_task_file(path)

    def _choose_program(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open Program", str(self._dialog_dir(PROGRAMS_DIR)),
                                              PROGRAM_FILTER)
        if path:
            self.open_program_file(path)

    def _dialog_dir(self, fallback: Path) -> Path:
        recent = read_recent(self.settings)
        return Path(recent[0]).parent if recent else fallback

    def open_path(self, path: str | Path) -> None:
        """A task (.py), a program (.json, or a .py that defines only ModelNew) or a project (.cuagent)."""
        kind = file_kind(path)
        if kind == "program":
            self.open_program_file(path)
        elif kind == "project":
            self.open_project(path)
        else:
            self.open_task_file(path)

    def _choose_project(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open Project", str(self._dialog_dir(Path.home())),
                                              PROJECT_FILTER)
        if path:
            self.open_project(path)

    def open_demo(self) -> None:
        path = demo_project()
        if path is None:
            self.show_error("This installation has no demo project (resources/demo/ is empty).")
            return
        self.open_project(path)

    def open_project(self, path: str | Path) -> None:
        """Show a recorded project in the run view, streamed in like a live run."""
        path = Path(path).resolve()
        if self.run_controller.running:
            self.show_error("A search is running: stop it before opening another project.")
            return
        if not path.is_file():
            self.show_error(f"Project '{path}' does not exist.")
            return
        self.banner.dismiss()
        self.run_page.begin(path, None, "", "recorded")
        self.pages.setCurrentWidget(self.run_page)
        self._busy(f"Reading project {path.name}…")
        self.log(f"Opening project {path}")
        self._pool_kind = ""          # a recorded project is read, not measured
        self.run_controller.load_history(path)
        self._remember(path)

    def _history_loaded(self, count: int) -> None:
        path = self.run_page.project_path
        self.log(f"Opened project {path}: {count} evaluated candidates", "ok")
        self._busy(f"Project {path.name if path else ''} open: {count} candidates")
        self.run_page.set_state("recorded")
        self._update_run_actions()

    def open_task_file(self, path: str | Path) -> None:
        path = Path(path).resolve()
        token = self._next("task")
        self._busy(f"Loading task {path.name}…")
        self.log(f"Loading task file {path}")
        self.background.submit(load_task, path, on_done=partial(self._task_loaded, token, path))

    def _task_loaded(self, token: int, path: Path, outcome: Outcome) -> None:
        if token != self._requests["task"]:
            return
        if outcome.error is not None:
            error = outcome.error
            self.show_error(str(error) if isinstance(error, TaskError) else
                            f"Task file '{path}' could not be loaded: {type(error).__name__}: {error}")
            return
        self.show_task(outcome.value)

    def show_task(self, task: Task) -> None:
        self._next("task")  # an older load still running must not replace this task
        self.banner.dismiss()
        self.task = task
        self.task_panel.show_task(task)
        self.reference_pane.show_source(task.source, "python", str(task.path) if task.path else task.name)
        self.reference_pane.set_summary(task.description)
        self.pages.setCurrentWidget(self.splitter)
        self.setWindowTitle(f"{task.name} — {APP_TITLE}")
        self._update_run_actions()
        self.log("Opened task " + task.describe(), "ok")
        self._busy(f"Task {task.name} open")
        if task.path is not None:
            self._remember(task.path)

    def open_program_file(self, path: str | Path) -> None:
        path = Path(path).resolve()
        token = self._next("program")
        self._busy(f"Loading program {path.name}…")
        self.log(f"Loading program file {path}")
        self.background.submit(load_program, path, on_done=partial(self._program_loaded, token, path))

    def _program_loaded(self, token: int, path: Path, outcome: Outcome) -> None:
        if token != self._requests["program"]:
            return
        if outcome.error is not None:
            error = outcome.error
            self.show_error(str(error) if isinstance(error, ProgramError) else
                            f"Program file '{path}' could not be loaded: {type(error).__name__}: {error}")
            return
        self.show_program(outcome.value)

    def show_program(self, loaded: LoadedProgram) -> None:
        self._next("compile")  # a compile check of the previous program no longer applies
        self.banner.dismiss()
        self.program = loaded
        self.last_compile = None
        shown = str(loaded.path) if loaded.source_path == loaded.path else \
            f"{loaded.path}  →  {loaded.source_path.name}"
        self.program_pane.show_source(loaded.source, loaded.language, shown)
        self.program_pane.set_summary(summary(loaded))
        self.program_pane.set_badge("")
        self.pages.setCurrentWidget(self.splitter)
        self._update_compile_action()
        kind = "kernel program" if loaded.is_kernel_program else "ModelNew solution"
        self.log(f"Opened {kind} {loaded.name}: {summary(loaded)}", "ok")
        self._busy(f"Program {loaded.name} open")
        self._remember(loaded.path)

    def close_program(self) -> None:
        self._next("program")
        self._next("compile")
        self.program = None
        self.last_compile = None
        self.program_pane.show_empty()
        self._update_compile_action()

    def show_welcome(self) -> None:
        self._refresh_recent()
        self.pages.setCurrentWidget(self.welcome)

    # ---- compile check ---------------------------------------------------------------------

    def _update_compile_action(self, busy: bool = False) -> None:
        reason = compile_unavailable_reason(self.program)
        self.act_check.setEnabled(not reason and not busy)
        self.act_check.setToolTip(reason or "Compile the program's CUDA source with NVRTC for the target "
                                            "architecture (in a worker process; no GPU needed)")

    def _compile_pool(self) -> CompilePool:
        with self._pool_lock:  # closeEvent shuts the pool down under this lock
            if self._closed:
                raise RuntimeError("the window is closing")
            if self._pool is None:
                self._pool = CompilePool(workers=1, timeout=COMPILE_TIMEOUT_S)
            return self._pool

    def check_compile(self) -> None:
        loaded = self.program
        if loaded is None or not loaded.is_kernel_program:
            return
        program = loaded.solution
        arch = self.arch_combo.currentText()
        options = list(program.compile_options())
        token = self._next("compile")
        self.program_pane.view.set_marks({})
        self.program_pane.set_badge("compiling…", "busy")
        self._update_compile_action(busy=True)
        self._busy(f"Compiling {program.name} for {arch}…")
        self.log(f"Compiling {program.name} for {arch} with NVRTC"
                 + (f" ({' '.join(options)})" if options else ""))
        self.background.submit(_compile_in, self._compile_pool(), program.source, arch, options,
                               on_done=partial(self._compiled, token, loaded, arch))

    def _compiled(self, token: int, loaded: LoadedProgram, arch: str, outcome: Outcome) -> None:
        if token != self._requests["compile"] or loaded is not self.program:
            return
        self._update_compile_action()
        if outcome.error is not None:
            self.program_pane.set_badge("not checked", "error")
            self.show_error(f"The compile check of {loaded.name} could not run: "
                            f"{type(outcome.error).__name__}: {outcome.error}")
            return
        result: CompileResult = outcome.value
        self.last_compile = result
        marks = {d.line: LineMark(d.severity, d.message) for d in result.diagnostics
                 if d.line is not None and d.severity == "warning"}
        marks.update({d.line: LineMark(d.severity, d.message) for d in result.errors if d.line is not None})
        self.program_pane.view.set_marks(marks)
        cached = " (cached)" if result.cached else ""
        if result.ok:
            size = len(result.cubin or b"")
            self.program_pane.set_badge(f"compiles · {arch}", "ok",
                                        f"{size:,} bytes of cubin in {result.seconds:.2f} s{cached}")
            self.log(f"Compiled {loaded.name} for {arch} in {result.seconds:.2f} s{cached}: "
                     f"{size:,} bytes of cubin", "ok")
            for warning in result.warnings:
                self.log(warning.format(), "warning")
            self._busy(f"{loaded.name} compiles for {arch}")
            return
        errors = result.errors
        label = f"{len(errors)} error{'s' if len(errors) != 1 else ''}" if errors else result.status
        self.program_pane.set_badge(label, "error", result.error_summary())
        self.log(f"Compile of {loaded.name} for {arch} failed ({result.status}){cached}:", "error")
        for diagnostic in result.diagnostics or []:
            self.log(diagnostic.format(), diagnostic.severity)
        if not result.diagnostics:
            self.log(result.error_summary(), "error")
        self._busy(f"{loaded.name}: compile failed for {arch}")

    # ---- background results ----------------------------------------------------------------

    def _show_gpu(self, state: GpuState, kind: str) -> None:
        self.gpu = state
        self.gpu_label.set_full_text(state.text, state.details)
        self.gpu_dot.setProperty("kind", kind)
        self.gpu_dot.setToolTip(state.details)
        self.gpu_dot.style().unpolish(self.gpu_dot)
        self.gpu_dot.style().polish(self.gpu_dot)
        self.act_run.setToolTip(state.run_tooltip)
        self.act_run.setStatusTip(state.run_tooltip)

    def _probe_done(self, outcome: Outcome) -> None:
        if outcome.error is not None:
            state = gpu_status.probe_failed(outcome.error)
        else:
            state = gpu_status.gpu_state(outcome.value)
        self._show_gpu(state, "ok" if state.has_gpu else "none")
        if state.arch:
            if self.arch_combo.findText(state.arch) < 0:
                self.arch_combo.addItem(state.arch)
            self.arch_combo.setCurrentText(state.arch)
        self.log(state.text, "info" if state.has_gpu else "warning")

    def _examples_done(self, outcome: Outcome) -> None:
        if outcome.error is not None:
            self.welcome.set_examples_error(str(outcome.error))
            self.log(f"Example tasks could not be listed: {outcome.error}", "warning")
            return
        result: SuiteResult = outcome.value
        self.welcome.set_examples(result, self.examples_dir)
        for path, error in result.errors.items():
            self.log(f"Example {path.name} did not load: {error}", "warning")

    # ---- shutdown --------------------------------------------------------------------------

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802
        if self.run_controller.running:
            # Everything measured is already committed; stop after the candidate in flight.
            self.run_controller.stop()
            self.run_controller.wait(60_000)
        self.save_layout()
        self.background.shutdown()
        with self._pool_lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()  # kills the NVRTC worker processes
        super().closeEvent(event)


def _compile_in(pool: CompilePool, source: str, arch: str, options: list[str]) -> CompileResult:
    """Runs in a worker thread: submit() loads NVRTC and reads the cache, the Future waits for the
    compile process. A plain function, so the worker holds no reference to the window."""
    return pool.submit(source, arch=arch, options=options).result()


def _export_and_check(project: Path, out_dir: Path, candidate_id: int | None, overwrite: bool,
                      check: bool) -> tuple[ShippedCandidate, BuildCheck | None]:
    """Runs in a worker thread: the export, then (when asked) nvcc building its .cu."""
    shipped = export_from_project(project, out_dir, candidate_id, overwrite=overwrite)
    if not check:
        return shipped, None
    cu = next(f for f in shipped.files if str(f).endswith(".cu"))
    return shipped, build_check(cu)
