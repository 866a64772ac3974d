"""The recompute space: plans that only keep or recompute, evaluated without the event simulator.

Without copies nothing waits on a link, so a recompute-only plan's memory follows its task order
alone: the forward pass allocates each op's saved outputs and frees a recomputed tensor after its
last forward use; each backward step first runs its recompute group (schedule.derive_recompute_groups:
a missing tensor is rebuilt from the nearest tensors still on the device, through every producer
in between, across the loss head, in-place chains and attention probabilities alike), holding
every output the group re-creates until the group ends, then frees what its backward read last.
``recompute_only_run`` replays exactly the simulator's memory rules for such a plan (tested against
it), in a fraction of a simulation's time, so a search can afford a few thousand of them.

``frontier_descent`` is that search, the min-cut partitioner's question asked of the simulator's
own groups: from recomputing everything (one group re-runs the whole forward pass), keep the op
whose tensors lower the peak most, until the peak is within the budget; then, while it stays
within it, keep the op whose tensors save the most rebuild time. Every group is sized by what it
holds at its peak in backward, the knapsack's blind spot. It is a greedy search, not an optimum:
``recompute_lower_bound_s`` states how far from one its plan can be.

What a rebuild costs is the search's ``objective``: ``"time"`` (the default, what
`recompute-optimal` uses) adds the profile's forward time of every op re-run, so the plan is the
fastest it finds; ``"flops"`` adds their forward FLOPs first, time breaking ties, which is what
PyTorch's activation memory budget minimizes (its knapsack's runtime estimator defaults to FLOPs,
with pointwise ops at one). The two differ where a matmul is no slower than the pointwise ops it
would spare, as on small models under a roofline (docs/planners.md, "Beside PyTorch's partitioner").
"""

from __future__ import annotations

import math
import random
from typing import Iterable

from .common import Facts
from .selection import op_items

OBJECTIVES = ("time", "flops")

DESCENT_OP_EVALUATIONS = 300_000
"""A search's replays times the workload's op count: a replay's cost grows with the ops, so this
buys about 2,000 replays on the 2-layer profiled models (92-178 ops; a descent and its polish
took 400-1,500 there) and a bounded few hundred on models with thousands of ops."""

WANDER_OP_EVALUATIONS = 400_000
WANDER_MAX_REPLAYS = 2_500
"""The wander (_Descent.wander) runs only when the descent and the ascent both stall over the
budget, and spends all it may when no plan fits: the same measure as DESCENT_OP_EVALUATIONS, and
at most WANDER_MAX_REPLAYS replays on small workloads (about 2,300 on the 2-layer profiled models,
1-2 s there)."""

WANDER_KICK = 3
"""Items the wander flips at random in its best set before climbing again: on the 2-layer
profiled models, 3 reached lower peaks than restarting from a fresh random set (at 3 seeds each)."""


