"""CodegenError: a reference that cannot be captured or lowered (one clear paragraph)."""
from __future__ import annotations


class CodegenError(Exception):
    """Raised when capture or lowering fails; the message names the task and the op(s)."""

    def __init__(self, message: str, *, task: str | None = None, ops: list[str] | None = None):
        super().__init__(message)
        self.task = task
        self.ops = list(ops or [])
