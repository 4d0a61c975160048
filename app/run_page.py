"""The live view of a search run: reward plot, candidate table, lineage, and the selected
candidate's details and source (marked where it differs from its parent).

It only consumes batches of core.search.events (from RunController's 30 Hz drain) and reads the
project file read-only for a selected candidate's details, so it works the same for a live run,
a replay, and a finished run.
"""
from __future__ import annotations

import dataclasses
import difflib
import gc
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QSplitter, QTabWidget, QVBoxLayout,
                               QWidget)

from app.candidates_view import CandidateRow, CandidateTable, LineageTree
from app.reward_plot import RewardPlot
from app.source_view import LineMark, SourceView, monospace_font
from core.search import events as ev

MAIN_BRANCH = "main"
FREEZE_EVERY = 500          # rows between gc.freeze() calls (freezing is cheap: a list splice)


class RunPage(QWidget):
    candidate_selected = Signal(int)
    ptx_requested = Signal(int)         # the window compiles the candidate to PTX (in a worker)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.project_path: Path | None = None
        self.budget: int | None = None
        self.eager_ms: float | None = None
        self.evaluations = 0
        self.best: ev.NewBest | None = None
        self.state = "idle"
        self.task_name = ""
        self.policy = ""
        self._proposed: dict[int, ev.CandidateProposed] = {}
        self._rows: dict[int, CandidateRow] = {}
        self._rows_since_freeze = 0
        self.shown_record: Any = None       # the CandidateRecord the details show (read from the project)

        self.header = QLabel("No run yet.")
        self.header.setObjectName("runHeader")
        self.header.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.plot = RewardPlot()
        self.table = CandidateTable()
        self.lineage = LineageTree()
        self.details = QPlainTextEdit()
        self.details.setReadOnly(True)
        self.details.setFont(monospace_font())
        self.details.setPlaceholderText("Select a candidate to see its measurement and schedule.")
        self.source = SourceView()
        self.reference = SourceView()        # the task's PyTorch reference, from the project file

        self.ptx_view = SourceView()
        self.ptx_button = QPushButton("Show PTX")
        self.ptx_button.setToolTip("Compile the selected candidate with NVRTC for the toolbar's target "
                                   "architecture and show its PTX")
        self.ptx_button.setEnabled(False)
        self.ptx_button.clicked.connect(lambda: self.ptx_requested.emit(self.selected_id()))
        self.ptx_note = QLabel("Select a candidate, then Show PTX.")
        ptx_tab = QWidget()
        ptx_box = QVBoxLayout(ptx_tab)
        ptx_box.setContentsMargins(0, 4, 0, 0)
        ptx_row = QHBoxLayout()
        ptx_row.addWidget(self.ptx_button)
        ptx_row.addWidget(self.ptx_note, 1)
        ptx_box.addLayout(ptx_row)
        ptx_box.addWidget(self.ptx_view, 1)

        self.tabs = QTabWidget()
        self.tabs.addTab(self.details, "Candidate")
        self.tabs.addTab(self.source, "Source vs parent")
        self.tabs.addTab(self.reference, "Reference")
        self.tabs.addTab(ptx_tab, "PTX")
        self.tabs.addTab(self.lineage, "Lineage")

        # Explicit minimums, below the widgets' own hints: the run view must not make the window
        # wider than the other pages need (a small screen still fits it with both docks open).
        self.table.setMinimumWidth(240)
        self.tabs.setMinimumWidth(160)
        left = QSplitter(Qt.Orientation.Vertical)
        left.addWidget(self.plot)
        left.addWidget(self.table)
        left.setSizes([1, 1])
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.setObjectName("runSplitter")
        self.splitter.addWidget(left)
        self.splitter.addWidget(self.tabs)
        self.splitter.setSizes([3, 2])

        box = QVBoxLayout(self)
        box.setContentsMargins(10, 6, 10, 6)
        box.addWidget(self.header)
        box.addWidget(self.splitter, 1)

        self.table.candidate_selected.connect(self._select)
        self.lineage.candidate_selected.connect(self._select)

    # ---- run lifecycle ---------------------------------------------------------------------------

    def begin(self, project_path: str | Path, budget: int | None, task_name: str = "", policy: str = "") -> None:
        """Forget the previous run's views; the next events belong to the run writing project_path."""
        self.project_path = Path(project_path)
        self.budget, self.task_name, self.policy = budget, task_name, policy
        self.eager_ms, self.best, self.evaluations, self.state = None, None, 0, "starting"
        self._proposed.clear()
        self._rows.clear()
        # Frozen objects still die by reference counting when the views drop the previous run's
        # rows; only cycles among them would stay, so collect what is not frozen and freeze the
        # rest. (Unfreezing would hand the libraries' millions of objects back to the collector:
        # a 0.2-0.4 s pause here on the 2-core machine, and again at every full collection.)
        gc.collect()
        gc.freeze()
        self._rows_since_freeze = 0
        self.plot.clear()
        self.table.clear()
        self.lineage.clear()
        self.details.clear()
        self.source.clear_source()
        self.reference.clear_source()
        self.ptx_view.clear_source()
        self.ptx_button.setEnabled(False)
        self.shown_record = None
        self.plot.set_branch_name(1, MAIN_BRANCH)
        self.table.set_branch_name(1, MAIN_BRANCH)
        self._update_header()

    def set_state(self, state: str) -> None:
        self.state = state
        self._update_header()

    def add_events(self, batch: list[Any]) -> None:
        """One drained batch: rows, points and names go to the views in one call each."""
        rows: list[CandidateRow] = []
        points: list[tuple[int, int, float, float | None]] = []
        for e in batch:
            if isinstance(e, ev.CandidateProposed):
                self._proposed[e.candidate_id] = e
            elif isinstance(e, ev.CandidateEvaluated):
                row = self._row(e)
                known = self._rows.get(row.id)
                if known is not None:             # seen again (a repeat answered from the record)
                    row = dataclasses.replace(row, parent_id=known.parent_id, action=known.action)
                    self._rows[row.id] = row
                    self.table.update_row(row)
                else:
                    self._rows[row.id] = row
                    rows.append(row)
                self.evaluations = max(self.evaluations, e.evaluations)
                points.append((e.branch_id, e.evaluations, e.reward, e.median_ms))
            elif isinstance(e, ev.RunStarted):
                self.task_name, self.policy = e.task, e.policy
                self.budget = e.budget_evaluations
                if e.eager_ms:
                    self.eager_ms = e.eager_ms
                    self.plot.set_eager_ms(e.eager_ms)
            elif isinstance(e, ev.NewBest):
                self.best = e
                if self.eager_ms is None and e.speedup_eager:
                    self.eager_ms = e.speedup_eager * e.median_ms
                    self.plot.set_eager_ms(self.eager_ms)
            elif isinstance(e, ev.Forked):
                self.plot.set_branch_name(e.branch_id, e.branch_name)
                self.table.set_branch_name(e.branch_id, e.branch_name)
        if rows:
            self.table.add_rows(rows)
            self.lineage.add_rows(rows)
            self._settle_garbage_collector(len(rows))
        if points:
            self.plot.add_points(points)
        self._update_header()

    def _settle_garbage_collector(self, added: int) -> None:
        """Move the rows and tree items held so far out of the collector's reach (gc.freeze).

        Tens of thousands of rows stay alive for the whole run; every full collection would walk
        all of them again, a pause of 100-300 ms on a small machine (measured: event-loop lag
        p99 263 ms with 20,000 rows, 66 ms with collection off). They die by reference counting
        when the next run clears the views (a reference cycle among them would stay until exit)."""
        self._rows_since_freeze += added
        if self._rows_since_freeze >= FREEZE_EVERY:
            gc.freeze()
            self._rows_since_freeze = 0

    def _row(self, e: ev.CandidateEvaluated) -> CandidateRow:
        proposed = self._proposed.pop(e.candidate_id, None)
        speedup = self.eager_ms / e.median_ms if self.eager_ms and e.median_ms else None
        reward = e.reward if e.reward == e.reward else None     # NaN: a recorded verdict without one
        return CandidateRow(id=e.candidate_id, branch_id=e.branch_id,
                            parent_id=proposed.parent_id if proposed else None, status=e.status,
                            median_ms=e.median_ms, reward=reward, speedup_eager=speedup,
                            action=proposed.action if proposed else "", reason=e.reason)

    def _update_header(self) -> None:
        if self.project_path is None:
            self.header.setText("No run yet.")
            return
        budget = f" of {self.budget}" if self.budget else ""
        parts = [f"<b>{self.task_name or '?'}</b>", f"policy {self.policy or '?'}", self.state,
                 f"{self.evaluations}{budget} evaluations"]
        if self.best is not None:
            speed = f", {self.best.speedup_eager:.2f}x eager" if self.best.speedup_eager else ""
            parts.append(f"best #{self.best.candidate_id}: {self.best.median_ms * 1e3:.1f} us{speed}")
        parts.append(self.project_path.name)
        self.header.setText("  ·  ".join(parts))

    # ---- the selected candidate --------------------------------------------------------------

    def selected_id(self) -> int | None:
        return self.table.selected_id()

    def select_candidate(self, candidate_id: int) -> None:
        self.table.select_candidate(candidate_id)

    def _select(self, candidate_id: int) -> None:
        if self.table.selected_id() != candidate_id:
            self.table.select_candidate(candidate_id)
        self.show_candidate(candidate_id)
        self.ptx_button.setEnabled(True)
        self.ptx_view.clear_source()
        self.ptx_note.setText(f"Candidate {candidate_id}: Show PTX compiles it on demand.")
        self.candidate_selected.emit(candidate_id)

    def show_ptx(self, candidate_id: int, arch: str, ok: bool, text: str) -> None:
        """The window's answer to ptx_requested: PTX, or NVRTC's log when it failed."""
        if candidate_id != self.selected_id():
            return              # the selection moved on while it compiled
        self.ptx_view.set_source(text, "text")
        self.ptx_note.setText(f"Candidate {candidate_id}, {arch}: " + ("PTX from NVRTC" if ok else "no PTX (log below)"))

    def show_candidate(self, candidate_id: int) -> None:
        """Details and source of one candidate, read from the project file (read-only)."""
        from core.project import Project, ProjectError

        if self.project_path is None:
            return
        try:
            with Project.open(self.project_path, readonly=True) as project:
                rec = project.candidate(candidate_id)
                parent = project.candidate(rec.parent_id) if rec is not None and rec.parent_id else None
                if not self.reference.toPlainText():
                    self.reference.set_source(project.task_source, "python")
        except ProjectError as exc:
            self.details.setPlainText(f"The project could not be read: {exc}")
            return
        self.shown_record = rec
        if rec is None:
            self.details.setPlainText(f"Candidate {candidate_id} is not in {self.project_path.name} yet.")
            return
        self.details.setPlainText(describe(rec, parent))
        text, parent_text = candidate_source(rec), candidate_source(parent) if parent else None
        self.source.set_source(text, "cuda" if rec.kind == "program" else "python")
        if parent_text is not None:
            self.source.set_marks(changed_lines(parent_text, text, parent.id))


