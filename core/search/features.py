"""State features for learned policies: task, hardware, current schedule, last measurement."""
from __future__ import annotations

import math
from typing import Any, Mapping

from .space import ScheduleSpace

FAMILIES = ("act", "norm", "red", "softmax", "gemm", "conv", "pool", "attn", "other")
DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "other")
FAILURES = ("measured", "compile_error", "wrong", "crashed", "timeout", "rejected", "none")
MAX_DIMS = 4


def _one_hot(value: str, names: tuple[str, ...]) -> list[float]:
    value = value if value in names else names[-1]
    return [1.0 if n == value else 0.0 for n in names]


def task_features(task: Any) -> list[float]:
    """Op family (from the task name prefix), log2 of the first input's dims, its dtype."""
    name = getattr(task, "name", "") or ""
    family = name.split("_", 1)[0]
    spec = next((s for s in getattr(task, "input_specs", []) if s is not None), None)
    dims = list(spec.shape[:MAX_DIMS]) if spec is not None else []
    dims += [1] * (MAX_DIMS - len(dims))
    return (_one_hot(family, FAMILIES) + [math.log2(max(d, 1)) / 20.0 for d in dims]
            + _one_hot(spec.dtype if spec is not None else "other", DTYPES))


def gpu_features(gpu: Mapping[str, Any] | None) -> list[float]:
    """SM count, memory bandwidth and shared memory per block, scaled to about 1 on an H200."""
    gpu = gpu or {}
    return [float(gpu.get("sms", 132)) / 132.0, float(gpu.get("bandwidth_gbs", 4800.0)) / 4800.0,
            float(gpu.get("shared_per_block_optin", 227 * 1024)) / (227 * 1024)]


def schedule_features(space: ScheduleSpace, schedule: Mapping[str, int]) -> list[float]:
    """One-hot of each knob's current value."""
    out: list[float] = []
    for knob in space.knobs:
        out += [1.0 if schedule.get(knob.name) == v else 0.0 for v in knob.values]
    return out


def measurement_features(status: str | None, measurement: Mapping[str, Any] | None,
                         eager_ms: float | None) -> list[float]:
    """log(eager/time), roofline fraction, occupancy, registers/255, spills>0, failure kind one-hot."""
    m = measurement or {}
    median = (m.get("timing") or {}).get("median_ms")
    ratio = math.log(eager_ms / median) if median and eager_ms else 0.0
    kernels = m.get("kernels") or []
    occupancy = max((k.get("occupancy") or 0.0 for k in kernels), default=0.0)
    registers = max((k.get("registers") or 0 for k in kernels), default=0) / 255.0
    spills = 1.0 if any((k.get("spill_stores") or 0) + (k.get("spill_loads") or 0) for k in kernels) else 0.0
    return ([ratio, float(m.get("roofline_fraction") or 0.0), float(occupancy), registers, spills]
            + _one_hot(status or "none", FAILURES))


def state_vector(space: ScheduleSpace, task: Any, gpu: Mapping[str, Any] | None, schedule: Mapping[str, int],
                 status: str | None, measurement: Mapping[str, Any] | None, eager_ms: float | None) -> list[float]:
    return (task_features(task) + gpu_features(gpu) + schedule_features(space, schedule)
            + measurement_features(status, measurement, eager_ms))


def feature_size(space: ScheduleSpace, task: Any, gpu: Mapping[str, Any] | None = None) -> int:
    return len(state_vector(space, task, gpu, space.default(), None, None, None))
