"""`slackswap-paper`: SlackSwap as the paper describes it.

1. Profile the step: the swap budget is the transfer time compute can hide, one global
   figure: the forward time (copies out overlap the forward pass; copies back have the
   longer backward pass). In bytes: forward time x D2H bandwidth.
2. Within it, swap the tensors most expensive to rebuild, by rebuild time per byte
   (counting every producer that must re-run, common.Facts.rebuild_ops).
3. Recompute the others, cheapest per byte first, until the activation budget is met
   (sized with the simulator); keep the rest.
"""

from __future__ import annotations

from ..hardware import Hardware
from ..plans import Plan
from ..workload import Workload
from .common import build, facts_for, natural_peak_bytes, policy_cannot_fit
from .search import Search
from .selection import actions_for, cheapest_per_byte, fit_need, keep_all_peak_bytes, remembered_plan


def plan_slackswap_paper(workload: Workload, hardware: Hardware, budget_bytes: int) -> Plan:
    """The paper's plan, remembered per workload, link and budget: `slackswap` asks for it twice
    in one call (as a start, rule 6, and to compare with, rule 11)."""
    return remembered_plan("slackswap-paper", paper_plan, workload, hardware, budget_bytes)


def paper_plan(workload: Workload, hardware: Hardware, budget_bytes: int) -> Plan:
    facts = facts_for(workload)
    slack_s = facts.forward_time_s
    order = {n: i for i, n in enumerate(facts.candidates)}
    by_value = sorted(facts.candidates, key=lambda n: (-facts.rebuild_time_s[n] / facts.size[n], order[n]))

    def make(need: int) -> Plan:
        swapped: list[str] = []
        off = 0
        used_s = 0.0
        for name in by_value:
            if off >= need:
                break
            transfer_s = facts.size[name] / hardware.d2h_bytes_per_s
            if used_s + transfer_s <= slack_s:
                swapped.append(name)
                off += facts.size[name]
                used_s += transfer_s
        taken = set(swapped)
        rest = [n for n in facts.candidates if n not in taken]
        recompute = cheapest_per_byte(facts, rest, need - off)
        return build(workload, hardware, actions_for(swapped, recompute), "slackswap-paper", budget_bytes,
                     info={"rule": "swap the costliest to rebuild within the global slack, recompute the cheapest",
                           "slack_s": slack_s, "need_bytes": need})

    search = Search(workload, hardware, budget_bytes, "slackswap-paper")
    best = fit_need(search, keep_all_peak_bytes(facts) - budget_bytes, make, allow_memory_stalls=True)
    if best is None:
        plan = make(keep_all_peak_bytes(facts))
        raise policy_cannot_fit("slackswap-paper", budget_bytes, natural_peak_bytes(workload, hardware, plan),
                                "use a larger budget or swap-only")
    return best.plan
