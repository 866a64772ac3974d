"""The simulator-driven repair loop of `slackswap` (rule 7 in slackswap.py).

Each round reads the current plan's simulated timeline, proposes a few single changes
where the timeline points, and simulates them in turn; the first that makes the step
faster is kept and the next round starts from it. A "change" moves one producer's tensors (all outputs of one op that share an
action) from one action to another, since re-running an op rebuilds all its outputs:

- a swap whose copy back made backward wait, or whose copy out was still running when
  the forward pass waited for memory, becomes a recompute (or a keep, if memory allows);
- a recompute becomes a swap when its copies fit the link's free windows (copies.py);
- a recompute becomes a keep if it is among the costliest to rebuild, and a recompute or
  swap becomes a keep if backward needs it among the first (it is on the device when
  backward starts anyway, so keeping it may cost no peak memory), and the earliest-made
  recomputes become keeps (they are rebuilt last in backward, when memory has been freed,
  so the budget may have room for them).

When the planning call grants a wide search (``Search.wide_left``, slackswap.py), a round
whose proposals all fail goes on to a polish: every change of one producer's tensors to another
action, then of one tensor, then of two tensors at once, until one is better or the allowance
runs out. Small workloads get this wider search; large ones, whose simulations cost more, get
none.

Between equally fast plans the one with less recompute, then fewer bytes copied, counts as
better (``rank``). The loop ends when no proposed change makes the plan better, or after
``max_simulations`` simulations (a bound on planning time).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from ..plans import Action
from ..workload import Workload
from .common import Candidate
from .copies import WindowBooking
from .search import Search
from .selection import op_items

PROPOSALS_PER_KIND = 3


@dataclass
class RepairResult:
    best: Candidate
    moves: list[str] = field(default_factory=list)
    simulations: int = 0


def _item(workload: Workload, actions, name: str) -> tuple[str, ...]:
    """``name`` and its siblings (outputs of the same op) that currently share its action."""
    op = workload.ops[workload.op_index[workload.tensor_by_name[name].producer]]
    return tuple(o for o in op.outputs if actions.get(o) is actions[name])


def _propose(search: Search, current: Candidate, allow_swaps: bool = True):
    workload, facts = search.workload, search.facts
    actions = current.plan.actions
    timeline = current.timeline
    swapped = [n for n in facts.candidates if actions[n] is Action.SWAP]
    recomputed = [n for n in facts.candidates if actions[n] is Action.RECOMPUTE]
    headroom = search.budget_bytes - timeline.peak_memory_bytes if timeline.stall_memory_s == 0 else 0
    proposals: list[tuple[str, tuple[str, ...], Action]] = []
    seen: set[tuple[str, ...]] = set()

    def add(names: tuple[str, ...], action: Action, why: str) -> None:
        if names and (names, action) not in seen:
            seen.add((names, action))
            proposals.append((why, names, action))

    # Swaps to blame for stalls: copies back that backward waited for, copies out in flight
    # while compute waited for memory.
    blame: dict[str, float] = {}
    events = current.events_of_kinds(("stall_copy", "stall_memory", "copy_out", "copy_in"))
    copy_out = [e for e in events if e.kind == "copy_out"]
    copy_in = [e for e in events if e.kind == "copy_in"]
    for e in events:
        if e.kind == "stall_copy":
            op = workload.ops[workload.op_index[e.name]]
            reads = workload.bwd_reads[op.name] if e.step >= 0 else ()
            for n in reads + op.inputs:
                if actions.get(n) is Action.SWAP:
                    blame[n] = blame.get(n, 0.0) + e.duration_s
            # The copy waited for may sit behind others on the in-order stream.
            for c in copy_in:
                if c.start_s < e.end_s and c.end_s > e.start_s:
                    blame[c.name] = blame.get(c.name, 0.0) + min(c.end_s, e.end_s) - max(c.start_s, e.start_s)
        elif e.kind == "stall_memory":
            for c in copy_out:
                if c.start_s < e.end_s and c.end_s > e.start_s:
                    blame[c.name] = blame.get(c.name, 0.0) + min(c.end_s, e.end_s) - max(c.start_s, e.start_s)
    order = {n: i for i, n in enumerate(facts.candidates)}
    for name in sorted(blame, key=lambda n: (-blame[n], order[n]))[:PROPOSALS_PER_KIND]:
        item = _item(workload, actions, name)
        add(item, Action.RECOMPUTE, "stalling swap -> recompute")
        if sum(facts.size[n] for n in item) <= headroom:
            add(item, Action.KEEP, "stalling swap -> keep")
    # Copies back that wait for memory: take one more op's tensors off (cheapest rebuild per
    # byte) to give them room.
    if timeline.stall_copy_s > 0:
        kept = [n for n in facts.candidates if actions[n] is Action.KEEP]
        kept.sort(key=lambda n: (facts.rebuild_time_s[n] / facts.size[n], order[n]))
        for name in kept[:PROPOSALS_PER_KIND]:
            add(_item(workload, actions, name), Action.RECOMPUTE, "keep -> recompute (room for copies back)")
    # Recomputes the link has room for, costliest rebuild first; then the same letting the copy
    # out run into backward (the copy back must still land in time): the tensor then leaves
    # after the peak, which backward's frees may absorb.
    booking = WindowBooking(facts, search.hardware, swapped)
    by_cost = sorted(recomputed, key=lambda n: (-facts.rebuild_time_s[n], order[n]))
    for deadline, why in ((facts.forward_time_s, "link has room"), (None, "copy out spills into backward")) \
            if allow_swaps else ():
        count = 0
        for name in by_cost:
            if count >= PROPOSALS_PER_KIND:
                break
            if booking.fits(name, out_deadline_s=deadline):
                add(_item(workload, actions, name), Action.SWAP, f"recompute -> swap ({why})")
                count += 1
    # Keeps: the costliest rebuilds, and the tensors backward needs soonest (kept or not,
    # they are on the device at the start of backward, so keeping them may not raise the peak).
    by_use = sorted(recomputed + swapped, key=lambda n: (facts.first_use_s[n], order[n]))
    earliest = sorted(recomputed, key=order.__getitem__)
    for name in by_cost[:PROPOSALS_PER_KIND] + by_use[:PROPOSALS_PER_KIND] + earliest[:PROPOSALS_PER_KIND]:
        add(_item(workload, actions, name), Action.KEEP, f"{actions[name].value} -> keep")
    return proposals


def rank(candidate: Candidate) -> tuple[float, float, int]:
    """What the loop minimizes: the step time, then, between equally fast plans, the recompute
    time and the bytes copied out. A move that keeps the step time but does less extra work is
    taken: its timeline has slack the next move can use (a keep that pays off only once another
    recompute is gone), and the order is strict, so the loop cannot cycle."""
    t = candidate.timeline
    return (t.step_time_s, t.recompute_time_s, t.d2h_bytes)


MAX_SIMULATIONS = 64  # per repair call: a bound on planning time


def repair(search: Search, start: Candidate, *, max_simulations: int = MAX_SIMULATIONS,
           allow_swaps: bool = True, wide: bool = False) -> RepairResult:
    """Improve ``start`` one simulated change at a time. Without ``allow_swaps`` no change adds a
    swap, so a recompute-only start stays recompute-only: every plan simulated then makes no
    copy, and the whole trajectory (and its result) is the same on every link. With ``wide``, a
    round whose proposals all fail polishes (module docstring), drawing on ``search.wide_left``.
    The caller decides what ``simulations`` (the proposals tried) are charged to."""
    result = RepairResult(best=start)
    while result.simulations < max_simulations:
        current = result.best
        winner: Candidate | None = None
        winner_why = ""
        for why, names, action in _propose(search, current, allow_swaps):
            if result.simulations >= max_simulations:
                break
            actions = dict(current.plan.actions)
            actions.update({n: action for n in names})
            # A proposal whose step cannot be as fast as the current one cannot rank better: it is
            # counted as tried but not simulated (Search.evaluate's cutoff).
            cand = search.try_actions(actions, cutoff_s=current.step_time_s)
            result.simulations += 1
            if cand.fits and rank(cand) < rank(current):
                winner, winner_why = cand, f"{why}: {', '.join(names)}"
                break  # first improvement: re-read the new timeline before proposing more
        if winner is None and wide and search.wide_left > 0:
            winner, winner_why = _polish(search, current, allow_swaps)
        if winner is None:
            break
        result.best = winner
        result.moves.append(winner_why)
    return result


def _single_changes(facts, actions, allow_swaps: bool):
    """Every change of one producer's tensors (together), then of one tensor, to another action."""
    choices = (Action.KEEP, Action.SWAP, Action.RECOMPUTE) if allow_swaps else (Action.KEEP, Action.RECOMPUTE)
    groups = [g for g in op_items(facts, facts.candidates) if len(g) > 1] + [(n,) for n in facts.candidates]
    for names in groups:
        for action in choices:
            if any(actions[n] is not action for n in names):
                yield names, action


def _polish(search: Search, current: Candidate, allow_swaps: bool):
    """The first change better than ``current`` among all single changes, then all pairs of
    one-tensor changes; each plan tried costs one simulation of the wide search's allowance."""
    facts = search.facts
    actions = current.plan.actions
    singles = list(_single_changes(facts, actions, allow_swaps))
    tensor_moves = [(names[0], action) for names, action in singles if len(names) == 1]
    pairs = ({a[0]: a[1], b[0]: b[1]} for i, a in enumerate(tensor_moves) for b in tensor_moves[i + 1:]
             if a[0] != b[0])
    changes = [{n: action for n in names} for names, action in singles]
    tried: set[tuple] = set()
    for change in itertools.chain(changes, pairs):
        changed = dict(actions)
        changed.update(change)
        key = tuple(changed.values())
        if key in tried:
            continue
        tried.add(key)
        if search.wide_left <= 0:
            return None, ""
        cand = search.try_actions(changed, cutoff_s=current.step_time_s)
        search.wide_left -= 1
        if cand.fits and rank(cand) < rank(current):
            moves = ", ".join(f"{n} -> {a.value}" for n, a in change.items())
            return cand, f"polish: {moves}"
    return None, ""

