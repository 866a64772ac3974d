"""`recompute-optimal`'s plan holding at most a given number of bytes when the forward pass ends.

recompute-optimal's budget bounds the peak of saved bytes over the whole step; what a compiled graph
holds at the forward/backward boundary is only its kept tensors and step inputs, which is at most that
peak. So the largest budget whose plan holds at most the bytes asked is found by bisection; it is a
start of the mixed search (mixed_held.py) and the benchmark's "recompute-optimal holding torch's bytes".
"""

from __future__ import annotations

from ..errors import BudgetError
from ..hardware import Hardware
from ..plans import Plan
from ..workload import Workload
from .mixed_held import held_bytes as held_bytes_of

HOLDING_STEPS = 10
"""Bisection steps (the budget to 1/1024 of the range searched: a step more changed no plan of
benchmarks/vs_torch_compiled.py's graphs)."""


def recompute_plan_holding(workload: Workload, hardware: Hardware, held_bytes: int) -> Plan | None:
    """recompute-optimal's plan for the largest budget found (HOLDING_STEPS bisection steps between
    the least any plan reaches and the keep-all peak) whose kept tensors and step inputs are at most
    ``held_bytes``; None where no budget tried gives one (a refused budget counts as not holding)."""
    from ..planners import minimum_budget_bytes, plan_workload
    from ..sim import simulate_ideal

    def holding(budget: int) -> tuple[Plan | None, bool]:
        """(the plan if it holds at most held_bytes, whether the planner refused the budget)."""
        try:
            plan = plan_workload(workload, hardware, budget, "recompute-optimal")
        except BudgetError:
            return None, True
        return (plan if held_bytes_of(workload, plan) <= held_bytes else None), False

    low, high = minimum_budget_bytes(workload), simulate_ideal(workload, hardware).peak_memory_bytes
    best, _ = holding(low)
    for _ in range(HOLDING_STEPS):
        middle = (low + high) // 2
        plan, refused = holding(middle)
        if plan is not None or refused:  # refused: recompute-only plans need more; look higher
            best, low = plan or best, middle
        else:
            high = middle
    return best
