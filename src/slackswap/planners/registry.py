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
    can reach.
    """
    planner = get_planner(policy)
    if policy != "ideal":
        from ..sim import simulate_ideal
        from .minimum import check_budget

        check_budget(workload, budget_bytes, simulate_ideal(workload, hardware).peak_memory_bytes)
    return planner(workload, hardware, budget_bytes)
