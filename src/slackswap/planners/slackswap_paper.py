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
from .search import Search, recompute_step_floor
from .selection import actions_for, cheapest_per_byte, fit_need, keep_all_peak_bytes, remembered_plan


def plan_slackswap_paper(workload: Workload, hardware: Hardware, budget_bytes: int) -> Plan:
    """The paper's plan, remembered per workload, link and budget: `slackswap` asks for it twice
    in one call (as a start, rule 6, and to compare with, rule 11)."""
    return remembered_plan("slackswap-paper", paper_plan, workload, hardware, budget_bytes)


def paper_plan(workload: Workload, hardware: Hardware, budget_bytes: int, *, beat_s: float | None = None) -> Plan | None:
    """The paper's plan; with ``beat_s``, None unless it runs in at most ``beat_s`` (then it is the
    same plan: selection.fit_need)."""
    facts = facts_for(workload)
    slack_s = facts.forward_time_s
    order = {n: i for i, n in enumerate(facts.candidates)}
    by_value = sorted(facts.candidates, key=lambda n: (-facts.rebuild_time_s[n] / facts.size[n], order[n]))

    def swaps_for(need: int) -> tuple[list[str], int]:
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
        return swapped, off

    def make(need: int) -> Plan:
        swapped, off = swaps_for(need)
        taken = set(swapped)
        rest = [n for n in facts.candidates if n not in taken]
        recompute = cheapest_per_byte(facts, rest, need - off)
        return build(workload, hardware, actions_for(swapped, recompute), "slackswap-paper", budget_bytes,
                     info={"rule": "swap the costliest to rebuild within the global slack, recompute the cheapest",
                           "slack_s": slack_s, "need_bytes": need})

    search = Search(workload, hardware, budget_bytes, "slackswap-paper")
    # Past the bytes of every swap within the slack, every plan swaps them all (the scan of make
    # runs to the end) and recomputes the rest of the need: search.recompute_step_floor bounds it.
    swapped, off = swaps_for(keep_all_peak_bytes(facts) + 1)
    taken = set(swapped)
    floor = recompute_step_floor(search, off, [n for n in facts.candidates if n not in taken])
    best = fit_need(search, keep_all_peak_bytes(facts) - budget_bytes, make, allow_memory_stalls=True,
                    step_floor_from=floor, beat_s=beat_s)
    if best is None and beat_s is not None:
        return None
    if best is None:
        plan = make(keep_all_peak_bytes(facts))
        raise policy_cannot_fit("slackswap-paper", budget_bytes, natural_peak_bytes(workload, hardware, plan),
                                "use a larger budget or swap-only")
    return best.plan
