"""`slackswap` (default): SlackSwap improved, where the simulator shows a gain.

The rules, numbered in the order they run (docs/planners.md gives each one's reason and
what it was measured to change); each is one function below, and ``plan_slackswap`` reads as
the list:

1. ``link_free_floor``: the recompute-only family, sized by simulation and repaired without
   ever adding a swap (or, when no knapsack set fits, a peak descent from recomputing
   everything). It copies nothing, so it is the same plan on every link; it is the first start.
2. ``every_recompute_only_plan``: when the wide search is granted and every recompute-only plan
   fits in half of its allowance, all are tried and the fastest that fits is the floor.
3. ``windowed_swaps``, per-tensor slack windows: a tensor may leave only after it is made and
   must be back before its first backward use, checked against the copy streams as already
   booked (copies.WindowBooking).
4. Latency- and duplex-aware copies (inside rule 3's check): each copy pays the per-copy latency,
   and copies back that overlap copies out run at the duplex-slowed rate.
5. ``swap_orders``: three orders for the link (value, value+spill, early); in each family the
   bytes still needed after the swaps are recomputed by the knapsack.
6. ``sized_starts``: each family sized to the budget with the simulator (selection.fit_need),
   accepting short waits for memory; a family whose far end does not fit is sized again with
   shorter prefixes of its swaps (``fit_fewer_swaps``); when none fits, everything swapped and
   the other heuristics' plans are the starts of last resort (``heuristic_starts``), and on
   workloads of at most HEURISTIC_STARTS_MAX_OPS ops those plans are starts always; with the
   wide search everything swapped is one more start anyway. Without the wide search, an order
   whose plans provably cannot beat the start so far (``cannot_beat``) is sized only if rule 9
   asks for the runner-up; each family's sizing skips the sizes its step time floor rules out.
7. ``repair`` (repair.py) of the best start: single changes where the simulated timeline
   points, kept when the step gets faster (or as fast with less work); with the wide search, a
   polish over every single change and pair of one-tensor changes.
8. ``repair_other_starts``: with the wide search, the other starts are repaired too, best first.
9. ``repair_runner_up``: without the wide search, when the best start's repair was cut off
   still improving, the runner-up start is repaired too.
10. ``exact_where_cheap``: with at most EXACT_MAX_CANDIDATES candidates, a branch and bound over
    every assignment (exact.py), started from rules 1-9's plan.
11. ``paper_plan_if_faster``: the paper's rule (`slackswap-paper`) is planned once more; where its
    plan simulates faster than rules 1-10's answer it is repaired and becomes the answer.

The wide search (rules 2, 7's polish and 8) is granted WIDE_SEARCH_OP_SIMULATIONS
op-simulations (simulations times ops) when they pay for one pass over every single change
(3 per candidate tensor); otherwise it is off.
"""

from __future__ import annotations

import math
from typing import Callable

from ..errors import BudgetError
from ..hardware import Hardware
from ..plans import Plan
from ..workload import Workload
from .common import Candidate, Facts, natural_peak_bytes, policy_cannot_fit, with_info
from .copies import WindowBooking
from .exact import EXACT_MAX_CANDIDATES, branch_and_bound
from .repair import MAX_SIMULATIONS, RepairResult, rank, repair
from .search import STEP_FLOOR_MARGIN, Search, recompute_step_floor
from .selection import (actions_for, fit_need, keep_all_peak_bytes, knapsack_min_time, recompute_peak_descent,
                        workload_memo)

POLICY = "slackswap"
# The wide search's allowance. A simulation's cost grows with the op count, so this buys hundreds
# of simulations for a few-op workload and none for the built-in models; it is measured against a
# brute-force search in tests/test_brute_force.py.
WIDE_SEARCH_OP_SIMULATIONS = 4000
SIZING_ROUNDS = 14
# Rule 6 also takes the other heuristics' plans as starts on workloads this small, where their
# planning (tens of simulations together) is cheap: the wide search's op-simulations buy 20 per
# planning call at this size.
HEURISTIC_STARTS_MAX_OPS = WIDE_SEARCH_OP_SIMULATIONS // 20


