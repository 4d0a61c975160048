"""The main window: welcome page, task panel, reference and program side by side, log, GPU state.

Slow or risky work (loading a task runs its Python; the GPU probe starts a child process; a
compile waits on an NVRTC worker process) runs in Background threads; results come back to the
GUI thread through workers.ResultBridge. Nothing here touches CUDA.
"""
from __future__ import annotations

import threading
from functools import partial
from pathlib import Path

from PySide6.QtCore import QSettings, Qt
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import (QComboBox, QDockWidget, QFileDialog, QLabel, QMainWindow, QMenu,
                               QSplitter, QStackedWidget, QStyle, QVBoxLayout, QWidget)

from app import gpu_status
from app.export_dialog import PROJECT_FILTER, ExportDialog
from app.files import EXAMPLES_DIR, PROGRAM_FILTER, PROGRAMS_DIR, TASK_FILTER, file_kind
from app.gpu_status import GpuState
from app.log_view import LogView
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
from core.program import ProgramError
from core.project.ship import ShippedCandidate, exportable_candidates, export_from_project
from core.tasks import SuiteResult, Task, TaskError, load_task, scan_suite
from core.toolchain import CompilePool, CompileResult

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
        self.last_export: ShippedCandidate | None = None
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
        self.act_check = QAction(icon(sp.SP_DialogApplyButton), "Check compile", self)
        self.act_check.setShortcut(QKeySequence("Ctrl+B"))
        self.act_check.triggered.connect(self.check_compile)
        self.act_run = QAction(icon(sp.SP_MediaPlay), "Run", self)
        self.act_run.setEnabled(False)  # the optimizer arrives in a later version
        self.act_run.setToolTip(gpu_status.CHECKING.run_tooltip)
        self.act_close_program = QAction("Close Program", self)
        self.act_close_program.triggered.connect(self.close_program)
        self.act_welcome = QAction(icon(sp.SP_DirHomeIcon), "Welcome Page", self)
        self.act_welcome.triggered.connect(self.show_welcome)
        self.act_quit = QAction("Quit", self)
        self.act_quit.setShortcut(QKeySequence.StandardKey.Quit)
        self.act_quit.triggered.connect(self.close)

    def _make_central(self) -> None:
        self.banner = ErrorBanner()
        self.welcome = WelcomePage(self.act_open_task, self.act_open_program)
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

        self.pages = QStackedWidget()
        self.pages.addWidget(self.welcome)
        self.pages.addWidget(self.splitter)

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
        build.addAction(self.act_run)
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
        bar.addAction(self.act_run)

    def _make_status_bar(self) -> None:
        bar = self.statusBar()
        bar.setSizeGripEnabled(False)
        self.activity = ElidedLabel("Ready")
        self.activity.setObjectName("activity")
        self.gpu_dot = QLabel("●")
        self.gpu_dot.setObjectName("gpuDot")
        self.gpu_label = ElidedLabel("")
        bar.addWidget(self.activity, 2)
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

    # ---- export ----------------------------------------------------------------------------

    def _choose_export_project(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Export from Project", str(Path.home()), PROJECT_FILTER)
        if path:
            self.export_from(path)

    def export_from(self, path: str | Path) -> None:
        """Read the project's measured candidates (in a worker), then ask which one to export."""
        path = Path(path).resolve()
        token = self._next("export")
        self._busy(f"Reading project {path.name}…")
        self.background.submit(exportable_candidates, path, on_done=partial(self._export_choices, token, path))

    def _export_choices(self, token: int, path: Path, outcome: Outcome) -> None:
        if token != self._requests["export"]:
            return
        if outcome.error is not None:
            self.show_error(f"Project '{path}' could not be read: {outcome.error}")
            return
        if not outcome.value:
            self.show_error(f"Project '{path}' has no measured candidate yet: nothing to export.")
            return
        self.export_dialog = dialog = ExportDialog(path, outcome.value, self)
        dialog.accepted.connect(lambda: self.export_candidate(path, dialog.candidate_id(), dialog.out_dir(),
                                                              dialog.overwrite()))
        self._busy(f"Choose a candidate of {path.name} to export")
        dialog.open()

    def export_candidate(self, path: str | Path, candidate_id: int | None, out_dir: str | Path,
                         overwrite: bool = False) -> None:
        """Write the candidate's files (the fastest measured one when candidate_id is None)."""
        token = self._next("export")
        which = "the fastest candidate" if candidate_id is None else f"candidate {candidate_id}"
        self._busy(f"Exporting {which} to {out_dir}…")
        self.log(f"Exporting {which} of {path} to {out_dir}")
        self.background.submit(export_from_project, Path(path), Path(out_dir), candidate_id, overwrite,
                               on_done=partial(self._exported, token, Path(out_dir)))

    def _exported(self, token: int, out_dir: Path, outcome: Outcome) -> None:
        if token != self._requests["export"]:
            return
        if outcome.error is not None:
            hint = " (tick 'Replace files' to overwrite them)" if "would overwrite" in str(outcome.error) else ""
            self.show_error(f"Export failed: {outcome.error}{hint}")
            return
        shipped: ShippedCandidate = outcome.value
        self.last_export = shipped
        self.log(f"Exported candidate {shipped.candidate_id} ({shipped.status}) of {shipped.task_name}:")
        for f in shipped.files:
            self.log(f"  {f}")
        self.activity.set_full_text(f"Exported candidate {shipped.candidate_id} to {out_dir}")

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
        """A task (.py) or a program (.json, or a .py that defines only ModelNew)."""
        if file_kind(path) == "program":
            self.open_program_file(path)
        else:
            self.open_task_file(path)

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
        with self._pool_lock:  # called from worker threads
            if self._closed:
                raise RuntimeError("the window is closing")
            if self._pool is None:
                self._pool = CompilePool(workers=1, timeout=COMPILE_TIMEOUT_S)
            return self._pool

    def _compile(self, source: str, arch: str, options: list[str]) -> CompileResult:
        # Runs in a worker thread: submit() loads NVRTC and reads the cache, the Future waits for
        # the worker process.
        return self._compile_pool().submit(source, arch=arch, options=options).result()

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
        self.background.submit(self._compile, program.source, arch, options,
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
        self.save_layout()
        self.background.shutdown()
        with self._pool_lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()  # kills the NVRTC worker processes
        super().closeEvent(event)
