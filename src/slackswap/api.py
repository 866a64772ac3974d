"""The short public API: names and fractions in, Plans and Timelines out.

``slackswap.plan`` and ``slackswap.simulate`` accept a Workload or a built-in model name,
a Hardware or a preset name, and a budget given as a fraction of the unconstrained
peak (0.5), a byte count (int) or a size string ("12GiB"). ``profile`` and ``apply``
import torch only when called.
"""

from __future__ import annotations

from typing import Any

from .errors import BudgetError
from .hardware import DEFAULT_HARDWARE, Hardware, get_hardware
from .plans import Plan
from .timeline import Timeline
from .units import parse_budget
from .workload import Workload

__all__ = ["DEFAULT_HARDWARE", "apply", "plan", "profile", "simulate"]


def _workload(workload: Workload | str, hardware: Hardware) -> Workload:
    if isinstance(workload, Workload):
        return workload
    from .workloads.models import build_model_workload

    return build_model_workload(workload, hardware)


def plan(
    workload: Workload | str,
    hardware: Hardware | str = DEFAULT_HARDWARE,
    budget: float | int | str = 0.5,
    policy: str = "slackswap",
) -> Plan:
    """Plan keep / swap / recompute for every saved tensor of ``workload`` within ``budget``.

    The plan carries the backward step at which the simulation starts each copy back, which
    is when the runtime issues it (slackswap.sim.copy_starts)."""
    from .planners import plan_workload
    from .sim import simulate_ideal, with_copy_in_start_steps

    hw = get_hardware(hardware)
    w = _workload(workload, hw)
    peak = simulate_ideal(w, hw).peak_memory_bytes
    result = plan_workload(w, hw, parse_budget(budget, peak), policy)
    return with_copy_in_start_steps(w, hw, result)


def simulate(
    workload: Workload | str,
    hardware: Hardware | str = DEFAULT_HARDWARE,
    plan: Plan | None = None,
    budget: float | int | str | None = None,
    *,
    policy: str | None = None,
) -> Timeline:
    """Simulate one step under ``plan`` (or under ``policy``, planned on the fly; ideal if neither)."""
    from .sim import simulate as simulate_plan, simulate_ideal

    hw = get_hardware(hardware)
    w = _workload(workload, hw)
    ideal = simulate_ideal(w, hw)
    budget_bytes = None if budget is None else parse_budget(budget, ideal.peak_memory_bytes)
    if plan is None and policy in (None, "ideal"):
        return ideal
    if plan is None:
        from .planners import plan_workload

        if budget_bytes is None:
            raise BudgetError(f"policy {policy!r} needs a budget: pass budget=0.5 or a byte count")
        plan = plan_workload(w, hw, budget_bytes, policy)
    return simulate_plan(w, hw, plan, budget_bytes)


def profile(model: Any, example_batch: Any, loss_fn: Any, **options: Any) -> Workload:
    """Measure one training step of a torch model (needs the torch extra)."""
    from .errors import require

    require("torch", "torch", "profiling a PyTorch model")
    from .profiler import profile_model

    return profile_model(model, example_batch, loss_fn, **options)


def apply(model: Any, plan: Plan, *, backend: str = "replay", **options: Any):
    """Context manager: train ``model`` under ``plan`` (needs the torch extra).

    ``backend="replay"`` (default) runs any plan exactly; ``backend="checkpoint"`` recomputes through
    torch.utils.checkpoint and refuses plans it cannot run as planned (docs/runtime.md, Backends)."""
    from .errors import require

    require("torch", "torch", "running a plan on a PyTorch model")
    from .runtime import apply_plan

    return apply_plan(model, plan, backend=backend, **options)


def model_states(
    model: Workload | str | Any,
    *,
    optimizer: str = "adam",
    precision: str = "bf16-mixed",
    shard: int = 1,
    sharding: str = "fsdp",
):
    """Per-rank parameter, gradient and optimizer-state bytes (a ``slackswap.memory.ModelStates``)
    of a built-in model name, a Workload (built-in or profiled), a TransformerSpec or a parameter
    count, with ``optimizer`` ('sgd', 'sgd-momentum', 'adam', 'adamw'), ``precision`` ('fp32',
    'bf16', 'bf16-mixed') and the states sharded over ``shard`` ranks by ``sharding`` ('none',
    'zero1', 'zero2', 'zero3', 'fsdp'). docs/memory.md gives the accounting."""
    from .memory import model_states as states_of

    if isinstance(model, str):
        from .workloads.models import model_spec

        model = model_spec(model)
    return states_of(model, optimizer=optimizer, precision=precision, ranks=shard, sharding=sharding)