def windowed_swaps(facts: Facts, hardware: Hardware, ranked: list[str], *, spill: bool = False,
                   strict: list[str] | None = None) -> list[str]:
    """Rules 3-4: tensors in ``ranked`` order whose copies fit their windows, in the order they
    were accepted. A plan that needs fewer bytes off takes a prefix of this list (the greedy
    would have stopped there), so it is computed once per plan.

    Copies out must end before the forward pass does (they then free memory before the
    peak). With ``spill``, a second pass appends the tensors whose copies out may run into
    backward as long as every copy back still lands before its first use: such a tensor
    leaves the device after the peak has passed, which backward's own frees may absorb (the
    simulator decides), so they come after every strict swap. ``strict``: the first pass's result
    for the same ``ranked`` list, when already known (the value and value+spill orders share it)."""
    booking = WindowBooking(facts, hardware, strict or ())
    swapped: list[str] = list(strict or ())
    passes = (facts.forward_time_s, None) if spill else (facts.forward_time_s,)
    for deadline in passes[1:] if strict is not None else passes:
        taken = set(swapped)
        for name in ranked:
            if name not in taken and booking.fits(name, out_deadline_s=deadline):
                booking.add(name)
                swapped.append(name)
                taken.add(name)
    return swapped


def swap_orders(facts: Facts) -> dict[str, list[str]]:
    """Rule 5's two orders of candidates for the link.

    ``value``: costliest to rebuild per byte first (the paper's ranking: each byte the link
    carries saves the most recompute). ``early``: in production order, since a tensor made
    early has the longest window and FIFO copies out from the first op keep the link busy
    from the start, so the link carries the most bytes in total; it wins when the bytes to
    take off barely exceed what the link can carry and a little recompute covers the rest."""
    order = facts.production_order
    value = sorted(facts.candidates, key=lambda n: (-facts.rebuild_time_s[n] / facts.size[n], order[n]))
    return {"value": value, "early": list(facts.candidates)}


def family(search: Search, accepted: list[str]):
    """Rule 5's plan family of one swap order: ``make(need)`` swaps the shortest prefix of
    ``accepted`` that takes ``need`` bytes off (all of it if none does) and recomputes the
    least-rebuild-time set of the rest for the bytes still needed."""
    facts = search.facts

    def make(need: int) -> Plan:
        swapped: list[str] = []
        off = 0
        for name in accepted:
            if off >= need:
                break
            swapped.append(name)
            off += facts.size[name]
        taken = set(swapped)
        rest = [n for n in facts.candidates if n not in taken]
        recompute = knapsack_min_time(facts, rest, need - off)
        if recompute is None:  # not enough bytes left: recompute all of them
            recompute = rest
        return search.plan(actions_for(swapped, recompute))
    return make


def initial_need_bytes(search: Search) -> int:
    return keep_all_peak_bytes(search.facts) - search.budget_bytes


def family_floor(search: Search, accepted: list[str]) -> Callable[[int], float]:
    """A lower bound on the step time of ``family(search, accepted)``'s plans from a need on: past
    the accepted swaps' bytes every plan swaps them all and recomputes at least the rest of the
    need from the other candidates (search.recompute_step_floor); before, it recomputes nothing."""
    facts = search.facts
    taken = set(accepted)
    return recompute_step_floor(search, sum(facts.size[n] for n in accepted),
                                [n for n in facts.candidates if n not in taken])


def size(search: Search, make, floor: Callable[[int], float] | None = None) -> Candidate | None:
    """Rule 6's sizing of one family, waits for memory allowed; ``floor`` as family_floor's, which
    spares the simulation of sizes that cannot be faster than the best found."""
    return fit_need(search, initial_need_bytes(search), make, allow_memory_stalls=True, rounds=SIZING_ROUNDS,
                    step_floor_from=floor)


