"""Typed errors. Every message is one line that names the problem and the fix.

The CLI prints ``str(error)`` on stderr and exits with code 2, so the message is the
whole user interface of a failure: keep it specific.
"""

from __future__ import annotations


class SlackswapError(ValueError):
    """Base class of every error slackswap raises on purpose."""


class ValidationError(SlackswapError):
    """A workload, hardware, plan or timeline does not satisfy its schema."""


class UnknownNameError(SlackswapError):
    """A model, hardware preset or policy name that is not registered."""


class BudgetError(SlackswapError):
    """A budget that is malformed, or below the minimum any plan can reach."""

    def __init__(self, message: str, *, minimum_bytes: int | None = None) -> None:
        super().__init__(message)
        self.minimum_bytes = minimum_bytes


class InfeasiblePlanError(SlackswapError):
    """The simulated plan can never fit its budget: a stream would wait forever."""

    def __init__(self, message: str, *, needed_bytes: int, budget_bytes: int) -> None:
        super().__init__(message)
        self.needed_bytes = needed_bytes
        self.budget_bytes = budget_bytes


class PlanMismatchError(SlackswapError):
    """A plan was made for another workload (or another version of the model)."""


class RuntimeMemoryError(SlackswapError):
    """The device ran out of memory inside the runtime (a copy back or a recompute) under a plan."""

    def __init__(self, message: str, *, tensor: str, size_bytes: int, held_bytes: int,
                 budget_bytes: int | None) -> None:
        super().__init__(message)
        self.tensor = tensor
        self.size_bytes = size_bytes
        self.held_bytes = held_bytes
        self.budget_bytes = budget_bytes


class StaleStepError(SlackswapError):
    """Backward reached a saved tensor of a step the runtime has abandoned or replaced."""


class RuntimeUsageError(SlackswapError):
    """slackswap.apply used in a way the runtime cannot follow: nested applies, a double backward
    (create_graph=True), the model called more than once in a step."""


class RuntimeFallbackWarning(UserWarning):
    """The runtime could not run part of the plan as planned and did something safe instead."""


class ProfileNoiseWarning(UserWarning):
    """The repeated steps of a profile disagree by more than the stated spread (a busy machine)."""


class OutputPathError(SlackswapError):
    """An output file that cannot be written (missing directory, a directory, no permission)."""


class UnsupportedModelError(SlackswapError):
    """A model wrapping or call context the profiler and runtime cannot follow (FSDP1, DTensor
    parameters of tensor parallelism, FSDP2 on a 2-D mesh, multi-GPU DataParallel, CUDA graph capture)."""


class CheckpointBackendError(SlackswapError):
    """The checkpoint backend cannot run this plan as planned (use backend="replay")."""


class MissingExtraError(SlackswapError):
    """An optional dependency is not installed."""

    def __init__(self, package: str, extra: str, purpose: str) -> None:
        super().__init__(
            f"{purpose} needs the '{package}' package: install it with "
            f"pip install 'slackswap[{extra}]'"
        )
        self.package = package
        self.extra = extra


def require(module: str, extra: str, purpose: str):
    """Import an optional module or raise MissingExtraError naming the extra."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtraError(module.split(".")[0], extra, purpose) from exc


class BudgetWarning(UserWarning):
    """A compiled graph could not be planned within its share of the budget and was planned at its minimum."""
