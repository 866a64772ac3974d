"""The short public API: names and fractions in, Plans and Timelines out.

``slackswap.plan`` and ``slackswap.simulate`` accept a Workload or a built-in model name,
a Hardware or a preset name, and a budget given as a fraction of the unconstrained
peak (0.5), a byte count (int) or a size string ("12GiB"). ``profile`` and ``apply``
import torch only when called.
"""

from __future__ import annotations

from typing import Any

from .errors import BudgetError
from .hardware import Hardware, get_hardware
from .plans import Plan
from .timeline import Timeline
from .units import parse_size_bytes
from .workload import Workload

DEFAULT_HARDWARE = "a100-80gb-pcie4"


def _hardware(hardware: Hardware | str) -> Hardware:
    return hardware if isinstance(hardware, Hardware) else get_hardware(hardware)


def _workload(workload: Workload | str, hardware: Hardware) -> Workload:
    if isinstance(workload, Workload):
        return workload
    from .workloads.models import build_model_workload

    return build_model_workload(workload, hardware)


def budget_bytes_for(budget: float | int | str, unconstrained_peak_bytes: int) -> int:
    """A float in (0, 1] is a fraction of the unconstrained peak; an int is bytes; a str is a size."""
    if isinstance(budget, bool):
        raise BudgetError(f"budget must be a fraction, a byte count or a size string, got {budget!r}")
    if isinstance(budget, str):
        return parse_size_bytes(budget)
    if isinstance(budget, int):
        if budget <= 0:
            raise BudgetError(f"budget of {budget} bytes must be positive")
        return budget
    if isinstance(budget, float):
        if not 0 < budget <= 1:
            raise BudgetError(f"budget fraction {budget!r} must be above 0 and at most 1 (1.0 keeps everything)")
        return max(1, int(budget * unconstrained_peak_bytes))
    raise BudgetError(f"budget must be a fraction, a byte count or a size string, got {type(budget).__name__}")


def plan(
    workload: Workload | str,
    hardware: Hardware | str = DEFAULT_HARDWARE,
    budget: float | int | str = 0.5,
    policy: str = "slackswap",
) -> Plan:
    """Plan keep / swap / recompute for every saved tensor of ``workload`` within ``budget``."""
    from .planners import plan_workload
    from .sim import simulate_ideal

    hw = _hardware(hardware)
    w = _workload(workload, hw)
    peak = simulate_ideal(w, hw).peak_memory_bytes
    result = plan_workload(w, hw, budget_bytes_for(budget, peak), policy)
    if w.meta.get("source") == "slackswap.profiler" and result.prefetch_step:
        result = with_copy_in_start_steps(w, hw, result)
    return result


COPY_IN_START_STEP = "copy_in_start_step"
"""plan.info key: the backward step at which the simulation starts each copy back."""


def with_copy_in_start_steps(workload: Workload, hardware: Hardware, plan: Plan) -> Plan:
    """``plan`` with, in its info, the backward step at which the simulated copy of each swapped
    tensor back to the device *starts*. A copy is issued at its ``prefetch_step`` but waits on the
    in-order copy stream (and for memory), and the simulator counts its bytes from its start; the
    runtime allocates a copy's destination when it issues it, so it issues each copy at this step
    to hold what the simulation holds (slackswap.runtime, docs/runtime.md)."""
    import bisect
    import dataclasses

    from .sim import simulate as simulate_plan

    timeline = simulate_plan(workload, hardware, plan)
    n = len(workload.ops)
    last_end = [0.0] * (n + 1)  # last_end[k + 1]: when the last task of backward step k ends
    for e in timeline.events:
        if e.stream == "compute" and e.kind in ("forward", "recompute", "backward"):
            last_end[e.step + 1] = max(last_end[e.step + 1], e.end_s)
    # Step k is triggered when the last task before it ends (docs/simulator.md).
    triggers = [max(last_end[: k + 1]) for k in range(n)]
    starts = {}
    for e in timeline.events:
        if e.kind == "copy_in":
            starts[e.name] = max(plan.prefetch_step[e.name], bisect.bisect_right(triggers, e.start_s) - 1)
    return dataclasses.replace(plan, info={**plan.info, COPY_IN_START_STEP: starts})


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

    hw = _hardware(hardware)
    w = _workload(workload, hw)
    ideal = simulate_ideal(w, hw)
    budget_bytes = None if budget is None else budget_bytes_for(budget, ideal.peak_memory_bytes)
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
