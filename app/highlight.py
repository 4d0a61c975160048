"""Pygments syntax highlighting for a QTextDocument.

The whole text is lexed once (multi-line strings and comments need the full context), the
token formats are stored per line, and highlightBlock() only paints the stored formats.
"""
from __future__ import annotations

from pygments.lexer import Lexer
from pygments.lexers import CudaLexer, PythonLexer, TextLexer
from pygments.style import StyleMeta
from pygments.styles import get_style_by_name
from PySide6.QtGui import QColor, QFont, QSyntaxHighlighter, QTextCharFormat, QTextDocument

STYLE_NAME = "xcode"  # light, no italics, calm colours

_LEXERS = {"python": PythonLexer, "cuda": CudaLexer, "text": TextLexer}


def make_lexer(language: str) -> Lexer:
    # No stripping or added newline: token offsets must match the document's characters.
    return _LEXERS.get(language, TextLexer)(stripnl=False, stripall=False, ensurenl=False)


def code_style() -> StyleMeta:
    return get_style_by_name(STYLE_NAME)


def _char_format(style_def: dict) -> QTextCharFormat | None:
    fmt = QTextCharFormat()
    used = False
    if style_def.get("color"):
        fmt.setForeground(QColor("#" + style_def["color"]))
        used = True
    if style_def.get("bgcolor"):
        fmt.setBackground(QColor("#" + style_def["bgcolor"]))
        used = True
    if style_def.get("bold"):
        fmt.setFontWeight(QFont.Weight.Bold)
        used = True
    if style_def.get("italic"):
        fmt.setFontItalic(True)
        used = True
    return fmt if used else None


class PygmentsHighlighter(QSyntaxHighlighter):
    def __init__(self, document: QTextDocument, language: str = "text"):
        super().__init__(document)
        self._style = code_style()
        self._formats: dict[object, QTextCharFormat | None] = {}
        self._lines: list[list[tuple[int, int, QTextCharFormat]]] = []
        self._language = language

    def set_text(self, text: str, language: str) -> None:
        """Lex `text` (exactly the document's text) and repaint."""
        self._language = language
        self._lines = self._lex(text, make_lexer(language))
        self.rehighlight()

    def _format_for(self, ttype) -> QTextCharFormat | None:
        if ttype not in self._formats:
            self._formats[ttype] = _char_format(self._style.style_for_token(ttype))
        return self._formats[ttype]

    def _lex(self, text: str, lexer: Lexer) -> list[list[tuple[int, int, QTextCharFormat]]]:
        lines: list[list[tuple[int, int, QTextCharFormat]]] = [[]]
        column = 0
        for _, ttype, value in lexer.get_tokens_unprocessed(text):
            fmt = self._format_for(ttype)
            for i, piece in enumerate(value.split("\n")):
                if i > 0:
                    lines.append([])
                    column = 0
                if piece and fmt is not None:
                    lines[-1].append((column, len(piece), fmt))
                column += len(piece)
        return lines

    def highlightBlock(self, text: str) -> None:  # noqa: N802 (Qt name)
        number = self.currentBlock().blockNumber()
        if 0 <= number < len(self._lines):
            for start, length, fmt in self._lines[number]:
                self.setFormat(start, length, fmt)
