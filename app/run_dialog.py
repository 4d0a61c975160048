"""Run settings: what to tune, where to measure (this machine's GPU, or a replay of recorded
projects), which policy, how long, and which project file records it.

Pools and policies are lists here, not code paths: core.search.session.open_run does the work,
so another pool or policy appears in this dialog by adding an entry to POOLS or POLICIES.
The choices are remembered (QSettings, typed reads) for the next run.
"""
from __future__ import annotations

import time
from pathlib import Path

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDialog, QDialogButtonBox, QDoubleSpinBox, QFileDialog,
                               QFormLayout, QHBoxLayout, QLabel, QLineEdit, QPushButton, QSpinBox, QVBoxLayout,
                               QWidget)

from app.export_dialog import PROJECT_FILTER
from core.search.memory import user_memory_path
from core.search.policies import PRETRAINED_PPO
from core.search.session import POLICIES, RunConfig, default_program

POOLS = {"gpu": "This machine's GPU", "replay": "Replay recorded projects (no GPU)"}
POLICY_NAMES = {"ppo": "PPO, pretrained (keeps learning from every evaluation)",
                "ppo-untrained": "PPO, untrained", "random": "Random search", "evolution": "Evolution"}
NO_PRETRAINED = "PPO (no pretrained weights installed: starts untrained)"
KEY = "run/"


def default_project(task_name: str) -> Path:
    return Path.home() / "cuda-agent-runs" / f"{task_name}-{time.strftime('%Y%m%d-%H%M%S')}.cuagent"


