"""Choosing which tensors to recompute, and sizing the choice to a budget with the simulator.

Budget arithmetic: with everything kept, the activation peak is reached when the
forward pass ends. Taking a tensor off the device (swapped and copied out, or left to
be recomputed) lowers that point by its size, so a plan needs to take off roughly
``need = keep-all peak - budget`` bytes. "Roughly" because backward adds memory back
(rebuilt tensors, copies arriving early), so the sizing loop (``fit_need``) asks the
simulator for the plan's real peak and raises ``need`` by the overshoot until it fits.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from ..plans import Action, Plan
from ..workload import Workload
from .common import Candidate, Facts, facts_for
from .search import STEP_FLOOR_MARGIN
from .staircase import add_to_table, held_from, lower_envelope, shifted, to_table, value_of

if TYPE_CHECKING:
    from .search import Search

_BUCKETS = 4000  # knapsack resolution: need is split into this many byte units
# The knapsack walks runs of equal values while they are fewer than 1/8 of the units, then every
# unit: one run costs about as much Python as a few units (measured on gpt2-xl, 48-384 layers).
_DENSE_RUNS_FRACTION = 8


def op_items(facts: Facts, names: Iterable[str]) -> list[tuple[str, ...]]:
    """Group tensors by producer: recomputing one output of an op rebuilds all of them at once."""
    groups: dict[str, list[str]] = {}
    by_name = facts.workload.tensor_by_name
    for name in names:
        groups.setdefault(by_name[name].producer, []).append(name)
    return [tuple(v) for v in groups.values()]


def cheapest_per_byte(facts: Facts, names: Iterable[str], need_bytes: int) -> list[str]:
    """Greedy: recompute the tensors with the least rebuild time per byte until ``need_bytes`` are off."""
    items = op_items(facts, names)
    order = {n: i for i, n in enumerate(facts.candidates)}
    # An item is one producer's outputs, all rebuilt by the same ops: its recompute time is the
    # rebuild time of any of them (the same fsum over the same ops).
    rebuild = facts.rebuild_time_s
    items.sort(key=lambda it: (rebuild[it[0]] / sum(facts.size[n] for n in it), order[it[0]]))
    chosen: list[str] = []
    saved = 0
    for item in items:
        if saved >= need_bytes:
            break
        chosen.extend(item)
        saved += sum(facts.size[n] for n in item)
    return chosen


_MEMOS: dict[int, tuple[Facts, dict]] = {}
_MEMO_ENTRIES = 128  # answers kept per workload and kind: a planning call asks for a few dozen


def workload_memo(facts: Facts, kind: str) -> dict:
    """A dict of remembered answers of one ``kind`` for the workload of ``facts``, kept while it is
    (and for at most 16 workloads, like common.facts_for); emptied when it reaches _MEMO_ENTRIES.
    For answers that depend only on the workload and the key they are stored under."""
    held = _MEMOS.get(id(facts))
    if held is None or held[0] is not facts:
        if len(_MEMOS) > 16:
            _MEMOS.clear()
        held = _MEMOS[id(facts)] = (facts, {})
    memo = held[1].setdefault(kind, {})
    if len(memo) >= _MEMO_ENTRIES:
        memo.clear()
    return memo


def remembered_plan(kind: str, planner: Callable[[Workload, Any, int], Plan], workload: Workload, hardware,
                    budget_bytes: int) -> Plan:
    """``planner``'s plan, remembered per workload (workload_memo of ``kind``), link and budget, for
    a plan `slackswap` asks for more than once in one call."""
    memo = workload_memo(facts_for(workload), kind)
    key = (hardware, budget_bytes)
    if key not in memo:
        memo[key] = planner(workload, hardware, budget_bytes)
    return memo[key]


def knapsack_min_time(facts: Facts, names: Sequence[str], need_bytes: int) -> list[str] | None:
    """``knapsack_min_time_of`` (below), remembered per workload: one `slackswap` call asks the
    same question many times (its families' sizings repeat needs, and the heuristics it takes as
    starts size the same recompute-only family), and the answer depends only on the arguments."""
    memo = workload_memo(facts, "knapsack")
    key = (tuple(names), need_bytes)
    if key not in memo:
        memo[key] = knapsack_min_time_of(facts, names, need_bytes)
    found = memo[key]
    return None if found is None else list(found)


def knapsack_min_time_of(facts: Facts, names: Sequence[str], need_bytes: int) -> list[str] | None:
    """Least total rebuild time whose tensors sum to at least ``need_bytes`` (None if all of them do not).

    A 0-1 knapsack by dynamic programming over ``_BUCKETS`` byte units of ``need``, with
    sizes rounded to the nearest unit; if rounding leaves the chosen set short of the
    need, the cheapest remaining items per byte fill the gap. Items are whole
    producers (op_items). Identical items (the same op in every layer) form one group,
    split in binary bundles (1, 2, 4, ...) so the program runs over a few dozen bundles
    instead of hundreds of ops. From a group the earliest-produced items are taken: their
    rebuilds happen late in backward, when memory has already been freed.
    """
    if need_bytes <= 0:
        return []
    items = op_items(facts, names)
    sizes = [sum(facts.size[n] for n in it) for it in items]
    if sum(sizes) < need_bytes:
        return None
    unit = max(1.0, need_bytes / _BUCKETS)
    cap = math.ceil(need_bytes / unit)
    groups: dict[tuple[int, float], list[int]] = {}
    for i, it in enumerate(items):
        key = (min(cap, int(round(sizes[i] / unit))), round(facts.rebuild_time_s[it[0]], 15))
        groups.setdefault(key, []).append(i)
    bundles: list[tuple[tuple[int, float], int]] = []  # (group key, count)
    for key, members in groups.items():
        left, k = len(members), 1
        while left > 0:
            take = min(k, left)
            bundles.append((key, take))
            left -= take
            k *= 2
    # best(b): the least rebuild time of a set covering at least b units, a non-decreasing
    # staircase in b held as its runs (staircase.py); one (runs before, w, c) per bundle for the
    # walk back. The per-unit table this replaces did the same float additions and comparisons.
    # Values over ``ceiling`` (at least the answer) are held as infinity: fewer runs, and the same
    # answer and walk back (_ceiling).
    ceiling = _ceiling(bundles, cap)
    runs = ([0, 1], [0.0, math.inf])  # cap >= 1: need_bytes > 0
    table: list[float] | None = None  # the per-unit values, once the staircase has too many runs
    before: list = []
    # The walk back from cap reads the program after bundle j only at cap minus at most the later
    # bundles' weights, or more: below that each staircase holds the value there (fewer runs), and
    # the per-unit table is not updated.
    later_units = sum(weight * count for (weight, _), count in bundles)
    for (weight, cost), count in bundles:
        w, c = weight * count, cost * count
        later_units -= w
        if table is None and len(runs[0]) > cap // _DENSE_RUNS_FRACTION:
            table = to_table(runs, cap)
        if table is None:
            before.append((runs, w, c))
            runs = held_from(lower_envelope(runs, shifted(runs, w, c, cap, ceiling)), cap - later_units)
        else:
            before.append((table[:], w, c))
            add_to_table(table, w, c, cap - later_units, ceiling)
    if value_of(runs if table is None else table, cap) == math.inf:
        return None
    counts: dict[tuple[int, float], int] = {}
    b = cap
    for j in range(len(bundles) - 1, -1, -1):
        old, w, c = before[j]
        # Taken at b when the bundle on top of the best for b - w (or alone, b <= w) beat the best
        # without it: exactly the per-unit table's test.
        if b > 0 and value_of(old, max(0, b - w)) + c < value_of(old, b):
            key, count = bundles[j]
            counts[key] = counts.get(key, 0) + count
            b = max(0, b - key[0] * count)
    chosen: list[str] = []
    for key, members in groups.items():
        for i in members[: counts.get(key, 0)]:
            chosen.extend(items[i])
    short = need_bytes - sum(facts.size[n] for n in chosen)
    if short > 0:
        picked = set(chosen)
        chosen.extend(cheapest_per_byte(facts, [n for n in names if n not in picked], short))
    # Rounding can make the program's answer slightly worse than the greedy order on a
    # near-tie; the greedy set is a valid answer too, so take the cheaper of the two.
    greedy = cheapest_per_byte(facts, names, need_bytes)
    if facts.recompute_time_s(greedy) < facts.recompute_time_s(chosen):
        chosen = greedy
    order = {n: i for i, n in enumerate(facts.candidates)}
    return sorted(chosen, key=order.__getitem__)


def _ceiling(bundles: list[tuple[tuple[int, float], int]], cap: int) -> float:
    """A value at least the knapsack's answer at ``cap`` units: the cost of taking whole groups
    cheapest per unit first until they cover ``cap`` (a set the program weighs too), with a
    margin for the float sums' order. Every value of the program that is at most it is exact
    whatever is held above it, since costs are not negative and a value over it only adds to
    values over it; and the walk back reads only values at most the answer, or compares one
    with such a value, so it takes the same bundles (tests/test_staircase.py)."""
    units = 0
    cost = 0.0
    for (weight, each), count in sorted(bundles, key=lambda b: b[0][1] / b[0][0] if b[0][0] else math.inf):
        units += weight * count
        cost += each * count
        if units >= cap:
            return cost * (1 + 1e-9) + 1e-300
    return math.inf


def fit_need(
    search: "Search",
    initial_need_bytes: int,
    make: Callable[[int], Plan | None],
    *,
    allow_memory_stalls: bool = False,
    rounds: int = 10,
    step_floor_from: Callable[[int], float] | None = None,
    beat_s: float | None = None,
) -> Candidate | None:
    """Size a plan family ``make(need)`` to the search's budget: the fastest plan found that fits, or None.

    A plan "clears" the budget when its peak, simulated without a memory limit, is within
    it (so it never waits for memory). First the need grows by the simulated overshoot
    until a plan clears; then a bisection between the largest need that did not clear
    and the smallest that did looks for the least bytes taken off. Every plan tried is
    also simulated under the budget and the fastest that completes is returned; with
    ``allow_memory_stalls`` that includes plans that wait for copies to free memory.

    ``step_floor_from(need)``: a lower bound on the step time of ``make(m)`` for every m >= need
    (search.recompute_step_floor). A bisection probe over it (nothing there or beyond can be
    faster than the best so far) is not simulated but taken to clear (the bisection goes below
    it): where it does clear that is the path simulating it takes. Where it would not, the
    bisection would go on above it, finding nothing faster; so if the guess let a faster plan be
    found, the guesses are checked in turn (one simulation each) and the first wrong one's best
    is the answer. Same answer, fewer simulations.

    ``beat_s``: only a plan that runs in at most ``beat_s`` is wanted; the answer is then the same
    plan where it does and None where it does not, and the plans it rules out are not simulated
    under the budget, nor guessed at by the bound.
    """
    budget_bytes = search.budget_bytes
    total = max(1, keep_all_peak_bytes_of(search.workload))
    need = max(0, initial_need_bytes)
    # With beat_s the best so far starts as a bar just above it, never returned.
    bar = None if beat_s is None else _Bar(math.nextafter(beat_s, math.inf))
    best: Candidate | _Bar | None = bar
    high = None  # smallest need known to clear
    grown: tuple[int, int] | None = None  # (need, peak) of the last step of the growth phase
    seen: dict[int, bool] = {}
    leap = total // 100
    went_back = False
    guesses: list[tuple[int, Candidate]] = []  # (need taken to clear, the best when it was)
    for _ in range(rounds):
        if need in seen:
            break
        if (high is not None and best is not None and step_floor_from is not None
                and step_floor_from(need) > best.step_time_s * (1 + STEP_FLOOR_MARGIN)):
            guesses.append((need, best))  # not even made: the check makes it, if it comes to that
            clears = True
        elif (plan := make(need)) is None:
            clears = False
            peak = budget_bytes + total
        else:
            free = search.evaluate(plan, unlimited=True)
            peak = free.timeline.peak_memory_bytes
            clears = peak <= budget_bytes
            # A plan whose unlimited peak is within the budget never waits for memory, so its
            # unlimited run is also its run under the budget: no second simulation needed.
            cutoff = None if best is None else best.step_time_s  # only a faster plan is kept
            cand = free if clears else search.evaluate(plan, cutoff_s=cutoff) if allow_memory_stalls else None
            if cand is not None and cand.fits and (best is None or cand.step_time_s < best.step_time_s):
                best = cand
        seen[need] = clears
        if clears:
            high = need if high is None else min(high, need)
        if high is None:
            if plan is None:
                break
            if grown is not None and peak > grown[1] and need - grown[0] > 1:
                back = grown[0] + (need - grown[0]) // 2
                if not went_back and back not in seen:
                    # Taking more off raised the peak (a family's far end rebuilds long groups in
                    # backward): a need that fits may lie before this one, so go back halfway.
                    went_back = True
                    need = back
                    continue
                # Halfway back the peak is still higher: the knapsack's sets are not nested, and
                # a whole range of needs can pick larger items that rebuild in longer groups. A
                # need that clears can lie beyond it (docs/planners.md, rule 6, has the case), so
                # leap past the largest need tried, doubling each time.
                went_back = False
                need = max(seen) + leap
                leap *= 2
                continue
            went_back = False
            step = max(peak - budget_bytes, total // 100)
            if grown is not None and peak == grown[1]:
                # No change: the plan is likely the same (items are whole producers, so a need
                # can grow a long way before the next one is taken): double the step.
                step = max(step, 2 * (need - grown[0]))
            grown = (need, peak)
            need = need + step
        else:
            # The peak need not fall as the need grows, so the lower end is the largest need
            # below the smallest that clears, not the largest that ever failed.
            low = max((n for n, ok in seen.items() if not ok and n < high), default=-1)
            if high - low <= max(1, total // 2000):
                break
            need = (low + high + 1) // 2 if low >= 0 else high // 2
    for guessed, best_then in guesses:
        if best is best_then:
            break  # nothing faster found since this guess: its answer either way
        plan = make(guessed)
        if plan is None or search.evaluate(plan, unlimited=True).timeline.peak_memory_bytes > budget_bytes:
            best = best_then
            break
    return None if best is bar else best


class _Bar:
    """fit_need's best so far before any plan, with ``beat_s``: only a faster plan replaces it."""

    def __init__(self, step_time_s: float) -> None:
        self.step_time_s = step_time_s