def candidate_source(rec: Any) -> str:
    """The code a candidate runs: for a program, its schedule as the #defines NVRTC receives, then
    its CUDA source; for a ModelNew solution, the Python file."""
    if rec.kind != "program":
        return rec.solution_source or ""
    program = rec.program or {}
    schedule = rec.schedule or program.get("schedule") or {}
    defines = [f"#define {k} {v}   // schedule" for k, v in sorted(schedule.items())]
    return "\n".join(defines + [""] + [program.get("source", "")])


def changed_lines(old: str, new: str, parent_id: int) -> dict[int, LineMark]:
    """1-based lines of `new` that differ from `old`, marked with what the parent had."""
    marks: dict[int, LineMark] = {}
    old_lines, new_lines = old.splitlines(), new.splitlines()
    matcher = difflib.SequenceMatcher(a=old_lines, b=new_lines, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        before = "\n".join(old_lines[i1:i2]) or "(nothing)"
        for j in range(j1, j2):
            marks[j + 1] = LineMark("warning", f"changed from parent #{parent_id}:\n{before}")
    return marks


def describe(rec: Any, parent: Any | None) -> str:
    """A plain-text summary of a candidate: verdict, times, schedule (vs parent), kernels, notes."""
    lines = [f"candidate #{rec.id}  branch {rec.branch_id}  parent {rec.parent_id or '-'}",
             f"proposed by: {rec.origin or '-'}", f"status: {rec.status}" + (f" ({rec.reason})" if rec.reason else "")]
    m = rec.measurement or {}
    t = m.get("timing") or {}
    if t:
        lines.append(f"median {t.get('median_ms', 0) * 1e3:.2f} us  (q1 {t.get('q1_ms', 0) * 1e3:.2f}, "
                     f"q3 {t.get('q3_ms', 0) * 1e3:.2f}, {t.get('reps', '?')} repetitions)")
    for key, label in (("speedup_eager", "vs eager"), ("speedup_compile", "vs torch.compile")):
        if m.get(key):
            lines.append(f"{label}: {m[key]:.2f}x")
    if m.get("roofline_fraction"):
        lines.append(f"roofline: {m['roofline_fraction'] * 100:.0f} % of the floor"
                     + (f" ({m['floor_ms'] * 1e3:.1f} us)" if m.get("floor_ms") else ""))
    if m.get("gbps"):
        lines.append(f"bandwidth: {m['gbps']:.0f} GB/s")
    if rec.reward is not None:
        lines.append(f"reward: {rec.reward:.3f}")
    if rec.schedule:
        lines.append("")
        lines.append("schedule:")
        before = (parent.schedule if parent is not None else {}) or {}
        for k, v in rec.schedule.items():
            change = f"   (parent: {before[k]})" if k in before and before[k] != v else ""
            lines.append(f"  {k} = {v}{change}")
    for k in m.get("kernels") or []:
        lines.append("")
        lines.append(f"kernel {k.get('name')}: {k.get('registers')} registers, "
                     f"{(k.get('static_shared_bytes') or 0) + (k.get('dynamic_shared_bytes') or 0)} B shared, "
                     f"{k.get('spill_stores') or 0} spill stores, {k.get('block_threads')} threads/block"
                     + (f", occupancy {k['occupancy'] * 100:.0f} %" if k.get("occupancy") else ""))
    notes = m.get("notes") or []
    if notes:
        lines.append("")
        lines += [f"- {n}" for n in notes]
    return "\n".join(lines)
