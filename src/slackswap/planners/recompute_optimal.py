"""`recompute-optimal`: the fastest recompute-only plan within the budget.

Like PyTorch's activation memory budget (its min-cut partitioner with a 0-1 knapsack):
choose the set of tensors to recompute that takes enough bytes off the peak for the
least rebuild time (selection.knapsack_min_time), sized to the budget by simulating
(selection.fit_need). No copies: a budget it cannot reach raises BudgetError.
"""

from __future__ import annotations

from ..hardware import Hardware
from ..plans import Plan
from ..workload import Workload
from .common import build, facts_for, natural_peak_bytes, policy_cannot_fit
from .search import Search
from .selection import actions_for, fit_need, keep_all_peak_bytes, knapsack_min_time


def plan_recompute_optimal(workload: Workload, hardware: Hardware, budget_bytes: int) -> Plan:
    facts = facts_for(workload)

    def make(need: int) -> Plan | None:
        chosen = knapsack_min_time(facts, facts.candidates, need)
        if chosen is None:
            return None
        return build(workload, hardware, actions_for(recompute=chosen), "recompute-optimal", budget_bytes,
                     info={"rule": "knapsack: least rebuild time for the bytes needed", "need_bytes": need})

    best = fit_need(Search(workload, hardware, budget_bytes, "recompute-optimal"),
                    keep_all_peak_bytes(facts) - budget_bytes, make)
    if best is None:
        everything = build(workload, hardware, actions_for(recompute=facts.candidates), "recompute-optimal",
                           budget_bytes)
        raise policy_cannot_fit("recompute-optimal", budget_bytes, natural_peak_bytes(workload, hardware, everything),
                                "use a larger budget or a policy that swaps")
    return best.plan