class RunDialog(QDialog):
    def __init__(self, task_path: Path, task_name: str, settings: QSettings, gpu_reason: str | None,
                 program_path: Path | None = None, parent: QWidget | None = None):
        """gpu_reason: None when this machine can measure, else why not (the GPU pool is disabled)."""
        super().__init__(parent)
        self.setWindowTitle(f"Run a search on {task_name}")
        self.task_path, self.settings = task_path, settings
        form = QFormLayout()
        form.addRow("Task:", QLabel(str(task_path)))

        # As `cuda-agent run`: the program opened in the window, else the generated program (the
        # hand-written resources/programs/TASK.json only where the generators cannot lower the task).
        self.program_edit = QLineEdit(str(program_path) if program_path else "")
        hand_written = default_program(task_name)
        self.program_edit.setPlaceholderText("empty: generate kernels from the reference"
                                             + (f" (else {hand_written.name})" if hand_written.exists() else ""))
        form.addRow("Program:", self._with_browse(self.program_edit, self._browse_program))

        self.project_edit = QLineEdit(str(default_project(task_name)))
        form.addRow("Project file:", self._with_browse(self.project_edit, self._browse_project))

        self.pool_combo = QComboBox()
        for key, label in POOLS.items():
            self.pool_combo.addItem(label, key)
        if gpu_reason:
            item = self.pool_combo.model().item(0)
            item.setEnabled(False)
            item.setToolTip(gpu_reason)
            self.pool_combo.setCurrentIndex(1)
        self.pool_combo.setToolTip(gpu_reason or "")
        form.addRow("Measure on:", self.pool_combo)
        self.replay_edit = QLineEdit(settings.value(KEY + "replay", "", type=str))
        self.replay_edit.setPlaceholderText("recorded .cuagent files, separated by ';'")
        form.addRow("Recorded projects:", self._with_browse(self.replay_edit, self._browse_replay))
        self.gpu_note = QLabel(f"No GPU run here: {gpu_reason}" if gpu_reason else "")
        self.gpu_note.setWordWrap(True)
        self.gpu_note.setVisible(bool(gpu_reason))
        form.addRow("", self.gpu_note)

        self.policy_combo = QComboBox()
        for key in POLICIES:
            label = POLICY_NAMES.get(key, key)
            if key == "ppo" and not PRETRAINED_PPO.is_file():
                label = NO_PRETRAINED
            self.policy_combo.addItem(label, key)
        self.policy_combo.setCurrentIndex(max(0, self.policy_combo.findData(settings.value(KEY + "policy", "ppo",
                                                                                            type=str))))
        form.addRow("Policy:", self.policy_combo)
        self.budget_spin = QSpinBox()
        self.budget_spin.setRange(1, 1_000_000)
        self.budget_spin.setValue(settings.value(KEY + "budget", 100, type=int))
        self.budget_spin.setSuffix(" evaluations")
        form.addRow("Budget:", self.budget_spin)
        self.seconds_spin = QDoubleSpinBox()
        self.seconds_spin.setRange(0, 7 * 24 * 3600)
        self.seconds_spin.setDecimals(0)
        self.seconds_spin.setSpecialValueText("no limit")
        self.seconds_spin.setSuffix(" s")
        self.seconds_spin.setValue(settings.value(KEY + "seconds", 0.0, type=float))
        form.addRow("Time limit:", self.seconds_spin)
        self.seed_spin = QSpinBox()
        self.seed_spin.setRange(0, 2**31 - 1)
        self.seed_spin.setValue(settings.value(KEY + "seed", 0, type=int))
        form.addRow("Seed:", self.seed_spin)
        self.memory_check = QCheckBox("Recall my earlier runs, and remember this one")
        self.memory_check.setToolTip(f"PPO also starts from the near-best schedules of your earlier GPU runs, and "
                                     f"a GPU run is added when it ends ({user_memory_path()})")
        self.memory_check.setChecked(settings.value(KEY + "memory", False, type=bool))
        form.addRow("Memory:", self.memory_check)
        self.default_start_check = QCheckBox("Start from the default schedule")
        self.default_start_check.setToolTip("Off: PPO's first candidate is the schedule its memory of similar tasks "
                                            "ranks highest (the other policies always start from the default)")
        self.default_start_check.setChecked(settings.value(KEY + "from_default", False, type=bool))
        form.addRow("Start:", self.default_start_check)

        self.problem = QLabel("")
        self.problem.setObjectName("dialogProblem")
        self.problem.setWordWrap(True)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.run_button = buttons.addButton("Run", QDialogButtonBox.ButtonRole.AcceptRole)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        box = QVBoxLayout(self)
        box.addLayout(form)
        box.addWidget(self.problem)
        box.addWidget(buttons)
        for edit in (self.program_edit, self.project_edit, self.replay_edit):
            edit.textChanged.connect(self._validate)
        self.pool_combo.currentIndexChanged.connect(self._validate)
        self._validate()
        self.resize(640, 0)

    def _with_browse(self, edit: QLineEdit, browse) -> QWidget:
        row = QWidget()
        h = QHBoxLayout(row)
        h.setContentsMargins(0, 0, 0, 0)
        h.addWidget(edit, 1)
        button = QPushButton("Browse…")
        button.clicked.connect(browse)
        h.addWidget(button)
        return row

    def _browse_program(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Program to tune", self.program_edit.text(),
                                              "Kernel programs (*.json);;All files (*)")
        if path:
            self.program_edit.setText(path)

    def _browse_project(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Project file", self.project_edit.text(), PROJECT_FILTER)
        if path:
            self.project_edit.setText(path if path.endswith(".cuagent") else path + ".cuagent")

    def _browse_replay(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Recorded projects", str(Path.home()), PROJECT_FILTER)
        if paths:
            self.replay_edit.setText(";".join(paths))

    def replay_files(self) -> list[Path]:
        return [Path(p.strip()).expanduser() for p in self.replay_edit.text().split(";") if p.strip()]

    def problem_text(self) -> str:
        """Why Run is disabled, or "" (checked as the user types)."""
        program = self.program_edit.text().strip()
        if program and not Path(program).expanduser().is_file():
            return f"The program file {program} does not exist."
        if not self.project_edit.text().strip():
            return "Choose a project file to record the run in."
        if self.pool_combo.currentData() == "replay":
            files = self.replay_files()
            if not files:
                return "Choose one or more recorded projects to replay."
            missing = [str(p) for p in files if not p.is_file()]
            if missing:
                return f"Recorded project not found: {', '.join(missing)}"
        return ""

    def _validate(self) -> None:
        problem = self.problem_text()
        self.problem.setText(problem)
        self.run_button.setEnabled(not problem)

    def config(self) -> RunConfig:
        replay = self.replay_files() if self.pool_combo.currentData() == "replay" else []
        seconds = self.seconds_spin.value() or None
        project = Path(self.project_edit.text().strip()).expanduser()
        program = self.program_edit.text().strip()
        return RunConfig(task=self.task_path, project=project,
                         program=Path(program).expanduser() if program else None,
                         policy=self.policy_combo.currentData(), budget=self.budget_spin.value(),
                         seconds=seconds, seed=self.seed_spin.value(), replay=replay,
                         memory=self.memory_check.isChecked(), from_default=self.default_start_check.isChecked())

    def remember(self) -> None:
        s = self.settings
        s.setValue(KEY + "policy", self.policy_combo.currentData())
        s.setValue(KEY + "budget", self.budget_spin.value())
        s.setValue(KEY + "seconds", float(self.seconds_spin.value()))
        s.setValue(KEY + "seed", self.seed_spin.value())
        s.setValue(KEY + "memory", self.memory_check.isChecked())
        s.setValue(KEY + "from_default", self.default_start_check.isChecked())
        s.setValue(KEY + "replay", self.replay_edit.text())
