"""CUDA Agent desktop app (Qt only).

Layering: app -> core, never back. The GUI process never creates a CUDA context: GPU facts come
from a child process (core.evaluation.probe) and compiles run in NVRTC worker processes.
Importing this package imports no Qt, so `cuda-agent-gui --help` answers at once.
"""