def link_free_floor(search: Search) -> Candidate | None:
    """Rule 1: the recompute-only family sized (or the peak descent), then repaired without ever
    adding a swap. No plan on this path copies anything, so the path and its result are the same
    on every link; as the first start it bounds the result on any link (docs/planners.md)."""
    floor = size(search, family(search, []), family_floor(search, []))
    if floor is None:
        floor = recompute_peak_descent(search)
        # Where the family does not size, the descent's greedy choice can be slower than
        # recompute-optimal's knapsack (HF GPT-2's compiled forward graph at torch's 0.4: 16.72 vs
        # 16.19 us simulated, tests/test_slackswap_floor.py): the faster of the two is the floor.
        # Rule 6 already takes its plan as a start on workloads of at most HEURISTIC_STARTS_MAX_OPS.
        theirs = recompute_optimal_start(search) if len(search.workload.ops) > HEURISTIC_STARTS_MAX_OPS else None
        if theirs is not None and (floor is None or rank(theirs) < rank(floor)):
            floor = theirs
    if floor is None:
        return None
    fixed = repair(search, floor, allow_swaps=False)
    search.targeted_simulations += fixed.simulations
    return fixed.best


def other_policy_start(search: Search, planner: Callable[[Workload, Hardware, int], Plan | None],
                       cutoff_s: float | None = None) -> tuple[Candidate, str] | None:
    """Another policy's plan for this search's budget as a candidate of this search, with that
    policy's name; None where it refuses the budget (or gives None). ``cutoff_s`` as in Search.evaluate."""
    try:
        theirs = planner(search.workload, search.hardware, search.budget_bytes)
    except BudgetError:
        return None
    if theirs is None:
        return None
    plan = search.plan(theirs.actions, prefetch_step=theirs.prefetch_step)
    return search.evaluate(plan, cutoff_s=cutoff_s), theirs.policy


def recompute_optimal_start(search: Search) -> Candidate | None:
    """`recompute-optimal`'s plan as a candidate of this search, None where it refuses or does not fit."""
    from .recompute_optimal import plan_recompute_optimal

    start = other_policy_start(search, plan_recompute_optimal)
    return start[0] if start is not None and start[0].fits else None


def grant_wide_search(search: Search) -> None:
    """The wide search's allowance: WIDE_SEARCH_OP_SIMULATIONS op-simulations, or none when they
    cannot pay for one pass over every single change (3 per candidate tensor): rules 2, 7's
    polish and 8 would then only add arbitrary probes."""
    allowance = WIDE_SEARCH_OP_SIMULATIONS // max(1, len(search.workload.ops))
    if allowance < 3 * len(search.facts.candidates):
        allowance = 0
    search.wide_allowance = search.wide_left = allowance


def best_recompute_only(search: Search) -> Candidate | None:
    """The fastest plan that only keeps or recomputes, by trying every such plan.

    Without copies nothing frees memory while compute waits, so such a plan fits exactly when
    its unlimited peak is within the budget, and then runs in its unlimited time: the answer is
    the same on every link and can only get faster as the budget grows."""
    facts = search.facts
    best = None
    for mask in range(2 ** len(facts.candidates)):
        recompute = [n for i, n in enumerate(facts.candidates) if mask >> i & 1]
        cand = search.try_actions(actions_for(recompute=recompute), unlimited=True)
        fits = cand.fits and cand.timeline.peak_memory_bytes <= search.budget_bytes
        if fits and (best is None or rank(cand) < rank(best)):
            best = cand
    return best


def every_recompute_only_plan(search: Search, floor: Candidate | None) -> Candidate | None:
    """Rule 2: with few enough candidates (2^n within half the wide search's allowance), the
    fastest recompute-only plan replaces the floor if it is better."""
    count = 2 ** len(search.facts.candidates)
    if count > search.wide_left // 2:
        return floor
    exact = best_recompute_only(search)
    search.wide_left -= count
    if exact is not None and (floor is None or rank(exact) < rank(floor)):
        return exact
    return floor