def keep_all_peak_bytes_of(workload: Workload) -> int:
    return keep_all_peak_bytes(facts_for(workload))


def keep_all_peak_bytes(facts: Facts) -> int:
    return facts.input_bytes + sum(facts.size[n] for n in facts.candidates)


def actions_for(swap: Iterable[str] = (), recompute: Iterable[str] = ()) -> dict[str, Action]:
    actions = {n: Action.SWAP for n in swap}
    actions.update({n: Action.RECOMPUTE for n in recompute})
    return actions


def recompute_peak_descent(search: Search, *, max_simulations: int = 64) -> Candidate | None:
    """A recompute-only plan for when no knapsack set fits: from recomputing
    everything, keep one producer's tensors at a time, each round the keep that lowers the
    unlimited simulated peak most (then the fastest), until the peak is within the budget.

    Rebuilding in backward holds a whole recompute group, so recomputing more can raise the peak
    (a large tensor re-created next to others); the sets the knapsack grows into then never fit,
    while keeping such a tensor does. No plan here copies anything: the same on every link.
    (`slackswap`'s rule 1 and `recompute-optimal` both use it.)"""
    facts, budget_bytes = search.facts, search.budget_bytes
    recomputed = list(facts.candidates)
    current = search.try_actions(actions_for(recompute=recomputed), unlimited=True)
    simulations = 1
    while current.timeline.peak_memory_bytes > budget_bytes and simulations < max_simulations:
        best = None
        for item in op_items(facts, recomputed):
            if simulations >= max_simulations:
                break
            kept = set(item)
            rest = [n for n in recomputed if n not in kept]
            cand = search.try_actions(actions_for(recompute=rest), unlimited=True)
            simulations += 1
            key = (cand.timeline.peak_memory_bytes, cand.step_time_s)
            if key[0] < current.timeline.peak_memory_bytes and (best is None or key < best[0]):
                best = (key, cand, rest)
        if best is None:
            return None
        _, current, recomputed = best
    if current.timeline.peak_memory_bytes > budget_bytes:
        return None
    return current  # its unlimited run never exceeds the budget, so it is also its run under it
