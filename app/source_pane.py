"""A titled code pane: header (title, file, status badge, buttons), a summary line, the code,
and an empty state with a hint and a button when there is nothing to show."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (QFrame, QHBoxLayout, QLabel, QStackedWidget, QToolButton,
                               QVBoxLayout, QWidget)

from app.source_view import SourceView
from app.widgets import ElidedLabel

BADGE_KINDS = ("ok", "error", "busy", "info")


class SourcePane(QWidget):
    def __init__(self, title: str, empty_hint: str, empty_action: QAction | None = None,
                 parent: QWidget | None = None):
        super().__init__(parent)
        header = QFrame()
        header.setObjectName("paneHeader")
        row = QHBoxLayout(header)
        row.setContentsMargins(12, 6, 8, 6)
        row.setSpacing(8)
        self.title = QLabel(title)
        self.title.setObjectName("paneTitle")
        self.file_label = ElidedLabel("", mode=Qt.TextElideMode.ElideMiddle)
        self.file_label.setObjectName("paneFile")
        self.badge = QLabel()
        self.badge.setObjectName("badge")
        self.badge.hide()
        row.addWidget(self.title)
        row.addWidget(self.file_label, 1)
        row.addWidget(self.badge)
        self._header_row = row

        self.summary = ElidedLabel("")
        self.summary.setObjectName("paneSummary")
        self.summary.setContentsMargins(12, 4, 12, 4)
        self.summary.hide()

        self.view = SourceView()
        self.stack = QStackedWidget()
        self.stack.addWidget(self._empty_state(empty_hint, empty_action))
        self.stack.addWidget(self.view)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(header)
        layout.addWidget(self.summary)
        layout.addWidget(self.stack, 1)

    def _empty_state(self, hint: str, action: QAction | None) -> QWidget:
        page = QWidget()
        page.setObjectName("emptyState")
        box = QVBoxLayout(page)
        box.addStretch(1)
        label = QLabel(hint)
        label.setObjectName("emptyHint")
        label.setWordWrap(True)
        label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        box.addWidget(label)
        if action is not None:
            button = QToolButton()
            button.setDefaultAction(action)
            button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
            box.addWidget(button, 0, Qt.AlignmentFlag.AlignHCenter)
        box.addStretch(2)
        return page

    def add_header_button(self, action: QAction) -> QToolButton:
        button = QToolButton()
        button.setDefaultAction(action)
        button.setAutoRaise(True)
        button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self._header_row.addWidget(button)
        return button

    def show_source(self, text: str, language: str, file_text: str = "") -> None:
        self.view.set_source(text, language)
        self.file_label.set_full_text(file_text)
        self.stack.setCurrentWidget(self.view)

    def show_empty(self) -> None:
        self.view.clear_source()
        self.file_label.set_full_text("")
        self.set_summary("")
        self.set_badge("")
        self.stack.setCurrentIndex(0)

    def has_source(self) -> bool:
        return self.stack.currentWidget() is self.view

    def set_summary(self, text: str) -> None:
        self.summary.set_full_text(text)
        self.summary.setVisible(bool(text))

    def set_badge(self, text: str, kind: str = "info", tooltip: str = "") -> None:
        """A small status pill in the header ("compiles", "2 errors"...); '' hides it."""
        self.badge.setText(text)
        self.badge.setProperty("kind", kind if kind in BADGE_KINDS else "info")
        self.badge.setToolTip(tooltip)
        self.badge.style().unpolish(self.badge)  # re-read the stylesheet for the new property
        self.badge.style().polish(self.badge)
        self.badge.setVisible(bool(text))