def fit_fewer_swaps(search: Search, accepted: list[str], make_family, *, tries: int = 8,
                    floor_of: Callable[[list[str]], Callable[[int], float]] | None = None) -> list[Candidate]:
    """Rule 6's fallback when a family cannot be sized: its far end (every accepted swap,
    everything else recomputed) may not fit, because copies back hold memory in backward that
    rebuilding would not. Bisect for the longest prefix of the accepted list whose far end fits
    (taking fewer swaps lowers that memory), and size it and the first prefix of 7/8, 6/8, ...
    of the list whose far end fits (it leaves the knapsack more room): both are start
    candidates (docs/planners.md, rule 6, has the cases that needed both). ``floor_of(prefix)``: the
    step time floor of ``make_family(prefix)`` (``size``)."""
    everything = keep_all_peak_bytes(search.facts)  # a need no family can meet: its far end

    def far_end_fits(length: int) -> bool:
        return search.evaluate(make_family(accepted[:length])(everything)).fits

    # The far end of a short prefix need not fit either (recomputing nearly everything rebuilds
    # long groups), so search down from the full list: 7/8 of it, 6/8, ... until one fits, then
    # bisect between that and the next longer one, which did not.
    high = len(accepted)
    low = 0
    for i in range(tries - 1, 0, -1):
        length = len(accepted) * i // tries
        if length == 0:
            break
        if far_end_fits(length):
            low = length
            break
        high = length
    if low == 0:
        return []
    first = low
    while high - low > 1:
        mid = (low + high) // 2
        if far_end_fits(mid):
            low = mid
        else:
            high = mid
    sized = []
    for length in dict.fromkeys((low, first)):
        found = size(search, make_family(accepted[:length]), floor_of(accepted[:length]) if floor_of else None)
        if found is not None:
            sized.append(found)
    return sized


def everything_swapped(search: Search) -> Candidate:
    """The lowest-memory plan: every candidate swapped (copied back just in time when the
    link-timed schedule does not fit); it fits every budget down to the minimum."""
    swap_all = search.evaluate(search.plan(actions_for(swap=search.facts.candidates)))
    if not swap_all.fits:
        from .minimum import lowest_memory_plan

        low = lowest_memory_plan(search.workload, search.budget_bytes)
        swap_all = search.evaluate(search.plan(low.actions, prefetch_step=low.prefetch_step))
    return swap_all


def heuristic_starts(search: Search) -> list[tuple[Candidate, str]]:
    """Rule 6's other starts: the other heuristics' plans that fit, when neither the floor nor
    any family fits, and always on workloads of at most HEURISTIC_STARTS_MAX_OPS ops. Everything swapped fits every budget but can stall for most of
    the step where a few copies and more recompute would not (the small profiled models of
    docs/planners.md, rule 6); starting from the best of them, the repair only improves."""
    from .capuchin import plan_capuchin
    from .full_recompute import plan_full_recompute
    from .recompute_optimal import plan_recompute_optimal
    from .selective_recompute import plan_selective_recompute
    from .slackswap_paper import plan_slackswap_paper
    from .swap_only import plan_swap_only

    found = []
    for planner in (plan_capuchin, plan_slackswap_paper, plan_recompute_optimal, plan_selective_recompute,
                    plan_full_recompute, plan_swap_only):
        start = other_policy_start(search, planner)
        if start is not None and start[0].fits:
            found.append(start)
    return found


def cannot_beat(search: Search, accepted: list[str], step_time_s: float) -> bool:
    """Whether no plan that swaps some of ``accepted`` and recomputes other candidates can fit the
    budget and run in at most ``step_time_s``: so neither the family of ``accepted`` nor any of its
    shorter prefixes (fit_fewer_swaps). A plan within the budget takes at least the keep-all peak
    less the budget off (Facts.peak_floor_bytes at the end of forward), so it recomputes at least
    that less the bytes of ``accepted``, at a step time floor that search.recompute_step_floor
    bounds (op times shared among all candidates: the recomputed set may hold some of
    ``accepted``, which the bound takes as free)."""
    facts = search.facts
    taken = set(accepted)
    floor = recompute_step_floor(search, sum(facts.size[n] for n in accepted),
                                 [n for n in facts.candidates if n not in taken], shared_by=facts.candidates)
    return floor(initial_need_bytes(search)) > step_time_s * (1 + STEP_FLOOR_MARGIN)


