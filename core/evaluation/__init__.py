"""Honest, crash-proof evaluation of candidate kernels (DESIGN section 4)."""
from .evaluator import Baselines, Evaluator
from .results import EvalResult, KernelStats, Measurement, Status, Timing
from .supervisor import SupervisorSettings

__all__ = ["Baselines", "EvalResult", "Evaluator", "KernelStats", "Measurement", "Status",
           "SupervisorSettings", "Timing"]
