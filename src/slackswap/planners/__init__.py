"""Planners: a policy turns (workload, hardware, budget) into a Plan.

``PLANNERS`` maps each policy name to its planner function; ``plan_workload`` checks the
budget and plans. docs/planners.md describes every policy.
"""

from .minimum import lowest_memory_plan, minimum_budget_bytes
from .registry import DEFAULT_POLICY, HEURISTICS, PLANNERS, PlannerFn, get_planner, plan_workload

__all__ = [
    "DEFAULT_POLICY", "HEURISTICS", "PLANNERS", "PlannerFn", "get_planner", "lowest_memory_plan",
    "minimum_budget_bytes", "plan_workload",
]