def sized_starts(search: Search, floor: Candidate | None, *, defer: bool = True) -> tuple[list[tuple[Candidate, str]], bool]:
    """Rules 3-6: the start candidates, the best first, each with its label: the floor, each swap
    order's family sized (or its shorter prefixes), and everything swapped when nothing else fits
    or the wide search wants one more start. Raises BudgetError when not even that fits.

    Without the wide search only rule 9 reads past the first start, and only when the repair is cut
    off: with ``defer``, a family that cannot beat the start so far (``cannot_beat``) is not sized,
    and the second item of the answer says whether one was left out (rule 9 then asks for all)."""
    facts = search.facts
    deferred = False
    start: Candidate | None = floor
    start_order = "recompute" if floor is not None else ""
    others: list[tuple[Candidate, str]] = []
    orders = swap_orders(facts)
    strict_value = windowed_swaps(facts, search.hardware, orders["value"])
    for label, ranked, spill in (("value", orders["value"], False), ("value+spill", orders["value"], True),
                                 ("early", orders["early"], False)):
        if ranked is orders["value"]:
            accepted = windowed_swaps(facts, search.hardware, ranked, spill=spill, strict=strict_value)
        else:
            accepted = windowed_swaps(facts, search.hardware, ranked, spill=spill)
        if defer and search.wide_allowance == 0 and start is not None and cannot_beat(search, accepted, start.step_time_s):
            deferred = True
            continue
        found = size(search, family(search, accepted), family_floor(search, accepted))
        sized = [found] if found is not None else fit_fewer_swaps(search, accepted, lambda a: family(search, a),
                                                                  floor_of=lambda a: family_floor(search, a))
        for found in sized:
            if start is None or found.step_time_s < start.step_time_s:
                if start is not None:
                    others.append((start, start_order))
                start, start_order = found, label
            else:
                others.append((found, label))
    heuristics_taken = False
    if start is not None and len(search.workload.ops) <= HEURISTIC_STARTS_MAX_OPS:
        others += heuristic_starts(search)
        heuristics_taken = True
    if start is None or search.wide_left > 0:
        swap_all = everything_swapped(search)
        if start is None:
            fallbacks = [(swap_all, "")] if swap_all.fits else []
            fallbacks += heuristic_starts(search)
            if not fallbacks:
                raise policy_cannot_fit(POLICY, search.budget_bytes,
                                        natural_peak_bytes(search.workload, search.hardware, swap_all.plan),
                                        "raise the budget")
            fallbacks.sort(key=lambda item: rank(item[0]))
            (start, start_order), rest = fallbacks[0], fallbacks[1:]
            others += rest
        elif swap_all.fits:
            others.append((swap_all, "all-swap"))
    # Two families can size to the same plan (a shorter swap prefix of both); the repeat and
    # copies of the start are dropped, so that rule 9's runner-up is another plan.
    others.sort(key=lambda item: rank(item[0]))
    if heuristics_taken and others and rank(others[0][0]) < rank(start):
        # Another heuristic's plan beats every start of this policy's own: it is the start.
        (start, start_order), others[0] = others[0], (start, start_order)
        others.sort(key=lambda item: rank(item[0]))
    distinct = {tuple(start.plan.actions.items())}
    starts = [(start, start_order)]
    for other, label in others:
        key = tuple(other.plan.actions.items())
        if key not in distinct:
            distinct.add(key)
            starts.append((other, label))
    return starts, deferred


def repair_other_starts(search: Search, starts, result: RepairResult, label: str) -> tuple[RepairResult, str]:
    """Rule 8: with the wide search, the other starts, best first, are repaired while the
    allowance lasts; the best result wins."""
    for other, other_label in starts[1:]:
        if search.wide_left <= 0:
            break
        found = repair(search, other, wide=True, max_simulations=search.wide_left)
        search.wide_left -= found.simulations
        if rank(found.best) < rank(result.best):
            result, label = found, other_label
    return result, label


