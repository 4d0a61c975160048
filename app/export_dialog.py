"""Export a project's candidate: pick the candidate (fastest first) and the output folder.

The dialog only collects choices; the export itself runs in a worker (core.project.ship), so a
large project never freezes the window.
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QAbstractItemView, QCheckBox, QDialog, QDialogButtonBox, QFileDialog,
                               QHBoxLayout, QHeaderView, QLabel, QLineEdit, QPushButton, QTableWidget,
                               QTableWidgetItem, QVBoxLayout, QWidget)

from core.project.ship import CandidateChoice

PROJECT_FILTER = "CUDA Agent projects (*.cuagent);;All files (*)"
COLUMNS = ("id", "branch", "median us", "vs eager", "vs compile", "proposed by")


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


class ExportDialog(QDialog):
    def __init__(self, project: Path, choices: list[CandidateChoice], parent: QWidget | None = None,
                 preselect: int | None = None):
        super().__init__(parent)
        self.setWindowTitle(f"Export a candidate of {project.name}")
        self.choices = choices
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("Measured candidates, fastest first. The export writes NAME.cu (kernels, "
                                "launcher, PyTorch binding), a loader snippet, a ModelNew file and REPORT.md."))
        self.table = QTableWidget(len(choices), len(COLUMNS), self)
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.horizontalHeader().setStretchLastSection(True)
        for row, c in enumerate(choices):
            cells = (str(c.id), c.branch, "-" if c.median_ms is None else f"{c.median_ms * 1e3:.1f}",
                     _times(c.speedup_eager), _times(c.speedup_compile), c.origin)
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if col in (0, 2, 3, 4):
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                self.table.setItem(row, col, item)
        if choices:
            ids = [c.id for c in choices]
            self.table.selectRow(ids.index(preselect) if preselect in ids else 0)
        layout.addWidget(self.table)

        folder = QHBoxLayout()
        folder.addWidget(QLabel("Output folder:"))
        self.out_edit = QLineEdit(str(project.with_suffix("").parent / f"{project.stem}-export"))
        folder.addWidget(self.out_edit, 1)
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        folder.addWidget(browse)
        layout.addLayout(folder)
        self.overwrite_box = QCheckBox("Replace files that already exist in the folder")
        layout.addWidget(self.overwrite_box)
        self.check_box = QCheckBox("Check that the .cu builds with nvcc afterwards (no GPU needed; 10-20 s)")
        layout.addWidget(self.check_box)

        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.export_button = self.buttons.addButton("Export", QDialogButtonBox.ButtonRole.AcceptRole)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout.addWidget(self.buttons)
        self.table.itemSelectionChanged.connect(self._update_button)
        self.out_edit.textChanged.connect(self._update_button)
        self._update_button()
        self.resize(720, 420)

    def _browse(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Export to folder", self.out_edit.text())
        if path:
            self.out_edit.setText(path)

    def _update_button(self) -> None:
        self.export_button.setEnabled(self.candidate_id() is not None and bool(self.out_edit.text().strip()))

    def candidate_id(self) -> int | None:
        rows = self.table.selectionModel().selectedRows()
        return self.choices[rows[0].row()].id if rows else None

    def out_dir(self) -> Path:
        return Path(self.out_edit.text().strip()).expanduser()

    def overwrite(self) -> bool:
        return self.overwrite_box.isChecked()

    def check_build(self) -> bool:
        return self.check_box.isChecked()
