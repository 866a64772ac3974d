"""Plans whose whole step fits a device: the activation budget found from the GPU's memory.

``plan_for_device`` turns "80 GiB" into an activation budget. It starts from the device's
memory less the model states (an upper bound: the reserved peak holds both), plans,
replays the step through the allocator model (step.py) and, while the reserved peak is
over the device, lowers the activation budget below the plan's activation peak by the
excess and plans again. Each round lowers the activation peak, so the rounds are few; the
search is deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import BudgetError, ValidationError
from ..hardware import Hardware
from ..plans import Plan
from ..timeline import Timeline
from ..units import format_bytes
from ..workload import Workload
from .model_states import ModelStates, model_states
from .step import DeviceMemory, device_memory

MAX_ROUNDS = 12
"""Plans tried per device budget; each round lowers the activation budget by the last excess."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceOptions:
    """How the model is trained, for the memory beyond activations (docs/memory.md)."""

    optimizer: str = "adam"
    precision: str = "bf16-mixed"
    shard: int = 1
    sharding: str = "fsdp"
    expandable_segments: bool = False

    def states(self, workload: Workload, *, required: bool = False) -> ModelStates | None:
        """The model states of ``workload``; None when it does not record its parameters
        (an error when ``required``)."""
        try:
            return model_states(workload, optimizer=self.optimizer, precision=self.precision,
                                ranks=self.shard, sharding=self.sharding)
        except ValidationError as exc:
            if required or "parameter count" not in str(exc):
                raise
            return None

    def to_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer, "precision": self.precision, "shard": self.shard,
                "sharding": self.sharding, "expandable_segments": self.expandable_segments}


@dataclass(frozen=True, slots=True)
class DevicePlan:
    plan: Plan
    timeline: Timeline
    memory: DeviceMemory
    gpu_memory_bytes: int
    rounds: int
    """Plans tried before this one fitted."""


def _does_not_fit(workload: Workload, gpu: int, why: str, *, states_only: bool = False) -> BudgetError:
    fix = "" if states_only else ", or use a smaller micro-batch or sequence length"
    return BudgetError(
        f"{workload.name} does not fit {format_bytes(gpu)} ({gpu} bytes) per GPU: {why}; "
        f"shard the model states over more GPUs (--shard N){fix}",
    )


def plan_for_device(
    workload: Workload, hardware: Hardware, gpu_memory_bytes: int, policy: str,
    options: DeviceOptions = DeviceOptions(),
) -> DevicePlan:
    """A ``policy`` plan whose simulated reserved peak (model states, activations, gradients,
    workspaces, allocator rounding and fragmentation) fits ``gpu_memory_bytes``.
    Raises BudgetError naming what does not fit."""
    from ..planners import minimum_budget_bytes, plan_workload
    from ..sim import simulate_ideal

    if isinstance(gpu_memory_bytes, bool) or not isinstance(gpu_memory_bytes, int) or gpu_memory_bytes <= 0:
        raise BudgetError(f"GPU memory must be a positive number of bytes, got {gpu_memory_bytes!r}")
    gpu = gpu_memory_bytes
    states = options.states(workload, required=True)
    assert states is not None
    left = gpu - states.total_bytes
    if left <= 0:
        raise _does_not_fit(workload, gpu, f"the model states alone take {format_bytes(states.total_bytes)} "
                            f"({states.total_bytes} bytes)", states_only=True)
    peak = simulate_ideal(workload, hardware).peak_memory_bytes
    minimum = minimum_budget_bytes(workload)
    budget = min(peak, left)
    last: DeviceMemory | None = None
    last_plan: Plan | None = None
    for rounds in range(1, MAX_ROUNDS + 1):
        if budget < minimum:
            need = "" if last is None else f" (the last plan reserved {format_bytes(last.reserved_peak_bytes)})"
            raise _does_not_fit(
                workload, gpu,
                f"beside {format_bytes(states.total_bytes)} of model states and the gradients, workspaces and "
                f"fragmentation of backward, {format_bytes(max(budget, 0))} is left for saved activations and any "
                f"plan needs at least {format_bytes(minimum)}{need}",
            )
        try:
            plan = plan_workload(workload, hardware, budget, policy)
        except BudgetError as exc:
            raise _does_not_fit(workload, gpu, f"{policy} cannot plan for the {format_bytes(budget)} left "
                                f"for activations ({str(exc).split(': ', 1)[0]})") from None
        timeline, memory = device_memory(workload, hardware, plan, states=states,
                                         expandable_segments=options.expandable_segments,
                                         budget_bytes=plan.budget_bytes)
        if memory.reserved_peak_bytes <= gpu:
            return DevicePlan(plan, timeline, memory, gpu, rounds)
        same = last_plan is not None and (plan.actions, plan.prefetch_step) == (last_plan.actions, last_plan.prefetch_step)
        if same or policy == "ideal":
            break  # the policy does not change its plan with the budget (ideal, full recompute)
        last, last_plan = memory, plan
        budget = min(budget, memory.activation_peak_bytes) - (memory.reserved_peak_bytes - gpu)
    reserved = memory.reserved_peak_bytes
    raise _does_not_fit(workload, gpu,
                        f"the {policy} plan reserves {format_bytes(reserved)} ({reserved} bytes) at its peak")
