"""The task panel: what the reference computes, on which tensors, and how results are judged."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QAbstractItemView, QFormLayout, QHeaderView, QLabel, QStackedWidget,
                               QTreeWidget, QTreeWidgetItem, QVBoxLayout, QWidget)

from core.program import human_bytes
from core.tasks import Task, TensorSpec


def _count(n: int) -> str:
    for unit, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return str(n)


def _shape(spec: TensorSpec) -> str:
    return "[" + ", ".join(str(s) for s in spec.shape) + "]"


class TaskPanel(QWidget):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("taskPanel")
        self.task: Task | None = None
        self.stack = QStackedWidget()
        empty = QLabel("No task open.\nOpen a task file or pick an example.")
        empty.setObjectName("emptyHint")
        empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.stack.addWidget(empty)
        self.stack.addWidget(self._details())
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.stack)

    def _details(self) -> QWidget:
        page = QWidget()
        box = QVBoxLayout(page)
        box.setContentsMargins(12, 10, 12, 10)
        box.setSpacing(6)
        self.name_label = QLabel()
        self.name_label.setObjectName("taskName")
        self.name_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.family_label = QLabel()
        self.family_label.setObjectName("familyPill")
        self.description_label = QLabel()
        self.description_label.setWordWrap(True)
        self.description_label.setObjectName("taskDescription")

        self.tensors = QTreeWidget()
        self.tensors.setColumnCount(4)
        self.tensors.setHeaderLabels(["Tensor", "dtype", "Shape", "Size"])
        self.tensors.setRootIsDecorated(True)
        self.tensors.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.tensors.setAlternatingRowColors(True)
        header = self.tensors.header()
        header.setStretchLastSection(False)
        for column in (0, 1, 2, 3):  # names are never cut; a very long one scrolls instead
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)

        form = QFormLayout()
        form.setLabelAlignment(Qt.AlignmentFlag.AlignLeft)
        form.setHorizontalSpacing(12)
        form.setVerticalSpacing(4)
        self.facts: dict[str, QLabel] = {}
        for key in ("Tolerance", "Minimum bytes", "FLOPs", "Init inputs", "Shapes from", "Hash"):
            value = QLabel()
            value.setWordWrap(True)
            value.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            self.facts[key] = value
            label = QLabel(key)
            label.setObjectName("factLabel")
            form.addRow(label, value)

        box.addWidget(self.name_label)
        box.addWidget(self.family_label, 0, Qt.AlignmentFlag.AlignLeft)
        box.addWidget(self.description_label)
        box.addSpacing(4)
        box.addWidget(self.tensors, 1)
        box.addLayout(form)
        return page

    def show_task(self, task: Task | None) -> None:
        self.task = task
        if task is None:
            self.stack.setCurrentIndex(0)
            return
        self.name_label.setText(task.name)
        self.family_label.setText(task.family or "")
        self.family_label.setVisible(bool(task.family))
        self.description_label.setText(task.description)
        self.description_label.setVisible(bool(task.description))
        self.setToolTip(task.describe())
        self._fill_tensors(task)

        atol, rtol = task.tolerance()
        self.facts["Tolerance"].setText(f"atol {atol:g} · rtol {rtol:g}")
        io_bytes = task.io_bytes()
        if task.min_bytes is not None:
            minimum = f"{human_bytes(task.min_bytes)} declared"
            if task.min_bytes != io_bytes:
                minimum += f" (tensors add up to {human_bytes(io_bytes)})"
        else:
            minimum = f"{human_bytes(io_bytes)} (inputs + weights + outputs)"
        self.facts["Minimum bytes"].setText(minimum)
        self.facts["FLOPs"].setText(_count(task.flops) if task.flops is not None else "not declared")
        init = repr(task.init_inputs) if task.init_inputs else "none"
        self.facts["Init inputs"].setText(init if len(init) <= 120 else init[:117] + "...")
        self.facts["Shapes from"].setText(
            "meta tensors (no data drawn)" if task.specs_from == "meta" else "a CPU run of the model")
        self.facts["Hash"].setText(task.hash[:16])
        self.facts["Hash"].setToolTip(f"sha256 of the source: {task.hash}")
        self.stack.setCurrentIndex(1)

    def _fill_tensors(self, task: Task) -> None:
        self.tensors.clear()
        groups = [
            ("Inputs", [(n, s) for n, s in zip(task.input_names, task.input_specs)]),
            ("Outputs", list(zip(task.output_names(), task.output_specs))),
            ("Weights", list(task.param_specs.items())),
        ]
        for title, rows in groups:
            group = QTreeWidgetItem(self.tensors, [f"{title} ({len(rows)})"])
            group.setFirstColumnSpanned(True)
            font = group.font(0)
            font.setBold(True)
            group.setFont(0, font)
            for name, spec in rows:
                if spec is None:
                    QTreeWidgetItem(group, [name, "scalar", "", ""])
                else:
                    QTreeWidgetItem(group, [name, spec.dtype, _shape(spec), human_bytes(spec.nbytes)])
            group.setExpanded(True)
