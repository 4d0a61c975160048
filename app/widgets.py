"""Small reusable widgets: an eliding label and an inline error banner."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QFrame, QHBoxLayout, QLabel, QSizePolicy, QStyle, QToolButton,
                               QWidget)


class ElidedLabel(QLabel):
    """A one-line label that shortens its text with '…' to fit; the full text is the tooltip."""

    def __init__(self, text: str = "", parent: QWidget | None = None,
                 mode: Qt.TextElideMode = Qt.TextElideMode.ElideRight):
        super().__init__(parent)
        self._full = ""
        self._mode = mode
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.setMinimumWidth(40)
        self.set_full_text(text)

    def set_full_text(self, text: str, tooltip: str | None = None) -> None:
        self._full = text
        self.setToolTip(tooltip if tooltip is not None else text)
        self._elide()

    def full_text(self) -> str:
        return self._full

    def resizeEvent(self, event) -> None:  # noqa: N802
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        width = max(0, self.width() - 2)
        super().setText(self.fontMetrics().elidedText(self._full, self._mode, width))


class ErrorBanner(QFrame):
    """An inline, non-blocking error message with a close button (never a modal dialog)."""

    dismissed = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("errorBanner")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(12, 8, 8, 8)
        layout.setSpacing(10)
        icon = QLabel()
        icon.setPixmap(self.style().standardIcon(QStyle.StandardPixmap.SP_MessageBoxCritical).pixmap(20, 20))
        icon.setAlignment(Qt.AlignmentFlag.AlignTop)
        self.label = QLabel()
        self.label.setObjectName("errorBannerText")
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.label.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        close = QToolButton()
        close.setAutoRaise(True)
        close.setIcon(self.style().standardIcon(QStyle.StandardPixmap.SP_TitleBarCloseButton))
        close.setToolTip("Dismiss")
        close.clicked.connect(self.dismiss)
        layout.addWidget(icon)
        layout.addWidget(self.label, 1)
        layout.addWidget(close, 0, Qt.AlignmentFlag.AlignTop)
        self.hide()

    def show_error(self, message: str) -> None:
        self.label.setText(message)
        self.show()

    def text(self) -> str:
        return self.label.text() if self.isVisible() else ""

    def dismiss(self) -> None:
        self.hide()
        self.dismissed.emit()
