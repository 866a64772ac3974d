"""Pinned host memory: what a plan's swaps need on the host, and plans that respect a limit.

The runtime copies every swapped tensor of a step into one pinned host pool, a slot per
tensor aligned to HOST_SLOT_ALIGN_BYTES and reused every step (docs/runtime.md), so a plan
needs the sum of its swapped tensors' sizes, each rounded up to the alignment. A hardware
whose ``pinned_host_bytes`` is set bounds it: ``simulate`` refuses a plan that needs more,
and ``fit_host_memory`` turns swaps into recomputes, cheapest to rebuild per byte first,
until the plan fits (planners.plan_workload applies it to every policy).
"""

from __future__ import annotations

from ..errors import InfeasiblePlanError
from ..hardware import Hardware
from ..plans import Action, Plan
from ..units import format_bytes
from ..workload import Workload

HOST_SLOT_ALIGN_BYTES = 64
"""Alignment of each swapped tensor's slot in the runtime's pinned pool (runtime/swap.py)."""


def pinned_host_bytes_for(workload: Workload, plan: Plan) -> int:
    """Pinned host bytes the runtime's pool holds for ``plan``."""
    align = HOST_SLOT_ALIGN_BYTES
    return sum(-(-workload.size_bytes_of[name] // align) * align
               for name, action in plan.actions.items() if action is Action.SWAP)


def check_host_memory(workload: Workload, hardware: Hardware, plan: Plan) -> None:
    """Raise InfeasiblePlanError when ``plan`` needs more pinned host memory than ``hardware`` has."""
    limit = hardware.pinned_host_bytes
    if limit is None:
        return
    need = pinned_host_bytes_for(workload, plan)
    if need > limit:
        raise InfeasiblePlanError(
            f"plan swaps {format_bytes(need)} ({need} bytes) to pinned host memory and {hardware.name} has "
            f"{format_bytes(limit)} ({limit} bytes); plan again on this hardware (planners keep to it) "
            "or raise hardware.pinned_host_bytes",
            needed_bytes=need, budget_bytes=limit,
        )


def fit_host_memory(workload: Workload, hardware: Hardware, plan: Plan) -> Plan:
    """``plan`` with swaps turned into recomputes until it fits the hardware's pinned host memory.

    The swap whose producer re-runs fastest per byte goes first (ties: the later tensor); the
    plan is completed again (prefetch steps and recompute groups) with its policy and budget."""
    from ..schedule import make_plan

    limit = hardware.pinned_host_bytes
    if limit is None or pinned_host_bytes_for(workload, plan) <= limit:
        return plan
    order = {t.name: i for i, t in enumerate(workload.saved_tensors)}
    swapped = [n for n, a in plan.actions.items() if a is Action.SWAP]

    def cost_per_byte(name: str) -> tuple[float, int]:
        producer = workload.ops[workload.op_index[workload.tensor_by_name[name].producer]]
        return producer.fwd_time_s / workload.size_bytes_of[name], -order[name]

    actions = dict(plan.actions)
    need = pinned_host_bytes_for(workload, plan)
    for name in sorted(swapped, key=cost_per_byte):
        if need <= limit:
            break
        actions[name] = Action.RECOMPUTE
        need -= -(-workload.size_bytes_of[name] // HOST_SLOT_ALIGN_BYTES) * HOST_SLOT_ALIGN_BYTES
    info = {**plan.info, "host_memory": f"{len(swapped) - sum(a is Action.SWAP for a in actions.values())} swaps "
            f"turned into recomputes to fit {limit} bytes of pinned host memory"}
    return make_plan(workload, actions, policy=plan.policy, budget_bytes=plan.budget_bytes,
                     hardware=hardware, info=info, recompute_regions=plan.recompute_regions)
