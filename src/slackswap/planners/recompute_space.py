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
from itertools import accumulate
from typing import Iterable

from .common import Facts
from .selection import op_items
from .staircase import held_from, lower_envelope, shifted, value_at

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

MAX_FLIPPED_ITEMS = 2
"""A search's replay starts from its last record when the plan asked about differs from it in at
most this many items (whole producers); otherwise it is recorded anew (RecomputeReplay.record)."""

WANDER_KICK = 3
"""Items the wander flips at random in its best set before climbing again: on the 2-layer
profiled models, 3 reached lower peaks than restarting from a fresh random set (at 3 seeds each)."""


class RecomputeReplay:
    """A workload's recompute-only plans replayed by tensor and op numbers (built once per search):
    the groups of schedule.derive_recompute_groups and the memory rules of the simulator, in one
    pass over the step.

    A search asks mostly about plans one or two producers away from the one it stands on, so a
    replay can be ``recorded`` (ReplayRecord) and its neighbours replayed from it
    (``run_flipped``): the backward steps before the first that looks at a flipped tensor are the
    record's, shifted by the flipped bytes, and once the device holds the same tensors as the
    record did at a step, the rest is the record's too (a flipped tensor held by both is freed by
    both after its last reader, and one held by neither is recomputed in both: a kept one is held
    until its last reader). The answers are the whole replay's, bit for bit
    (tests/test_recompute_space.py flips at random and compares)."""

    def __init__(self, facts: Facts, objective: str = "time") -> None:
        w = facts.workload
        self.facts = facts
        number = {t.name: i for i, t in enumerate(w.tensors)}
        self.number = number
        self.size = [t.size_bytes for t in w.tensors]
        self.producer = [w.op_index[t.producer] if t.producer is not None else -1 for t in w.tensors]
        self.inputs = [[number[n] for n in op.inputs] for op in w.ops]
        self.saved_outputs = [[number[n] for n in names] for names in w.saved_outputs]
        self.fwd_frees = [[number[n] for n in names] for names in w.last_fwd_use_of_saved]
        self.bwd_frees = [[number[n] for n in names] for names in w.last_bwd_read_of]
        self.bwd_reads = [[number[n] for n in w.bwd_reads[op.name]] for op in w.ops]
        self.last_reader = [w.last_bwd_reader.get(t.name, -1) for t in w.tensors]
        self.op_cost = op_costs(w, objective)
        self.step_inputs = [number[t.name] for t in w.tensors if t.producer is None]
        self.input_bytes = facts.input_bytes
        count = len(self.size)
        # For records: the forward op after which a recomputed tensor is freed (-1: never), what a
        # group re-running an op looks at, and the backward steps that look at a tensor whatever
        # the plan (its reads and its free).
        self.fwd_freed_after = [-1] * count
        for i, ts in enumerate(self.fwd_frees):
            for t in ts:
                self.fwd_freed_after[t] = i
        self.looked_at_by_group = [self.inputs[op] + self.saved_outputs[op] for op in range(len(w.ops))]
        self.looked_at_always = [-1] * count
        for i in range(len(w.ops)):
            for t in self.bwd_reads[i] + self.bwd_frees[i]:
                self.looked_at_always[t] = max(self.looked_at_always[t], i)

    def gone_of(self, recomputed: Iterable[str]) -> bytearray:
        gone = bytearray(len(self.size))
        number = self.number
        for name in recomputed:
            gone[number[name]] = 1
        return gone

    def run(self, recomputed: Iterable[str], at_peak: list | None = None) -> tuple[int, float]:
        """(peak bytes, recompute cost) of the plan that recomputes ``recomputed`` and keeps
        every other candidate: what the simulator reports for it with no memory limit (the cost
        in seconds of recompute under the "time" objective, op_costs otherwise).
        ``at_peak``, when given, receives the recomputed tensors on the device at the (first) peak."""
        return self._replay(self.gone_of(recomputed), at_peak, None)

    def record(self, gone: bytearray, at_peak: list | None = None) -> "ReplayRecord":
        """The replay of the plan that recomputes the tensors numbered in ``gone`` (a 0/1 byte per
        tensor), with what ``run_flipped`` needs to replay its neighbours."""
        rec = ReplayRecord(bytearray(gone), len(self.op_cost))
        rec.looked_at = list(self.looked_at_always)
        rec.peak, rec.cost = self._replay(rec.gone, at_peak, rec)
        rec.finish()
        return rec

    def _replay(self, gone: bytearray, at_peak: list | None, rec: "ReplayRecord | None") -> tuple[int, float]:
        size = self.size
        count = len(size)
        present = bytearray(count)
        mem = peak = self.input_bytes
        n = len(self.op_cost)

        def snapshot() -> None:
            if at_peak is not None:
                names = self.facts.workload.tensors
                at_peak[:] = [names[i].name for i in range(count) if present[i] and gone[i]]

        fwd_mem = rec.fwd_mem if rec is not None else None
        for i in range(n):
            for t in self.saved_outputs[i]:
                if not present[t]:
                    present[t] = 1
                    mem += size[t]
            if fwd_mem is not None:
                fwd_mem[i] = mem
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
        return self._backward(gone, present, mem, peak, 0.0, n - 1, snapshot, rec, None)

    def _backward(self, gone: bytearray, present: bytearray, mem: int, peak: int, recompute_cost: float,
                  top: int, snapshot, rec: "ReplayRecord | None",
                  base: "ReplayRecord | None", limit: int | None = None) -> tuple[int, float]:
        """Backward steps ``top`` down to 0 from the given state. ``rec``: filled in as it runs.
        ``base``: the record to rejoin, and ``limit`` a peak to stop over, for run_flipped."""
        size = self.size
        producer, inputs = self.producer, self.inputs
        last_reader, bwd_reads, bwd_frees = self.last_reader, self.bwd_reads, self.bwd_frees
        op_cost, saved_outputs = self.op_cost, self.saved_outputs
        looked_at = rec.looked_at if rec is not None else None
        base_steps = base.steps if base is not None else None
        for op_i in range(top, -1, -1):
            if base_steps is not None:
                snap = base_steps[op_i]
                if present == snap[0]:
                    # The device holds what the record's did here (so the same bytes): the rest is
                    # the record's.
                    if base.peak_from[op_i] > peak:
                        peak = base.peak_from[op_i]
                    for cost in base.costs[snap[2]:]:
                        recompute_cost += cost
                    return peak, recompute_cost
            if rec is not None:
                rec.steps[op_i] = (bytes(present), mem, len(rec.costs), recompute_cost)
                high = -1
            # The group: every producer reachable from a missing tensor through tensors not on
            # the device (what derive_recompute_groups re-runs), in op order.
            stack = [producer[t] for t in bwd_reads[op_i] if not present[t]]
            if stack:
                in_group = set(stack)
                while stack:
                    for t in inputs[stack.pop()]:
                        if not present[t]:
                            before = producer[t]
                            if before not in in_group:
                                in_group.add(before)
                                stack.append(before)
                made: list[int] = []
                for op in sorted(in_group):
                    recompute_cost += op_cost[op]
                    if rec is not None:
                        rec.costs.append(op_cost[op])
                        for t in self.looked_at_by_group[op]:
                            if looked_at[t] < op_i:
                                looked_at[t] = op_i
                    for t in saved_outputs[op]:
                        if not present[t]:
                            present[t] = 1
                            mem += size[t]
                            made.append(t)
                    if rec is not None and mem > high:
                        high = mem
                    if mem > peak:
                        peak = mem
                        snapshot()
                if limit is not None and peak > limit:
                    return peak, math.inf
                for t in made:
                    if not (gone[t] and last_reader[t] <= op_i):
                        present[t] = 0
                        mem -= size[t]
            if rec is not None:
                rec.high[op_i] = high
            for t in bwd_frees[op_i]:
                if present[t]:
                    present[t] = 0
                    mem -= size[t]
        return peak, recompute_cost

    def run_flipped(self, rec: "ReplayRecord", flipped: Iterable[int], limit: int | None = None) -> tuple[int, float]:
        """``run`` of the plan that differs from ``rec``'s in the tensors numbered ``flipped``
        (recomputed there if kept in the record, kept if recomputed), from the record. With
        ``limit``, it may stop as soon as the peak is over it: (a peak over it, math.inf)."""
        size, freed_after = self.size, self.fwd_freed_after
        gone = bytearray(rec.gone)
        start = -1  # the first backward step that looks at a flipped tensor
        changes = []  # (forward op after which the flip changes memory, bytes it adds)
        for t in flipped:
            gone[t] ^= 1
            start = max(start, rec.looked_at[t])
            if freed_after[t] >= 0:
                changes.append((freed_after[t] + 1, -size[t] if gone[t] else size[t]))
        if start < 0:  # nothing flipped
            return rec.peak, rec.cost
        # Forward: the record's memory after each op's allocations, plus the flips' changes from
        # the op after the one that frees them when recomputed.
        changes.sort()
        fwd = rec.fwd_mem
        peak = self.input_bytes
        shift, at = 0, 0
        for until, change in changes + [(len(fwd), 0)]:
            if until > at:
                peak = max(peak, max(fwd[at:until]) + shift)
                at = until
            shift += change
        # Backward up to ``start`` is the record's, shifted by the same bytes throughout.
        present_at, mem_at, _, cost_at = rec.steps[start]
        present = bytearray(present_at)
        for t in flipped:
            if freed_after[t] >= 0:
                present[t] = 0 if gone[t] else 1
        if rec.peak_above[start] >= 0:
            peak = max(peak, rec.peak_above[start] + shift)
        if limit is not None and peak > limit:
            return peak, math.inf
        return self._backward(gone, present, mem_at + shift, peak, cost_at, start, _nothing, None, rec, limit)


