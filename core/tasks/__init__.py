"""Tasks: a PyTorch reference operation (KernelBench format) with its input factory and specs."""

from core.tasks.loader import (
    SuiteError,
    SuiteResult,
    load_suite,
    load_task,
    load_task_from_source,
    scan_suite,
)
from core.tasks.task import Task, TaskError, TensorSpec, dtype_tolerance, seed_everything

__all__ = [
    "SuiteError",
    "SuiteResult",
    "Task",
    "TaskError",
    "TensorSpec",
    "dtype_tolerance",
    "load_suite",
    "load_task",
    "load_task_from_source",
    "scan_suite",
    "seed_everything",
]
