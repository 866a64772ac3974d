"""`recompute-optimal`: the fastest recompute-only plan it finds within the budget.

Like PyTorch's activation memory budget (its min-cut partitioner with a 0-1 knapsack): choose
the set of tensors to recompute that takes enough bytes off the peak for the least rebuild time
(selection.knapsack_min_time), sized to the budget by simulating (selection.fit_need). The
knapsack counts each tensor's bytes once, but a rebuild in backward holds its whole group, so
its sets can peak above the budget where a layer-wise plan fits. The layer-wise plans of
`full-recompute` and `selective-recompute` are candidates too, and when no knapsack set fits, a
peak descent from recomputing everything (selection.recompute_peak_descent); the fastest that
fits is the plan, so the policy never refuses a budget either layer-wise policy meets. No
copies: a budget it cannot reach raises BudgetError with the lowest peak any plan it tried
reached (docs/planners.md, `recompute-optimal`).
"""

from __future__ import annotations

import math

from ..errors import BudgetError
from ..hardware import Hardware
from ..plans import Plan
from ..workload import Workload
from .common import Candidate, block_layers, policy_cannot_fit, with_info
from .full_recompute import block_recompute_actions
from .recompute_space import frontier_descent, recompute_lower_bound_s
from .repair import rank
from .search import Search
from .selection import actions_for, fit_need, keep_all_peak_bytes, knapsack_min_time, recompute_peak_descent
from .selective_recompute import core_attention_actions, plan_selective_recompute

POLICY = "recompute-optimal"
FRONTIER_DESCENT_MAX_OPS = 200
"""Workloads this small (the 2-layer profiled models have 92-178 ops) always get the frontier
descent as a candidate; larger ones only when nothing else fits."""


def layer_wise_candidates(search: Search) -> list[Candidate]:
    """The layer-wise recompute plans that fit the budget: every block checkpointed (what
    `full-recompute` does), that plus the attention cores (`selective-recompute`'s far end), and
    `selective-recompute`'s own plan where it reaches the budget. Each is simulated without a
    limit too, so that an error can report the lowest peak among them."""
    workload = search.workload
    every_block = block_recompute_actions(workload, set(block_layers(workload)))
    with_cores = {**core_attention_actions(workload), **every_block}
    labelled = [(every_block, "full-recompute"), (with_cores, "selective-recompute, every block")]
    try:
        selective = plan_selective_recompute(workload, search.hardware, search.budget_bytes)
        labelled.append((selective.actions, "selective-recompute"))
    except BudgetError:
        pass
    found = []
    for actions, label in labelled:
        plan = search.plan(actions, info={"rule": f"the layer-wise plan of {label}"})
        search.evaluate(plan, unlimited=True)
        cand = search.evaluate(plan)
        if cand.fits:
            found.append(cand)
    return found


def plan_recompute_optimal(workload: Workload, hardware: Hardware, budget_bytes: int) -> Plan:
    search = Search(workload, hardware, budget_bytes, POLICY)
    facts = search.facts

    def make(need: int) -> Plan | None:
        chosen = knapsack_min_time(facts, facts.candidates, need)
        if chosen is None:
            return None
        return search.plan(actions_for(recompute=chosen),
                           info={"rule": "knapsack: least rebuild time for the bytes needed", "need_bytes": need})

    sized = fit_need(search, keep_all_peak_bytes(facts) - budget_bytes, make)
    found = [sized] if sized is not None else []
    if sized is None:
        descent = recompute_peak_descent(search)
        if descent is not None:
            found.append(Candidate(search.plan(descent.plan.actions, info={"rule": "peak descent"}),
                                   descent.timeline))
    found += layer_wise_candidates(search)
    if not found or len(workload.ops) <= FRONTIER_DESCENT_MAX_OPS:
        # Search the recompute space by its groups' real peaks (recompute_space.frontier_descent):
        # when every plan above rebuilds in groups that peak over the budget, and always on small
        # workloads, where it costs a second or less and finds faster plans than the knapsack.
        chosen, lowest_peak = frontier_descent(facts, budget_bytes)
        if search.least_peak_bytes is None or lowest_peak < search.least_peak_bytes:
            search.least_peak_bytes = lowest_peak
        if chosen is not None:
            cand = search.evaluate(search.plan(actions_for(recompute=chosen),
                                               info={"rule": "frontier descent over the recompute groups' peaks"}))
            if cand.fits:
                found.append(cand)
    if not found:
        everything = search.plan(actions_for(recompute=facts.candidates))
        search.evaluate(everything, unlimited=True)
        raise policy_cannot_fit(POLICY, budget_bytes, search.least_peak_bytes,
                                "the lowest peak of the recompute-only plans it tried: use a larger budget or "
                                "a policy that swaps")
    best = min(found, key=rank).plan
    bound_s = recompute_lower_bound_s(facts, budget_bytes)
    if math.isinf(bound_s):  # cannot happen with a plan that fits; no JSON infinity either way
        return best
    return with_info(best, recompute_lower_bound_s=bound_s,
                     recompute_bound_step_time_s=workload.ideal_step_time_s + bound_s)
