"""`capuchin`: swap while the copy hides, otherwise recompute by memory saved per second.

After Capuchin (Peng et al., ASPLOS'20), planned ahead from the profile instead of at
run time: walk the tensors in the order the forward pass makes them and swap each one
whose copy out still ends before the forward pass does and whose copy back can still
land before its first use (copies.py), until enough bytes are off. Then recompute the
rest by memory saving per second of recompute (MSPS), highest first, sized to the
budget with the simulator.

When even recomputing everything that is not swapped cannot reach the budget (rebuilt
tensors come back in backward, and a recompute group holds all it re-creates at once),
Capuchin falls back to swapping more, stalls and all, as it does at run time when memory
runs out: the hidden swaps stay, and the first k of the other tensors in production
order are swapped instead of recomputed, with the least k that runs within the budget
(binary search). All of them swapped, copied back just in time, is the lowest-memory
plan (minimum.py), so the policy reaches every budget down to the minimum.
"""

from __future__ import annotations

from ..hardware import Hardware
from ..plans import Plan
from ..workload import Workload
from .common import build, evaluate, facts_for, fewest_that_fit, just_in_time_prefetch, policy_cannot_fit
from .copies import d2h_time_s, h2d_hidden
from .minimum import minimum_budget_bytes
from .search import Search
from .selection import actions_for, cheapest_per_byte, fit_need, keep_all_peak_bytes

POLICY = "capuchin"


def hidden_swaps(facts, hardware: Hardware, need: int) -> list[str]:
    """Tensors in production order whose copies hide, until ``need`` bytes are off."""
    swapped: list[str] = []
    off = 0
    link_free_s = 0.0
    for name in facts.candidates:
        if off >= need:
            break
        end = max(link_free_s, facts.produced_at_s[name]) + d2h_time_s(hardware, facts.size[name])
        if end <= facts.forward_time_s and h2d_hidden(facts, hardware, swapped + [name]):
            swapped.append(name)
            off += facts.size[name]
            link_free_s = end
    return swapped


def plan_capuchin(workload: Workload, hardware: Hardware, budget_bytes: int) -> Plan:
    facts = facts_for(workload)

    def make(need: int) -> Plan:
        swapped = hidden_swaps(facts, hardware, need)
        off = sum(facts.size[n] for n in swapped)
        taken = set(swapped)
        rest = [n for n in facts.candidates if n not in taken]
        recompute = cheapest_per_byte(facts, rest, need - off)
        return build(workload, hardware, actions_for(swapped, recompute), POLICY, budget_bytes,
                     info={"rule": "swap in forward order while hidden, then recompute by MSPS", "need_bytes": need})

    best = fit_need(Search(workload, hardware, budget_bytes, POLICY), keep_all_peak_bytes(facts) - budget_bytes,
                    make, allow_memory_stalls=True)
    if best is not None:
        return best.plan
    return _swap_more(workload, hardware, budget_bytes)


def _swap_more(workload: Workload, hardware: Hardware, budget_bytes: int) -> Plan:
    """Fallback: the hidden swaps, plus the first k other tensors swapped (stalling), the rest recomputed."""
    facts = facts_for(workload)
    hidden = hidden_swaps(facts, hardware, keep_all_peak_bytes(facts))
    taken = set(hidden)
    others = [n for n in facts.candidates if n not in taken]

    def plan_with(k: int, just_in_time: bool = False) -> Plan:
        actions = actions_for(hidden + others[:k], others[k:])
        prefetch = just_in_time_prefetch(workload, actions) if just_in_time else None
        return build(workload, hardware, actions, POLICY, budget_bytes, prefetch_step=prefetch,
                     info={"rule": "recompute alone cannot reach the budget: swap more in forward order, stalls "
                                   "and all", "extra_swaps": k})

    if not evaluate(workload, hardware, plan_with(len(others)), budget_bytes).fits:
        last = plan_with(len(others), just_in_time=True)
        if evaluate(workload, hardware, last, budget_bytes).fits:
            return last
        raise policy_cannot_fit(POLICY, budget_bytes, minimum_budget_bytes(workload), "raise the budget")
    return fewest_that_fit(workload, hardware, budget_bytes, plan_with, len(others))
