"""A read-only code view: pygments colours, line numbers, and marked (error/warning) lines."""
from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QEvent, QRect, QSize, Qt
from PySide6.QtGui import QColor, QFontDatabase, QPainter, QPalette, QTextCursor, QTextFormat
from PySide6.QtWidgets import QPlainTextEdit, QTextEdit, QToolTip, QWidget

from app.highlight import PygmentsHighlighter, code_style

MARK_COLORS = {"error": QColor("#fde2e1"), "warning": QColor("#fff4cc")}
MARK_INK = {"error": QColor("#c62828"), "warning": QColor("#a06800")}


@dataclass(frozen=True)
class LineMark:
    severity: str  # "error" or "warning"
    message: str


def monospace_font():
    font = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
    font.setStyleHint(font.StyleHint.Monospace)
    return font


class _Gutter(QWidget):
    """Line numbers; marked lines get a coloured number and a tooltip with the message."""

    def __init__(self, view: SourceView):
        super().__init__(view)
        self._view = view

    def sizeHint(self) -> QSize:  # noqa: N802
        return QSize(self._view.gutter_width(), 0)

    def paintEvent(self, event) -> None:  # noqa: N802
        self._view.paint_gutter(event)

    def event(self, event) -> bool:
        if event.type() == QEvent.Type.ToolTip:
            line = self._view.line_at(event.pos().y())
            mark = self._view.marks.get(line) if line else None
            if mark:
                QToolTip.showText(event.globalPos(), f"line {line}: {mark.message}", self)
            else:
                QToolTip.hideText()
            return True
        return super().event(event)


class SourceView(QPlainTextEdit):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setReadOnly(True)
        self.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse
                                     | Qt.TextInteractionFlag.TextSelectableByKeyboard)
        self.setFont(monospace_font())
        self.setTabStopDistance(4 * self.fontMetrics().horizontalAdvance(" "))
        self.setFrameShape(QPlainTextEdit.Shape.NoFrame)
        background = code_style().background_color or "#ffffff"
        palette = self.palette()
        palette.setColor(QPalette.ColorRole.Base, QColor(background))
        palette.setColor(QPalette.ColorRole.Text, QColor("#1f2328"))
        self.setPalette(palette)
        self.marks: dict[int, LineMark] = {}
        self.language = "text"
        self._highlighter = PygmentsHighlighter(self.document())
        self._gutter = _Gutter(self)
        self.blockCountChanged.connect(self._update_margins)
        self.updateRequest.connect(self._update_gutter)
        self._update_margins()

    # ---- content -------------------------------------------------------------------------------

    def set_source(self, text: str, language: str) -> None:
        """Show `text` highlighted as "python", "cuda" or "text"; clears the marks."""
        text = text.replace("\r\n", "\n").replace("\r", "\n")
        self.language = language
        self.marks = {}
        self.setPlainText(text)
        self._highlighter.set_text(text, language)
        self._apply_marks()

    def clear_source(self) -> None:
        self.set_source("", "text")

    def set_marks(self, marks: dict[int, LineMark]) -> None:
        """Mark 1-based lines; an error wins over a warning on the same line."""
        self.marks = dict(marks)
        self._apply_marks()
        if marks:
            self.go_to_line(min(marks))

    def go_to_line(self, line: int) -> None:
        block = self.document().findBlockByNumber(max(0, line - 1))
        if block.isValid():
            self.setTextCursor(QTextCursor(block))
            self.centerCursor()

    def _apply_marks(self) -> None:
        selections = []
        for line, mark in sorted(self.marks.items()):
            block = self.document().findBlockByNumber(line - 1)
            if not block.isValid():
                continue
            selection = QTextEdit.ExtraSelection()
            selection.format.setBackground(MARK_COLORS.get(mark.severity, MARK_COLORS["error"]))
            selection.format.setProperty(QTextFormat.Property.FullWidthSelection, True)
            selection.cursor = QTextCursor(block)
            selections.append(selection)
        self.setExtraSelections(selections)
        self._gutter.update()

    # ---- gutter --------------------------------------------------------------------------------

    def gutter_width(self) -> int:
        digits = max(3, len(str(max(1, self.blockCount()))))
        return 16 + self.fontMetrics().horizontalAdvance("9") * digits

    def _update_margins(self, _count: int = 0) -> None:
        self.setViewportMargins(self.gutter_width(), 0, 0, 0)

    def _update_gutter(self, rect: QRect, dy: int) -> None:
        if dy:
            self._gutter.scroll(0, dy)
        else:
            self._gutter.update(0, rect.y(), self._gutter.width(), rect.height())
        if rect.contains(self.viewport().rect()):
            self._update_margins()

    def resizeEvent(self, event) -> None:  # noqa: N802
        super().resizeEvent(event)
        area = self.contentsRect()
        self._gutter.setGeometry(QRect(area.left(), area.top(), self.gutter_width(), area.height()))

    def line_at(self, y: int) -> int | None:
        block = self.firstVisibleBlock()
        while block.isValid():
            top = self.blockBoundingGeometry(block).translated(self.contentOffset()).top()
            bottom = top + self.blockBoundingRect(block).height()
            if top <= y < bottom:
                return block.blockNumber() + 1
            if top > y:
                return None
            block = block.next()
        return None

    def paint_gutter(self, event) -> None:
        painter = QPainter(self._gutter)
        painter.fillRect(event.rect(), QColor("#f0f1f3"))
        painter.setPen(QColor("#dcdfe4"))
        painter.drawLine(self._gutter.width() - 1, event.rect().top(),
                         self._gutter.width() - 1, event.rect().bottom())
        painter.setFont(self.font())
        block = self.firstVisibleBlock()
        top = round(self.blockBoundingGeometry(block).translated(self.contentOffset()).top())
        height = self.fontMetrics().height()
        width = self._gutter.width() - 8
        while block.isValid() and top <= event.rect().bottom():
            bottom = top + round(self.blockBoundingRect(block).height())
            if block.isVisible() and bottom >= event.rect().top():
                line = block.blockNumber() + 1
                mark = self.marks.get(line)
                if mark:
                    ink = MARK_INK.get(mark.severity, MARK_INK["error"])
                    painter.setBrush(ink)
                    painter.setPen(Qt.PenStyle.NoPen)
                    painter.drawEllipse(4, top + height // 2 - 3, 6, 6)
                    painter.setPen(ink)
                else:
                    painter.setPen(QColor("#8b949e"))
                painter.drawText(0, top, width, height, Qt.AlignmentFlag.AlignRight, str(line))
            block = block.next()
            top = bottom
        painter.end()