class RecomputeReplay:
    """A workload's recompute-only plans replayed by tensor and op numbers (built once per search):
    the groups of schedule.derive_recompute_groups and the memory rules of the simulator, in one
    pass over the step."""

    def __init__(self, facts: Facts, objective: str = "time") -> None:
        w = facts.workload
        self.facts = facts
        number = {t.name: i for i, t in enumerate(w.tensors)}
        self.number = number
        self.size = [t.size_bytes for t in w.tensors]
        self.producer = [w.op_index[t.producer] if t.producer is not None else -1 for t in w.tensors]
        self.inputs = [[number[n] for n in op.inputs] for op in w.ops]
        self.outputs = [[number[n] for n in op.outputs] for op in w.ops]
        self.saved_outputs = [[number[n] for n in names] for names in w.saved_outputs]
        self.fwd_frees = [[number[n] for n in names] for names in w.last_fwd_use_of_saved]
        self.bwd_frees = [[number[n] for n in names] for names in w.last_bwd_read_of]
        self.bwd_reads = [[number[n] for n in w.bwd_reads[op.name]] for op in w.ops]
        self.last_reader = [w.last_bwd_reader.get(t.name, -1) for t in w.tensors]
        self.op_cost = op_costs(w, objective)
        self.step_inputs = [number[t.name] for t in w.tensors if t.producer is None]
        self.input_bytes = facts.input_bytes

    def run(self, recomputed: Iterable[str], at_peak: list | None = None) -> tuple[int, float]:
        """(peak bytes, recompute cost) of the plan that recomputes ``recomputed`` and keeps
        every other candidate: what the simulator reports for it with no memory limit (the cost
        in seconds of recompute under the "time" objective, op_costs otherwise).
        ``at_peak``, when given, receives the recomputed tensors on the device at the (first) peak."""
        number, size = self.number, self.size
        count = len(size)
        gone = bytearray(count)
        for name in recomputed:
            gone[number[name]] = 1
        present = bytearray(count)
        mem = peak = self.input_bytes
        n = len(self.op_cost)

        def snapshot() -> None:
            if at_peak is not None:
                names = self.facts.workload.tensors
                at_peak[:] = [names[i].name for i in range(count) if present[i] and gone[i]]

        for i in range(n):
            for t in self.saved_outputs[i]:
                if not present[t]:
                    present[t] = 1
                    mem += size[t]
            if mem > peak:
                peak = mem
                snapshot()
            for t in self.fwd_frees[i]:
                if gone[t] and present[t]:
                    present[t] = 0
                    mem -= size[t]
        # Backward: what derive_recompute_groups calls resident is, for a recompute-only plan,
        # what is present, plus the step inputs; a group's outputs are temps while it runs.
        for t in self.step_inputs:
            present[t] = 1
        recompute_cost = 0.0
        producer, inputs, outputs = self.producer, self.inputs, self.outputs
        last_reader = self.last_reader
        for op_i in range(n - 1, -1, -1):
            missing = [t for t in self.bwd_reads[op_i] if not present[t]]
            if missing:
                in_group: set[int] = set()
                temps: set[int] = set()
                for t in missing:
                    if t in temps or producer[t] in in_group:
                        continue
                    stack = [(producer[t], 0)]
                    while stack:
                        op, at = stack.pop()
                        ins = inputs[op]
                        while at < len(ins) and (present[ins[at]] or ins[at] in temps):
                            at += 1
                        if at < len(ins):
                            stack.append((op, at + 1))
                            before = producer[ins[at]]
                            if before not in in_group:
                                stack.append((before, 0))
                            continue
                        if op not in in_group:
                            in_group.add(op)
                            temps.update(outputs[op])
                made: list[int] = []
                for op in sorted(in_group):
                    recompute_cost += self.op_cost[op]
                    for t in self.saved_outputs[op]:
                        if not present[t]:
                            present[t] = 1
                            mem += size[t]
                            made.append(t)
                    if mem > peak:
                        peak = mem
                        snapshot()
                for t in made:
                    if not (gone[t] and last_reader[t] <= op_i):
                        present[t] = 0
                        mem -= size[t]
            for t in self.bwd_frees[op_i]:
                if present[t]:
                    present[t] = 0
                    mem -= size[t]
        return peak, recompute_cost


def op_costs(workload, objective: str) -> list[float]:
    """What re-running each op costs the search: its forward seconds ("time"), or its forward
    FLOPs plus its share of the forward time over (ops + 1) whole forward passes ("flops"): an op
    is re-run at most once per backward step, so time can only break ties between equal FLOPs."""
    if objective == "time":
        return [op.fwd_time_s for op in workload.ops]
    if objective != "flops":
        raise ValueError(f"unknown recompute objective {objective!r}: use one of {', '.join(OBJECTIVES)}")
    total_s = math.fsum(op.fwd_time_s for op in workload.ops) * (len(workload.ops) + 1) or 1.0
    return [op.flops + op.fwd_time_s / total_s for op in workload.ops]


def recompute_only_run(facts: Facts, recomputed: Iterable[str], at_peak: list | None = None) -> tuple[int, float]:
    """(peak bytes, recompute seconds) of the plan that recomputes ``recomputed`` (RecomputeReplay.run)."""
    return RecomputeReplay(facts).run(recomputed, at_peak)


