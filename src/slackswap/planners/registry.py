"""The policy registry: a new policy is one module with a planner function and one line here."""

from __future__ import annotations

from typing import Callable

from ..errors import UnknownNameError
from ..hardware import Hardware
from ..plans import Plan
from ..workload import Workload
from .capuchin import plan_capuchin
from .full_recompute import plan_full_recompute
from .ideal import plan_ideal
from .optimal import plan_optimal
from .recompute_optimal import plan_recompute_optimal
from .search import shared_simulations
from .selective_recompute import plan_selective_recompute
from .slackswap import plan_slackswap
from .slackswap_paper import plan_slackswap_paper
from .swap_only import plan_swap_only

PlannerFn = Callable[[Workload, Hardware, int], Plan]

PLANNERS: dict[str, PlannerFn] = {
    "ideal": plan_ideal,
    "full-recompute": plan_full_recompute,
    "selective-recompute": plan_selective_recompute,
    "recompute-optimal": plan_recompute_optimal,
    "swap-only": plan_swap_only,
    "capuchin": plan_capuchin,
    "slackswap-paper": plan_slackswap_paper,
    "slackswap": plan_slackswap,
    "optimal": plan_optimal,
}

DEFAULT_POLICY = "slackswap"
HEURISTICS = ("full-recompute", "selective-recompute", "recompute-optimal", "swap-only", "capuchin", "slackswap-paper")
"""Policies `slackswap` must never fall below (everything but ideal, optimal and itself)."""


def get_planner(name: str) -> PlannerFn:
    try:
        return PLANNERS[name]
    except (KeyError, TypeError):
        raise UnknownNameError(f"unknown policy {name!r}: choose one of {', '.join(PLANNERS)}") from None


def plan_workload(workload: Workload, hardware: Hardware, budget_bytes: int, policy: str = DEFAULT_POLICY) -> Plan:
    """Plan ``workload`` with ``policy`` for ``budget_bytes`` of saved activations.

    Raises UnknownNameError for an unknown policy, and BudgetError when the budget is below
    the minimum any plan can reach (minimum.minimum_budget_bytes) or below what this policy
    can reach. On hardware with ``pinned_host_bytes`` the plan swaps at most that much
    (memory/host.py).
    """
    planner = get_planner(policy)
    if policy != "ideal":
        from ..sim import simulate_ideal
        from .minimum import check_budget

        check_budget(workload, budget_bytes, simulate_ideal(workload, hardware).peak_memory_bytes)
    with shared_simulations():
        if hardware.pinned_host_bytes is None:
            return planner(workload, hardware, budget_bytes)
        return _within_host_memory(workload, hardware, budget_bytes, planner(
            workload, hardware.replace(pinned_host_bytes=None), budget_bytes))


def _within_host_memory(workload: Workload, hardware: Hardware, budget_bytes: int, plan: Plan) -> Plan:
    """The policy's plan made to fit the hardware's pinned host memory (memory/host.py), checked
    against the budget; BudgetError when the swaps it had to give up make it too large."""
    from ..errors import BudgetError, InfeasiblePlanError
    from ..memory.host import fit_host_memory
    from ..sim import simulate
    from ..units import format_bytes

    fitted = fit_host_memory(workload, hardware, plan)
    if fitted is plan:
        return plan
    try:
        simulate(workload, hardware, fitted, budget_bytes, check=False)
    except InfeasiblePlanError as exc:
        raise BudgetError(
            f"{plan.policy} cannot fit {format_bytes(budget_bytes)} ({budget_bytes} bytes) of activations with at "
            f"most {format_bytes(hardware.pinned_host_bytes)} of pinned host memory for swaps (recomputing instead "
            f"needs {format_bytes(exc.needed_bytes)}): raise the budget or hardware.pinned_host_bytes",
        ) from None
    return fitted
