"""Exhaustive reference for tiny workloads: the fastest plan over every keep/swap/recompute choice.

Every candidate tensor takes each of the three actions independently (3**n plans); each plan gets
the schedule `make_plan` derives (recompute groups, copies back as late as they can land in time)
and is simulated under the budget. No search heuristic is involved, so this checks what the
`slackswap` planner's search finds, not how it finds it. Only for n <= 8 (6,561 simulations).
"""

from __future__ import annotations

import itertools
import math

from slackswap.errors import InfeasiblePlanError
from slackswap.hardware import Hardware
from slackswap.plans import Action
from slackswap.schedule import make_plan
from slackswap.sim import simulate
from slackswap.workload import Workload

MAX_CANDIDATES = 8
ACTIONS = (Action.KEEP, Action.SWAP, Action.RECOMPUTE)


def candidates(workload: Workload) -> list[str]:
    """Saved tensors with a producer (step inputs can only be kept)."""
    return [t.name for t in workload.saved_tensors if t.producer is not None]


def best_step_time_s(workload: Workload, hardware: Hardware, budget_bytes: int) -> tuple[float, dict[str, Action]]:
    """(fastest simulated step time, its non-keep actions); (inf, {}) when no plan fits."""
    names = candidates(workload)
    if len(names) > MAX_CANDIDATES:
        raise ValueError(f"{len(names)} candidate tensors: brute force is for at most {MAX_CANDIDATES}")
    best: tuple[float, dict[str, Action]] = (math.inf, {})
    for choice in itertools.product(ACTIONS, repeat=len(names)):
        actions = dict(zip(names, choice))
        plan = make_plan(workload, actions, policy="brute-force", budget_bytes=budget_bytes, hardware=hardware)
        try:
            step_s = simulate(workload, hardware, plan, budget_bytes).step_time_s
        except InfeasiblePlanError:
            continue
        if step_s < best[0]:
            best = (step_s, {n: a for n, a in actions.items() if a is not Action.KEEP})
    return best
