"""Compile results and NVRTC log parsing.

NVRTC reports problems as EDG-style blocks::

    kernel.cu(3): error: identifier "y" is undefined
        x[0] = y + 1;
               ^
              detected during: ...        (optional continuation lines)

A block is a header line, an echo of the source line (indented by two spaces), a caret line
and sometimes continuation lines, ended by an empty line. Tool-level problems come as single
lines: ``nvrtc: error: invalid value for --gpu-architecture (-arch)`` or
``ptxas error   : Entry function 'k' uses too much shared data``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

# How many errors error_summary() shows before "... and N more".
SUMMARY_MAX_ERRORS = 5
# Continuation lines kept per diagnostic (template instantiation chains can be hundreds long).
_MAX_CONTINUATION_LINES = 6

_HEADER = re.compile(
    r"^(?P<file>.+?)\((?P<line>\d+)\): "
    r"(?P<kind>catastrophic error|fatal error|error|warning|remark|note)"
    r"(?: #(?P<code>[0-9A-Za-z_-]+))?: (?P<msg>.*)$"
)
_TOOL_LINE = re.compile(r"^(?P<tool>nvrtc|ptxas|nvlink|nvvm)(?::)?\s+(?P<kind>fatal|error|warning)\s*:\s*(?P<msg>.*)$")
_CARET = re.compile(r"^\s*\^\s*$")
_IGNORED = (
    re.compile(r"^\d+ (catastrophic )?errors? detected in the compilation of "),
    re.compile(r"^Compilation terminated\.?$"),
    re.compile(r"^Remark: The warnings can be suppressed"),
)


@dataclass(frozen=True)
class Diagnostic:
    severity: str            # "error" or "warning"
    line: int | None         # 1-based line in the user's source; None for tool or header-file problems
    column: int | None       # 1-based column from NVRTC's caret, when it gave one
    message: str
    source_line: str | None  # the user's source line text (trailing whitespace removed)

    def format(self) -> str:
        """`line 12: message` plus the source line, as shown to users and the LLM."""
        label = "warning: " if self.severity == "warning" else ""
        head = f"{label}{self.message}" if self.line is None else f"line {self.line}: {label}{self.message}"
        if self.source_line is not None and self.source_line.strip():
            return f"{head}\n    {self.source_line.strip()}"
        return head


@dataclass
class CompileResult:
    ok: bool
    status: str                                   # "ok" | "error" | "timeout" | "crashed"
    cubin: bytes | None
    log: str
    diagnostics: list[Diagnostic] = field(default_factory=list)
    seconds: float = 0.0                          # wall time to obtain this result (lookup time when cached)
    cached: bool = False
    key: str = ""
    arch: str = ""

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "error"]

    @property
    def warnings(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "warning"]

    def error_summary(self, max_errors: int = SUMMARY_MAX_ERRORS) -> str:
        """The first few errors with line numbers and source text; '' for a clean compile."""
        if self.ok:
            return ""
        errors = self.errors
        if not errors:
            # Timeouts, crashes, missing NVRTC: the log already is one clear message.
            text = self.log.strip()
            return text if text else f"compile failed ({self.status}) without a log"
        parts = [d.format() for d in errors[:max_errors]]
        if len(errors) > max_errors:
            parts.append(f"... and {len(errors) - max_errors} more errors")
        return "\n".join(parts)


def parse_nvrtc_log(log: str, source: str, filename: str = "kernel.cu") -> list[Diagnostic]:
    """Turn an NVRTC log into diagnostics. Problems reported inside included headers keep the
    header's name and line in the message and get line=None (the line is not the user's)."""
    source_lines = source.splitlines()
    diagnostics: list[Diagnostic] = []
    current: dict | None = None     # diagnostic being assembled
    pending: list[str] = []         # lines after the header not yet known to be echo or continuation

    def flush() -> None:
        nonlocal current, pending
        if current is not None:
            extra = [p for p in current["extra"] + pending if p]
            if len(extra) > _MAX_CONTINUATION_LINES:
                extra = extra[:_MAX_CONTINUATION_LINES] + ["..."]
            message = "\n".join([current["message"], *extra]) if extra else current["message"]
            diagnostics.append(Diagnostic(current["severity"], current["line"], current["column"],
                                          message, current["source_line"]))
        current, pending = None, []

    for raw in log.splitlines():
        header = _HEADER.match(raw)
        if header:
            kind = header["kind"]
            if kind in ("note", "remark"):
                # A note explains the diagnostic before it ("expression not folded ...").
                if kind == "note":
                    if current is not None:
                        current["extra"].extend(pending)
                        pending = []
                        current["extra"].append(f"note: {header['msg']}")
                    elif diagnostics:   # the block before was already closed by an empty line
                        last = diagnostics[-1]
                        diagnostics[-1] = replace(last, message=f"{last.message}\nnote: {header['msg']}")
                continue
            flush()
            line_no = int(header["line"])
            message = header["msg"]
            user_line: int | None = line_no
            if header["file"] != filename:
                user_line = None
                message = f"{header['file']}({line_no}): {message}"
            text = None
            if user_line is not None and 1 <= user_line <= len(source_lines):
                text = source_lines[user_line - 1].rstrip()
            current = {"severity": "warning" if kind == "warning" else "error", "line": user_line,
                       "column": None, "message": message, "source_line": text, "extra": []}
            continue
        if current is not None and _CARET.match(raw):
            # The line before the caret is NVRTC's echo of the source line ("  " + text).
            if pending:
                pending.pop()
            current["extra"].extend(pending)
            pending = []
            column = raw.index("^") - 1
            if current["column"] is None and column >= 1:
                current["column"] = column
            continue
        if any(p.match(raw) for p in _IGNORED):
            flush()
            continue
        tool = _TOOL_LINE.match(raw)
        if tool:
            flush()
            severity = "warning" if tool["kind"] == "warning" else "error"
            message = tool["msg"].strip()
            if tool["tool"] != "nvrtc":
                message = f"{tool['tool']}: {message}"
            diagnostics.append(Diagnostic(severity, None, None, message, None))
            continue
        if not raw.strip():
            flush()
            continue
        if current is not None:
            pending.append(raw.strip())
    flush()
    return diagnostics
