"""The log dock's text: timestamped lines, coloured by level, kept to the last few thousand."""
from __future__ import annotations

import time

from PySide6.QtGui import QColor, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QPlainTextEdit, QWidget

from app.source_view import monospace_font

LEVEL_COLORS = {"info": "#1f2328", "ok": "#1a7f37", "warning": "#9a6700", "error": "#c62828"}
MAX_LINES = 5000


class LogView(QPlainTextEdit):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setReadOnly(True)
        self.setMaximumBlockCount(MAX_LINES)
        self.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)
        self.setFont(monospace_font())
        self.setObjectName("logView")

    def add(self, text: str, level: str = "info") -> None:
        """Append one entry; continuation lines are indented under the first."""
        stamp = QTextCharFormat()
        stamp.setForeground(QColor("#8b949e"))
        body = QTextCharFormat()
        body.setForeground(QColor(LEVEL_COLORS.get(level, LEVEL_COLORS["info"])))
        cursor = self.textCursor()
        cursor.movePosition(QTextCursor.MoveOperation.End)
        if not self.document().isEmpty():
            cursor.insertBlock()
        cursor.insertText(time.strftime("%H:%M:%S  "), stamp)
        cursor.insertText(text.rstrip().replace("\n", "\n          "), body)
        self.setTextCursor(cursor)
        self.ensureCursorVisible()