def repair_runner_up(search: Search, starts, result: RepairResult, label: str,
                     all_starts: Callable[[], list] | None = None) -> tuple[RepairResult, str]:
    """Rule 9: without the wide search, when the best start's repair was cut off by its cap
    (still improving), the runner-up start gets a repair of its own and the faster result wins.
    Gated on the cap, so a repair that ends in a local optimum costs nothing more. ``all_starts``:
    where ``starts`` left families out (sized_starts), the whole list."""
    if search.wide_allowance == 0 and result.simulations >= MAX_SIMULATIONS and all_starts is not None:
        starts = all_starts()
    if search.wide_allowance == 0 and len(starts) > 1 and result.simulations >= MAX_SIMULATIONS:
        other, other_label = starts[1]
        found = repair(search, other)
        search.targeted_simulations += found.simulations
        if rank(found.best) < rank(result.best):
            result, label = found, other_label
    return result, label


def exact_where_cheap(search: Search, best: Candidate) -> tuple[Candidate, str | None]:
    """Rule 10: with at most EXACT_MAX_CANDIDATES candidates, a branch and bound over every
    assignment, started from ``best``; returns its plan and whether the search completed."""
    if len(search.facts.candidates) > EXACT_MAX_CANDIDATES:
        return best, None
    exact = branch_and_bound(search, best)
    search.targeted_simulations += exact.simulations
    return exact.best, "complete" if exact.complete else "cut off"


def paper_plan_if_faster(search: Search, best: Candidate) -> RepairResult | None:
    """Rule 11: the paper's rule (`slackswap-paper`) planned once more; where its plan simulates
    faster than this search's answer it is repaired and becomes the answer, so the policy is never
    below the paper's. Rule 6 covers small workloads; on the built-in llama-7b the copy rules of
    docs/simulator.md (queued launches overlap) left the search 0.15-0.22 points below it at 20-25 %."""
    from .slackswap_paper import paper_plan, plan_slackswap_paper

    def paper_if_faster(workload: Workload, hardware: Hardware, budget_bytes: int) -> Plan | None:
        # The paper's plan where it is remembered (rule 6 took it as a start); else sized wanting
        # only a plan at most as fast as ``best`` (the same plan where there is one, else None).
        if (hardware, budget_bytes) in workload_memo(search.facts, "slackswap-paper"):
            return plan_slackswap_paper(workload, hardware, budget_bytes)
        return paper_plan(workload, hardware, budget_bytes, beat_s=best.step_time_s)

    start = other_policy_start(search, paper_if_faster, cutoff_s=best.step_time_s)
    if start is None:
        return None
    cand = start[0]
    if not cand.fits or rank(cand) >= rank(best):
        return None
    found = repair(search, cand)
    search.targeted_simulations += found.simulations
    return found


def plan_slackswap(workload: Workload, hardware: Hardware, budget_bytes: int) -> Plan:
    search = Search(workload, hardware, budget_bytes, POLICY)
    floor = link_free_floor(search)                                   # rule 1
    grant_wide_search(search)
    floor = every_recompute_only_plan(search, floor)                  # rule 2
    starts, deferred = sized_starts(search, floor)                    # rules 3-6
    result = repair(search, starts[0][0], wide=True)                  # rule 7
    search.targeted_simulations += result.simulations
    label = starts[0][1]
    result, label = repair_other_starts(search, starts, result, label)  # rule 8
    result, label = repair_runner_up(search, starts, result, label,  # rule 9
                                     (lambda: sized_starts(search, floor, defer=False)[0]) if deferred else None)
    best, exact_search = exact_where_cheap(search, result.best)       # rule 10
    moves = result.moves
    if best is not result.best:
        moves, label = 0, "exact"
    paper = paper_plan_if_faster(search, best)                        # rule 11
    if paper is not None:
        best, moves, label = paper.best, paper.moves, "slackswap-paper"
    info = {"exact_search": exact_search} if exact_search is not None else {}
    return with_info(best.plan, rule="windowed swaps + knapsack recompute + simulator repair",
                     start_order=label, repair_moves=moves, simulations=search.simulations,
                     predicted_step_time_s=best.step_time_s, **info)
