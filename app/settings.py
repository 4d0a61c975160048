"""Persistent settings (QSettings): recent files, window geometry and dock layout.

Every read is typed (`type=`), because an INI file stores lists and byte arrays as strings
and a hand-edited or older file must not crash the app.
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QByteArray, QSettings

ORGANIZATION = "CUDA Agent"
APPLICATION = "cuda-agent"
MAX_RECENT = 10

RECENT_KEY = "recentFiles"
GEOMETRY_KEY = "window/geometry"
STATE_KEY = "window/state"
SPLITTER_KEY = "window/splitter"


def open_settings() -> QSettings:
    """The app's settings, always INI so tests can redirect them with QSettings.setPath."""
    return QSettings(QSettings.Format.IniFormat, QSettings.Scope.UserScope, ORGANIZATION, APPLICATION)


def read_recent(settings: QSettings) -> list[str]:
    value = settings.value(RECENT_KEY, [], type=list)
    return [str(v) for v in value if isinstance(v, str) and v]


def add_recent(settings: QSettings, path: str | Path) -> list[str]:
    """Put `path` (absolute) first in the recent list; returns the new list."""
    entry = str(Path(path).resolve())
    recent = [entry] + [p for p in read_recent(settings) if p != entry]
    recent = recent[:MAX_RECENT]
    settings.setValue(RECENT_KEY, recent)
    return recent


def read_bytes(settings: QSettings, key: str) -> QByteArray:
    value = settings.value(key, QByteArray(), type=QByteArray)
    return value if isinstance(value, QByteArray) else QByteArray()
