"""The welcome page: open a task, pick a bundled example, or reopen a recent file."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (QAbstractItemView, QHBoxLayout, QHeaderView, QLabel, QLineEdit,
                               QListWidget, QListWidgetItem, QToolButton, QTreeWidget,
                               QTreeWidgetItem, QVBoxLayout, QWidget)

from core.tasks import SuiteResult, Task

_TASK_ROLE = Qt.ItemDataRole.UserRole


class WelcomePage(QWidget):
    example_chosen = Signal(object)  # Task
    recent_chosen = Signal(str)      # path

    def __init__(self, open_task: QAction, open_program: QAction, parent: QWidget | None = None,
                 open_project: QAction | None = None, open_demo: QAction | None = None):
        super().__init__(parent)
        self.setObjectName("welcome")
        title = QLabel("CUDA Agent")
        title.setObjectName("welcomeTitle")
        subtitle = QLabel("Turn a PyTorch reference operation into a fast, verified CUDA kernel.")
        subtitle.setObjectName("welcomeSubtitle")

        buttons = QHBoxLayout()
        buttons.setSpacing(8)
        for action in (open_task, open_program, open_project):
            if action is None:
                continue
            button = QToolButton()
            button.setObjectName("bigButton")
            button.setDefaultAction(action)
            button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
            buttons.addWidget(button)
        buttons.addStretch(1)

        # Examples ---------------------------------------------------------------------------
        self.examples_title = QLabel("Example tasks")
        self.examples_title.setObjectName("sectionTitle")
        self.filter = QLineEdit()
        self.filter.setPlaceholderText("Filter by name, family or description")
        self.filter.setClearButtonEnabled(True)
        self.filter.textChanged.connect(self._apply_filter)
        self.examples = QTreeWidget()
        self.examples.setHeaderLabels(["Name", "Family", "Description"])
        self.examples.setRootIsDecorated(False)
        self.examples.setUniformRowHeights(True)
        self.examples.setAlternatingRowColors(True)
        self.examples.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        header = self.examples.header()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(True)
        self.examples.itemActivated.connect(self._example_activated)
        self.examples_status = QLabel("Loading the example tasks…")
        self.examples_status.setObjectName("hint")
        self.examples_status.setWordWrap(True)

        left = QVBoxLayout()
        left.setSpacing(6)
        left.addWidget(self.examples_title)
        left.addWidget(self.filter)
        left.addWidget(self.examples, 1)
        left.addWidget(self.examples_status)

        # Recent files -----------------------------------------------------------------------
        recent_title = QLabel("Recent files")
        recent_title.setObjectName("sectionTitle")
        self.recent = QListWidget()
        self.recent.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self.recent.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.recent.itemActivated.connect(self._recent_activated)
        self.recent_empty = QLabel("Files you open appear here.")
        self.recent_empty.setObjectName("hint")
        right = QVBoxLayout()
        right.setSpacing(6)
        if open_demo is not None:
            # In the narrow column, so the window's minimum width does not grow with it.
            demo = QToolButton()
            demo.setDefaultAction(open_demo)
            demo.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
            right.addWidget(demo)
            right.addSpacing(8)
        right.addWidget(recent_title)
        right.addWidget(self.recent, 1)
        right.addWidget(self.recent_empty)

        columns = QHBoxLayout()
        columns.setSpacing(24)
        columns.addLayout(left, 5)
        columns.addLayout(right, 2)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(32, 24, 32, 20)
        layout.setSpacing(10)
        layout.addWidget(title)
        layout.addWidget(subtitle)
        layout.addSpacing(6)
        layout.addLayout(buttons)
        layout.addSpacing(10)
        layout.addLayout(columns, 1)

    # ---- examples --------------------------------------------------------------------------

    def set_examples(self, result: SuiteResult, folder: Path) -> None:
        self.examples.clear()
        for task in result.tasks:
            item = QTreeWidgetItem([task.name, task.family or "", task.description])
            item.setToolTip(0, task.describe())
            item.setToolTip(2, task.description)
            item.setData(0, _TASK_ROLE, task)
            self.examples.addTopLevelItem(item)
        self.examples_title.setText(f"Example tasks ({len(result.tasks)})")
        if result.errors:
            self.examples_status.setText(
                f"{len(result.errors)} example file(s) in {folder} did not load: {result.error_summary()}")
        else:
            self.examples_status.setText(f"Double-click an example to open it. Folder: {folder}")
        self._apply_filter(self.filter.text())

    def set_examples_error(self, message: str) -> None:
        self.examples.clear()
        self.examples_title.setText("Example tasks")
        self.examples_status.setText(message)

    def example_names(self) -> list[str]:
        return [self.examples.topLevelItem(i).text(0) for i in range(self.examples.topLevelItemCount())]

    def find_example(self, name: str) -> QTreeWidgetItem | None:
        items = self.examples.findItems(name, Qt.MatchFlag.MatchExactly, 0)
        return items[0] if items else None

    def _apply_filter(self, text: str) -> None:
        needle = text.strip().lower()
        for i in range(self.examples.topLevelItemCount()):
            item = self.examples.topLevelItem(i)
            haystack = " ".join(item.text(c) for c in range(3)).lower()
            item.setHidden(bool(needle) and needle not in haystack)

    def _example_activated(self, item: QTreeWidgetItem, _column: int) -> None:
        task: Task | None = item.data(0, _TASK_ROLE)
        if task is not None:
            self.example_chosen.emit(task)

    # ---- recent files ----------------------------------------------------------------------

    def set_recent(self, paths: list[str]) -> None:
        self.recent.clear()
        for path in paths:
            p = Path(path)
            item = QListWidgetItem(f"{p.name}\n{p.parent}")
            item.setToolTip(path)
            item.setData(Qt.ItemDataRole.UserRole, path)
            self.recent.addItem(item)
        self.recent_empty.setVisible(not paths)

    def recent_paths(self) -> list[str]:
        return [self.recent.item(i).data(Qt.ItemDataRole.UserRole) for i in range(self.recent.count())]

    def _recent_activated(self, item: QListWidgetItem) -> None:
        self.recent_chosen.emit(item.data(Qt.ItemDataRole.UserRole))
