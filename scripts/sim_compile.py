"""A stand-in for NVRTC in CompilePool's workers, for scripts/compile_ahead_sim.py: it sleeps for the
seconds named by a `--sim-seconds=S` option and answers a successful compile."""
from __future__ import annotations

import time

from core.toolchain.diagnostics import CompileResult


def compile(source: str, *, arch: str, options: list[str], filename: str) -> CompileResult:
    seconds = next(float(o.split("=", 1)[1]) for o in options if o.startswith("--sim-seconds="))
    time.sleep(seconds)
    return CompileResult(ok=True, status="ok", cubin=b"", log="", diagnostics=[], arch=arch, seconds=seconds)
