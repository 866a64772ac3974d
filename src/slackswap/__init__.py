"""slackswap: plan, simulate and run keep / swap / recompute of saved activations."""

from .errors import (
    BudgetError, InfeasiblePlanError, MissingExtraError, PlanMismatchError, SlackswapError,
    UnknownNameError, UnsupportedModelError, ValidationError,
)
from .hardware import PRESETS as HARDWARE_PRESETS, Hardware, get_hardware
from .plans import Action, Plan
from .schedule import make_plan
from .sim import simulate_ideal
from .api import apply, auto, compile, device_memory, fit, model_states, plan, plan_for_gpu, profile, simulate
from .buckets import bucket_length
from .timeline import Event, Timeline
from .workload import Op, Tensor, Workload

__version__ = "0.1.0"

__all__ = [
    "Action", "apply", "auto", "compile", "bucket_length", "plan", "profile", "BudgetError", "Event", "HARDWARE_PRESETS",
    "Hardware", "InfeasiblePlanError", "MissingExtraError", "device_memory", "fit", "model_states", "Op",
    "plan_for_gpu", "Plan", "PlanMismatchError", "SlackswapError", "Tensor", "Timeline",
    "UnknownNameError", "UnsupportedModelError", "ValidationError", "Workload", "get_hardware", "make_plan", "simulate",
    "simulate_ideal", "__version__",
]
