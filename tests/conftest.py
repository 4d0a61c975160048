"""Shared test setup: GPU tests are skipped, visibly, where there is no usable GPU."""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


@lru_cache(maxsize=1)
def gpu_unavailable_reason() -> str | None:
    from core.evaluation.probe import probe_gpus

    probe = probe_gpus()
    return None if probe.can_run else probe.reason


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    reason = gpu_unavailable_reason()
    if reason:
        skip = pytest.mark.skip(reason=f"GPU test: {reason}")
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    """Point every on-disk cache at a temporary folder."""
    monkeypatch.setenv("CUDA_AGENT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(autouse=True)
def own_memory_file(tmp_path_factory, monkeypatch):
    """Runs remember into, and recall from, a memory file of the test's own, never the user's
    (core/search/memory.py, user_memory_path)."""
    path = tmp_path_factory.mktemp("memory") / "memory.json"
    monkeypatch.setenv("CUDA_AGENT_MEMORY", str(path))
    return path