class _Descent:
    """One search's state: the items (whole producers), the replay and the evaluations left."""

    def __init__(self, facts: Facts, budget_bytes: int, objective: str) -> None:
        self.facts = facts
        self.budget = budget_bytes
        self.items = op_items(facts, facts.candidates)
        self.item_of = {n: k for k, it in enumerate(self.items) for n in it}
        self.replay = RecomputeReplay(facts, objective)
        self.left = DESCENT_OP_EVALUATIONS // max(1, len(facts.workload.ops))
        self.lowest_peak: int | None = None

    def run(self, chosen: set[int], at_peak: list | None = None) -> tuple[int, float]:
        self.left -= 1
        got = self.replay.run((n for k in chosen for n in self.items[k]), at_peak)
        if self.lowest_peak is None or got[0] < self.lowest_peak:
            self.lowest_peak = got[0]
        return got

    def descend(self) -> set[int] | None:
        """From everything recomputed, keep the item that lowers the peak most (then the fastest)
        until it is within the budget. Only a keep among the tensors on the device at the peak
        can lower it (a keep elsewhere adds bytes there or shortens another group), so those are
        tried first."""
        recomputed = set(range(len(self.items)))
        at_peak: list[str] = []
        current = self.run(recomputed, at_peak)
        while current[0] > self.budget:
            best = None
            near = sorted({self.item_of[n] for n in at_peak} & recomputed)
            for tries in (near, sorted(recomputed.difference(near))):
                for k in tries:
                    if self.left <= 0:
                        return None
                    got = self.run(recomputed - {k})
                    if got[0] < current[0] and (best is None or got < best[0]):
                        best = (got, k)
                if best is not None:
                    break
            if best is None:
                return None
            recomputed.discard(best[1])
            current = self.run(recomputed, at_peak)
        return recomputed

    def ascend(self) -> set[int] | None:
        """From everything kept, recompute the item that lowers the peak most (then the fastest)
        until it is within the budget: the descent can stall on a plateau (every single keep
        leaves the peak where it is) that this side of the space does not have."""
        recomputed: set[int] = set()
        current = self.run(recomputed)
        while current[0] > self.budget:
            best = None
            for k in range(len(self.items)):
                if k in recomputed:
                    continue
                if self.left <= 0:
                    return None
                got = self.run(recomputed | {k})
                if got[0] < current[0] and (best is None or got < best[0]):
                    best = (got, k)
            if best is None:
                return None
            current = best[0]
            recomputed.add(best[1])
        return recomputed

    def wander(self) -> set[int] | None:
        """When the descent and the ascent both stall over the budget, an iterated local search:
        from a random start, flip one item at a time in a random order, taking each flip that
        lowers (peak, cost), until a pass changes nothing; then flip WANDER_KICK random items of
        the best set so far and climb again. Returns the first set within the budget. The peak's
        landscape has plateaus and ridges both greedy walks stop on (docs/planners.md, "The
        recompute space"). Seeded with a constant, so the same workload gives the same plan."""
        if self.budget < self.facts.peak_floor_bytes(()):
            return None  # no plan of any kind fits (common.Facts.peak_floor_bytes)
        self.left = min(WANDER_MAX_REPLAYS, WANDER_OP_EVALUATIONS // max(1, len(self.facts.workload.ops)))
        count = len(self.items)
        rng = random.Random(0)
        best: tuple | None = None
        recomputed = {k for k in range(count) if rng.random() < 0.5}
        while self.left > 0:
            current = self.run(recomputed)
            changed = True
            while changed and current[0] > self.budget and self.left > 0:
                changed = False
                for k in rng.sample(range(count), count):
                    if current[0] <= self.budget or self.left <= 0:
                        break
                    got = self.run(recomputed ^ {k})
                    if got < current:
                        current, recomputed, changed = got, recomputed ^ {k}, True
            if current[0] <= self.budget:
                return recomputed
            if best is None or current < best[0]:
                best = (current, recomputed)
            recomputed = set(best[1])
            for k in rng.sample(range(count), min(WANDER_KICK, count)):
                recomputed ^= {k}
        return None

    def polish(self, recomputed: set[int]) -> set[int]:
        """Keep back what saves the most rebuild time first, each while the peak stays within the
        budget (one pass to rank the keeps, one to take them); when none fits, an exchange:
        recompute a kept item to make room for a keep that saves more than that costs. Passes
        until one changes nothing."""
        current = self.run(recomputed)
        changed = True
        while changed and self.left > 0:
            changed = False
            saving, blocked = [], []
            for k in sorted(recomputed):
                if self.left <= 0:
                    break
                got = self.run(recomputed - {k})
                if got[1] < current[1]:
                    (saving if got[0] <= self.budget else blocked).append((got[1], k))
            for _, k in sorted(saving):
                if self.left <= 0:
                    break
                got = self.run(recomputed - {k})
                if got[0] <= self.budget and got[1] < current[1]:
                    current = got
                    recomputed = recomputed - {k}
                    changed = True
            if changed or not blocked:
                continue
            costs = []
            for k in sorted(set(range(len(self.items))) - recomputed):
                if self.left <= 0:
                    break
                costs.append((self.run(recomputed | {k})[1] - current[1], k))
            for cost, k in sorted(costs):
                for time_kept, j in sorted(blocked):
                    if current[1] - time_kept <= cost or self.left <= 0:
                        break  # this keep, and every later one, saves less than recomputing k costs
                    got = self.run((recomputed | {k}) - {j})
                    if got[0] <= self.budget and got[1] < current[1]:
                        current = got
                        recomputed = (recomputed | {k}) - {j}
                        changed = True
                        break
                if changed:
                    break
        return recomputed


def frontier_descent(facts: Facts, budget_bytes: int,
                     objective: str = "time") -> tuple[tuple[str, ...] | None, int]:
    """The tensors to recompute (see the module's docstring), or None when none of the descent,
    the ascent (within DESCENT_OP_EVALUATIONS) and the wander (WANDER_OP_EVALUATIONS) reaches
    the budget; and the lowest peak it reached (bytes). ``objective``: what a rebuild costs (OBJECTIVES, op_costs)."""
    search = _Descent(facts, budget_bytes, objective)
    start = search.descend()
    if start is None:
        start = search.ascend()
    if start is None:
        start = search.wander()
    if start is None:
        return None, search.lowest_peak
    recomputed = search.polish(start)
    order = facts.production_order
    names = (n for k in recomputed for n in search.items[k])
    return tuple(sorted(names, key=order.__getitem__)), search.lowest_peak


def recompute_lower_bound_s(facts: Facts, budget_bytes: int) -> float:
    """A lower bound on the recompute seconds of any recompute-only plan within ``budget_bytes``.

    When the forward pass ends, every kept tensor is on the device, and so is every recomputed
    tensor the last forward op reads or makes. So a plan must recompute tensors worth at least
    ``need`` = step inputs + every candidate - budget bytes among those, and re-runs at least
    each one's producer once. The least producer time for ``need`` bytes (a 0-1 knapsack over
    whole producers, exact by dynamic programming over byte counts rounded up to 1/2000 of the
    need, so it can only under-estimate) bounds every plan's recompute time from below. 0.0 when
    nothing need go; math.inf when no set frees enough."""
    w = facts.workload
    end = len(w.ops) - 1
    movable = [n for n in facts.candidates if w.last_fwd_use[n] < end]
    need = facts.input_bytes + sum(facts.size[n] for n in facts.candidates) - budget_bytes
    if need <= 0:
        return 0.0
    items = op_items(facts, movable)
    sizes = [sum(facts.size[n] for n in it) for it in items]
    if sum(sizes) < need:
        return math.inf
    unit = max(1, need // 2000)
    cap = -(-need // unit)
    best = [math.inf] * (cap + 1)  # least time to free at least b units
    best[0] = 0.0
    for it, nbytes in zip(items, sizes):
        cost = w.ops[w.op_index[w.tensor_by_name[it[0]].producer]].fwd_time_s
        units = -(-nbytes // unit)
        for b in range(cap, 0, -1):
            prev = best[max(0, b - units)] + cost
            if prev < best[b]:
                best[b] = prev
    return best[cap]
