"""The one exception type of the program package."""

from __future__ import annotations


class ProgramError(Exception):
    """A kernel program (or solution file) is invalid or cannot be resolved.

    The message is one paragraph that names the field path (e.g. ``launches[1].grid[0]``)
    and the problem; ``field`` holds that path when there is one, for GUIs that want to
    highlight the offending field.
    """

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field
