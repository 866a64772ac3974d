"""`swap-only`: vDNN-style offload. Swap tensors in forward order until the plan fits.

No recompute: copies that the compute cannot hide show up as stalls. The fewest leading
tensors (in production order) whose plan completes within the budget are swapped,
found by binary search; copies back are issued as late as they can land in time
(schedule.prefetch_alap). Swapping everything with copies back just in time is the
lowest-memory plan (minimum.py), so this policy reaches every budget down to the minimum.
"""

from __future__ import annotations

from ..hardware import Hardware
from ..plans import Plan
from ..workload import Workload
from .common import build, evaluate, facts_for, fewest_that_fit, just_in_time_prefetch, policy_cannot_fit
from .minimum import minimum_budget_bytes
from .selection import actions_for


def plan_swap_only(workload: Workload, hardware: Hardware, budget_bytes: int) -> Plan:
    facts = facts_for(workload)
    names = facts.candidates

    def plan_with(k: int, just_in_time: bool = False) -> Plan:
        actions = actions_for(swap=names[:k])
        prefetch = just_in_time_prefetch(workload, actions) if just_in_time else None
        return build(workload, hardware, actions, "swap-only", budget_bytes, prefetch_step=prefetch,
                     info={"rule": "swap in forward order until it fits", "swapped": k})

    if not evaluate(workload, hardware, plan_with(len(names)), budget_bytes).fits:
        last = plan_with(len(names), just_in_time=True)
        if evaluate(workload, hardware, last, budget_bytes).fits:
            return last
        raise policy_cannot_fit("swap-only", budget_bytes, minimum_budget_bytes(workload), "raise the budget")
    return fewest_that_fit(workload, hardware, budget_bytes, plan_with, len(names))
