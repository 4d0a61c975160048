"""One light look on every platform: the Fusion style, a light palette, a few named accents."""
from __future__ import annotations

from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication

STYLESHEET = """
#paneHeader { background: #f6f8fa; border-bottom: 1px solid #d0d7de; }
#paneTitle { font-weight: 600; }
#paneFile, #hint, #factLabel, #emptyHint, #activity { color: #57606a; }
#paneSummary { color: #57606a; background: #fbfbfc; border-bottom: 1px solid #eaeef2; }
#badge { border-radius: 9px; padding: 1px 9px; font-weight: 600; }
#badge[kind="ok"] { background: #dafbe1; color: #1a7f37; }
#badge[kind="error"] { background: #ffebe9; color: #cf222e; }
#badge[kind="busy"] { background: #ddf4ff; color: #0969da; }
#badge[kind="info"] { background: #eaeef2; color: #57606a; }
#errorBanner { background: #ffebe9; border: 1px solid #ff8182; border-radius: 6px; }
#errorBannerText { color: #82071e; }
#welcomeTitle { font-size: 22pt; font-weight: 600; }
#welcomeSubtitle { color: #57606a; font-size: 11pt; }
#sectionTitle { font-weight: 600; font-size: 11pt; }
#taskName { font-size: 13pt; font-weight: 600; }
#familyPill { background: #ddf4ff; color: #0969da; border-radius: 9px; padding: 1px 9px; }
#bigButton { padding: 5px 10px; }
#gpuDot[kind="ok"] { color: #1a7f37; }
#gpuDot[kind="none"] { color: #bf8700; }
#gpuDot[kind="busy"] { color: #8b949e; }
QTreeWidget::item, QListWidget::item { padding: 2px 0; }
QSplitter::handle { background: #d0d7de; }
QStatusBar { border-top: 1px solid #d0d7de; }
QDockWidget::title { background: #f6f8fa; padding: 5px 8px; border-bottom: 1px solid #d0d7de; }
"""


def apply_theme(app: QApplication) -> None:
    app.setStyle("Fusion")
    palette = QPalette()
    palette.setColor(QPalette.ColorRole.Window, QColor("#ffffff"))
    palette.setColor(QPalette.ColorRole.Base, QColor("#ffffff"))
    palette.setColor(QPalette.ColorRole.AlternateBase, QColor("#f6f8fa"))
    palette.setColor(QPalette.ColorRole.Button, QColor("#f6f8fa"))
    palette.setColor(QPalette.ColorRole.Highlight, QColor("#0969da"))
    palette.setColor(QPalette.ColorRole.WindowText, QColor("#1f2328"))
    palette.setColor(QPalette.ColorRole.Text, QColor("#1f2328"))
    palette.setColor(QPalette.ColorRole.ButtonText, QColor("#1f2328"))
    palette.setColor(QPalette.ColorRole.ToolTipBase, QColor("#ffffff"))
    palette.setColor(QPalette.ColorRole.ToolTipText, QColor("#1f2328"))
    disabled = QColor("#8c959f")
    for role in (QPalette.ColorRole.WindowText, QPalette.ColorRole.Text, QPalette.ColorRole.ButtonText):
        palette.setColor(QPalette.ColorGroup.Disabled, role, disabled)
    app.setPalette(palette)
    app.setStyleSheet(STYLESHEET)
