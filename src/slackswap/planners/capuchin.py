"""`capuchin`: swap while the copy hides, otherwise recompute by memory saved per second.

After Capuchin (Peng et al., ASPLOS'20), planned ahead from the profile instead of at
run time: walk the tensors in the order the forward pass makes them and swap each one
whose copy out still ends before the forward pass does and whose copy back can still
land before its first use (copies.py), until enough bytes are off. Then recompute the
rest by memory saving per second of recompute (MSPS), highest first, sized to the
budget with the simulator.
"""

from __future__ import annotations

from ..hardware import Hardware
from ..plans import Plan
from ..workload import Workload
from .common import build, facts_for, natural_peak_bytes, policy_cannot_fit
from .copies import d2h_time_s, h2d_hidden
from .selection import actions_for, cheapest_per_byte, fit_need, keep_all_peak_bytes


def plan_capuchin(workload: Workload, hardware: Hardware, budget_bytes: int) -> Plan:
    facts = facts_for(workload)

    def make(need: int) -> Plan:
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
        taken = set(swapped)
        rest = [n for n in facts.candidates if n not in taken]
        recompute = cheapest_per_byte(facts, rest, need - off)
        return build(workload, hardware, actions_for(swapped, recompute), "capuchin", budget_bytes,
                     info={"rule": "swap in forward order while hidden, then recompute by MSPS", "need_bytes": need})

    best = fit_need(workload, hardware, budget_bytes, keep_all_peak_bytes(facts) - budget_bytes, make,
                    allow_memory_stalls=True)
    if best is None:
        plan = make(keep_all_peak_bytes(facts))
        raise policy_cannot_fit("capuchin", budget_bytes, natural_peak_bytes(workload, hardware, plan),
                                "use a larger budget or swap-only")
    return best.plan