def _nothing() -> None:
    pass


class ReplayRecord:
    """One replay kept for RecomputeReplay.run_flipped: per backward step (by op index) the state
    before it (tensors present, bytes, costs added so far and their sum) and the highest bytes
    inside it; per forward op the bytes after its allocations; per tensor the first (highest)
    backward step that looked at it."""

    def __init__(self, gone: bytearray, ops: int) -> None:
        self.gone = gone
        self.fwd_mem = [0] * ops
        self.steps: list = [None] * ops
        self.high = [-1] * ops
        self.costs: list[float] = []
        self.looked_at: list[int] = []
        self.peak = 0
        self.cost = 0.0
        self.peak_above: list[int] = []
        self.peak_from: list[int] = []

    def finish(self) -> None:
        # peak_above[i]: the highest bytes at steps before step i (op indices above i); peak_from[i]:
        # at step i and after (-1: none).
        # (Every high is -1 or more, so the running maxima start right.)
        self.peak_above = list(accumulate(reversed(self.high), max))[::-1][1:] + [-1]
        self.peak_from = list(accumulate(self.high, max))


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
        number = self.replay.number
        self.item_tensors = [[number[n] for n in it] for it in self.items]
        self.record: ReplayRecord | None = None
        self.recorded: set[int] = set()
        self.left = DESCENT_OP_EVALUATIONS // max(1, len(facts.workload.ops))
        self.lowest_peak: int | None = None

    def run(self, chosen: set[int], at_peak: list | None = None, *, within: bool = False) -> tuple[int, float]:
        """The replay of recomputing the items ``chosen``: from the last record when it is at most
        MAX_FLIPPED_ITEMS items away, else (and whenever ``at_peak`` is wanted) recorded anew.
        ``within``: the caller wants the plan only if it peaks within the budget, so a replay from
        the record may stop once it is over (the cost is then math.inf); the lowest peak is not
        missed, since a plan within the budget was run before every such question (polish)."""
        self.left -= 1
        flipped = self.recorded.symmetric_difference(chosen)
        if self.record is not None and at_peak is None and len(flipped) <= MAX_FLIPPED_ITEMS:
            got = self.replay.run_flipped(self.record, [t for k in flipped for t in self.item_tensors[k]],
                                          self.budget if within else None)
        else:
            self.record = self.replay.record(self._gone(chosen), at_peak)
            self.recorded = set(chosen)
            got = self.record.peak, self.record.cost
        if self.lowest_peak is None or got[0] < self.lowest_peak:
            self.lowest_peak = got[0]
        return got

    def center(self, chosen: set[int]) -> None:
        """Record the plan that recomputes ``chosen`` (already asked about, so neither counted nor
        a new lowest peak) when the questions that follow are about its neighbours: replays from
        it stop sooner than from an older record a few items away."""
        if self.recorded != chosen:
            self.record = self.replay.record(self._gone(chosen))
            self.recorded = set(chosen)

    def _gone(self, chosen: set[int]) -> bytearray:
        gone = bytearray(len(self.replay.size))
        for k in chosen:
            for t in self.item_tensors[k]:
                gone[t] = 1
        return gone

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
            self.center(recomputed)
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
            self.center(recomputed)
            for k in sorted(recomputed):
                if self.left <= 0:
                    break
                got = self.run(recomputed - {k})
                if got[1] < current[1]:
                    (saving if got[0] <= self.budget else blocked).append((got[1], k))
            for _, k in sorted(saving):
                if self.left <= 0:
                    break
                got = self.run(recomputed - {k}, within=True)
                if got[0] <= self.budget and got[1] < current[1]:
                    current = got
                    recomputed = recomputed - {k}
                    changed = True
            if changed or not blocked:
                continue
            costs = []
            self.center(recomputed)
            for k in sorted(set(range(len(self.items))) - recomputed):
                if self.left <= 0:
                    break
                costs.append((self.run(recomputed | {k})[1] - current[1], k))
            for cost, k in sorted(costs):
                for time_kept, j in sorted(blocked):
                    if current[1] - time_kept <= cost or self.left <= 0:
                        break  # this keep, and every later one, saves less than recomputing k costs
                    got = self.run((recomputed | {k}) - {j}, within=True)
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
    # The least time to free at least b units, as a staircase over b (staircase.py: the per-unit
    # table's additions and comparisons, over its runs).
    # Only the value at cap is read, so below cap minus the later items' units each staircase
    # holds the value there (staircase.held_from).
    best = ([0, 1], [0.0, math.inf])
    weights = [-(-nbytes // unit) for nbytes in sizes]
    later_units = sum(weights)
    for it, weight in zip(items, weights):
        cost = w.ops[w.op_index[w.tensor_by_name[it[0]].producer]].fwd_time_s
        later_units -= weight
        best = held_from(lower_envelope(best, shifted(best, weight, cost, cap)), cap - later_units)
    return value_at(best, cap)
