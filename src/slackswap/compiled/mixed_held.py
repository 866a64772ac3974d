"""The fastest plan in the simulator, swaps and recomputes mixed, that holds at most a budget when the
forward pass ends: the compiled path's ``objective="mixed"``.

A swapped tensor's host copy is not held on the device at the forward/backward boundary, so turning a
recomputed tensor into a swapped one costs no bytes held there, only copy time the simulator may hide
behind compute, as long as the copy out is done by the end of the forward pass (a plan whose copy
out ends later holds those bytes there and is not taken). The search is a descent from given recompute-only plans that fit the budget (the
fewest-FLOPs plan, PyTorch's own plan where the partitioner knows it, and recompute-optimal's plan for
the largest budget holding at most the bytes, recompute_holding.py): pass over the candidates,
trying for each the other actions (a recomputed or swapped tensor kept only where the bytes held still
fit), and take a change only where the simulated step gets shorter; stop when a pass changes nothing.
Each start plan is itself a candidate result, so the plan returned simulates at least as fast as every
start that fits.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from ..errors import BudgetError
from ..hardware import Hardware
from ..plans import Action, Plan
from ..schedule import make_plan
from ..sim import simulate
from ..workload import Workload

POLICY = "mixed-held"
MAX_PASSES = 4
"""Passes over the candidates per start (the graphs of benchmarks/vs_torch_budget.py settle in at most
three)."""


def held_bytes(workload: Workload, plan: Plan) -> int:
    """What ``plan`` holds when the forward pass ends: its kept tensors and the step inputs."""
    return sum(t.size_bytes for t in workload.saved_tensors
               if t.producer is None or plan.actions.get(t.name) is Action.KEEP)


def mixed_held_plan(workload: Workload, hardware: Hardware, held_budget_bytes: int, starts: Sequence[Plan]) -> Plan:
    """The fastest plan found (simulated step time on ``hardware``) that holds at most
    ``held_budget_bytes`` when the forward pass ends, descending from each of ``starts`` that fits."""
    fitting = [p for p in starts if held_bytes(workload, p) <= held_budget_bytes]
    if not fitting:
        raise BudgetError(f"no start plan of {workload.name!r} holds at most {held_budget_bytes} bytes when the forward "
                          "pass ends: give a larger budget")
    best_plan, best_s = None, None
    for start in fitting:
        for plan, step_s in ((start, _step_s(workload, hardware, start)),
                             _descend(workload, hardware, start, held_budget_bytes)):
            if best_s is None or step_s < best_s:
                best_plan, best_s = plan, step_s
    info = dict(best_plan.info)
    info.update(objective="mixed", held_budget_bytes=held_budget_bytes, held_bytes=held_bytes(workload, best_plan),
                start_policy=best_plan.policy if best_plan.policy != POLICY else info.get("start_policy"),
                simulated_step_time_s=best_s)
    # The plan simulated, schedule and all, under this objective's name.
    return dataclasses.replace(best_plan, policy=POLICY, budget_bytes=None, info=info)


def _step_s(workload: Workload, hardware: Hardware, plan: Plan) -> float:
    """The simulated step time, or infinity where a swapped tensor is still on the device when the
    forward pass ends (its copy out not done: the simulator then reads the device copy in backward
    and copies nothing back, but the bytes are held at the boundary)."""
    records: list = []
    timeline = simulate(workload, hardware, plan, check=False, event_records=records)
    forward_end_s = max((end for _, kind, _, _, end, _, _ in records if kind == "forward"), default=0.0)
    if any(kind == "copy_out" and end > forward_end_s for _, kind, _, _, end, _, _ in records):
        return math.inf
    return timeline.step_time_s


def _descend(workload: Workload, hardware: Hardware, start: Plan, held_budget_bytes: int) -> tuple[Plan, float]:
    candidates = [t for t in workload.saved_tensors if t.producer is not None]
    actions = {t.name: start.actions.get(t.name, Action.KEEP) for t in candidates}
    room = held_budget_bytes - held_bytes(workload, start)
    plan = make_plan(workload, actions, policy=POLICY, budget_bytes=None, hardware=hardware,
                     info={"start_policy": start.policy})
    step_s = _step_s(workload, hardware, plan)
    for _ in range(MAX_PASSES):
        changed = False
        for t in candidates:
            now = actions[t.name]
            tries = [a for a in (Action.SWAP, Action.RECOMPUTE, Action.KEEP) if a is not now]
            for action in tries:
                freed = (t.size_bytes if now is Action.KEEP else 0) - (t.size_bytes if action is Action.KEEP else 0)
                if room + freed < 0:
                    continue
                trial = dict(actions, **{t.name: action})
                trial_plan = make_plan(workload, trial, policy=POLICY, budget_bytes=None, hardware=hardware,
                                       info={"start_policy": start.policy})
                trial_s = _step_s(workload, hardware, trial_plan)
                if trial_s < step_s:
                    actions, plan, step_s, room, now, changed = trial, trial_plan, trial_s, room + freed, action, True
        if not changed:
            break
    return plan, step_s
