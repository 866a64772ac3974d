"""`slackswap` (default): SlackSwap improved, where the simulator shows a gain.

Rules (docs/planners.md explains each with its reason):

1. Per-tensor slack windows. A tensor may leave only after it is made and must be back
   before its first backward use. Instead of one global slack figure, every candidate
   swap is checked against the copy streams as they are already booked
   (copies.round_trip_fits): FIFO copies out in production order, copies back
   earliest-use first, each after its own copy out.
2. Latency- and duplex-aware copies: each copy pays the per-copy latency, and copies back
   that overlap copies out run at the duplex-slowed rate.
3. Swap the tensors most expensive to rebuild per byte, as the paper does, while they fit
   their windows; then choose the recompute set that takes the remaining bytes off for
   the least rebuild time (a knapsack, not a greedy order).
4. Size the plan to the budget with the simulator (selection.fit_need), accepting short
   waits for memory when they are cheaper than more recompute. When even a family's far end
   (all its swaps, everything else recomputed) does not fit, size it again with a shorter
   prefix of its swaps (fit_fewer_swaps): copies back hold memory that rebuilds do not.
5. Repair with the simulator (repair.py): turn a swap whose copy stalls into a
   recompute, a recompute into a swap where the link has room, and a recompute or swap
   into a keep where memory has room, one change at a time, keeping a change only if the
   simulated step gets faster (or stays as fast with less recompute), until no single change
   tried is better.
6. Link-free floor: the recompute-only family, sized and repaired without adding swaps, is the
   first start candidate; when no knapsack set fits, a peak descent from recomputing everything
   (keep one op at a time while the peak drops) gives it. It makes no copy, so it is the same plan
   on every link, and the result is never slower than it (docs/planners.md: what this guarantees
   about more bandwidth, and what it does not).
7. Wider search when it is cheap: a planning call may spend WIDE_SEARCH_OP_SIMULATIONS op-simulations
   (simulations times ops) beyond rules 4-6: (a) when every recompute-only plan fits in half of
   it, all are tried and the fastest that fits is the floor (best_recompute_only); (b) a repair
   round whose proposals all fail goes on to a polish (every single change, then every pair of
   one-tensor changes: repair.py); (c) the other start candidates (the other families, the
   floor, everything swapped) are repaired too, best first. On a workload of a few ops that is
   hundreds of simulations. When the allowance cannot pay for one pass over every single change
   (3 per candidate tensor), rule 7 is off: on the built-in models (250-500 ops, 370-730
   candidates) it allows 8-16 simulations, so their plans and planning time are unchanged.
8. A second trajectory when rule 7 is off and the best start's repair was cut off by its cap
   (still improving): the runner-up start is repaired too and the faster result wins. On
   llama-7b at 20 % of its peak the best start's repair ran out at 2014.4 ms, below
   `slackswap-paper` (2013.6 ms); the runner-up's ends at 2007.7 ms. Continuing the first repair
   to 128 simulations reaches only 2014.4 ms. Gated on the cap so that plans whose repair ends
   in a local optimum (llama-7b at 50 %, 0.76 s) pay nothing.
9. Exact where it is cheap: with at most EXACT_MAX_CANDIDATES candidate tensors, a branch and bound
   over every keep / swap / recompute assignment (exact.py), started from rules 1-8's plan, within
   EXACT_MAX_SIMULATIONS. When it finishes (plan info ``exact_search: complete``) no assignment
   simulates faster; the built-in models (370-730 candidates) never qualify.
"""

from __future__ import annotations

import math

from ..hardware import Hardware
from ..plans import Plan
from ..workload import Workload
from .common import build, evaluate, facts_for, natural_peak_bytes, policy_cannot_fit, with_info
from .copies import WindowBooking
from .exact import EXACT_MAX_CANDIDATES, branch_and_bound
from .repair import MAX_SIMULATIONS, Spare, _rank, repair
from .selection import actions_for, fit_need, keep_all_peak_bytes, knapsack_min_time, op_items

POLICY = "slackswap"
# Rule 7's allowance. A simulation's cost grows with the op count, so this buys hundreds of
# simulations (tens of milliseconds) for a few-op workload; it is measured against a brute-force
# search in tests/test_brute_force.py.
WIDE_SEARCH_OP_SIMULATIONS = 4000


def windowed_swaps(facts, hardware: Hardware, ranked: list[str], *, spill: bool = False) -> list[str]:
    """Rules 1-3: tensors in ``ranked`` order whose copies fit their windows, in the order they
    were accepted. A plan that needs fewer bytes off takes a prefix of this list (the greedy
    would have stopped there), so it is computed once per plan.

    Copies out must end before the forward pass does (they then free memory before the
    peak). With ``spill``, a second pass appends the tensors whose copies out may run into
    backward as long as every copy back still lands before its first use: such a tensor
    leaves the device after the peak has passed, which backward's own frees may absorb (the
    simulator decides), so they come after every strict swap."""
    booking = WindowBooking(facts, hardware)
    swapped: list[str] = []
    for deadline in (facts.forward_time_s, None) if spill else (facts.forward_time_s,):
        taken = set(swapped)
        for name in ranked:
            if name not in taken and booking.fits(name, out_deadline_s=deadline):
                booking.add(name)
                swapped.append(name)
                taken.add(name)
    return swapped


def swap_orders(facts) -> dict[str, list[str]]:
    """Rule 3's two orders of candidates for the link.

    ``value``: costliest to rebuild per byte first (the paper's ranking: each byte the link
    carries saves the most recompute). ``early``: in production order, since a tensor made
    early has the longest window and FIFO copies out from the first op keep the link busy
    from the start, so the link carries the most bytes in total; it wins when the bytes to
    take off barely exceed what the link can carry and a little recompute covers the rest."""
    order = facts.production_order
    value = sorted(facts.candidates, key=lambda n: (-facts.rebuild_time_s[n] / facts.size[n], order[n]))
    return {"value": value, "early": list(facts.candidates)}


def recompute_peak_descent(workload: Workload, hardware: Hardware, budget_bytes: int, memo: dict,
                           *, max_simulations: int = 64):
    """Rule 6's second way to a link-free start, for when no knapsack set fits: from recomputing
    everything, keep one producer's tensors at a time, each round the keep that lowers the
    unlimited simulated peak most (then the fastest), until the peak is within the budget.

    Rebuilding in backward holds a whole recompute group, so recomputing more can raise the peak
    (a large tensor re-created next to others); the sets the knapsack grows into then never fit,
    while keeping such a tensor does. No plan here copies anything: the same on every link."""
    facts = facts_for(workload)
    recomputed = list(facts.candidates)
    current = evaluate(workload, hardware,
                       build(workload, hardware, actions_for(recompute=recomputed), POLICY, budget_bytes),
                       math.inf, memo)
    simulations = 1
    while current.timeline.peak_memory_bytes > budget_bytes and simulations < max_simulations:
        best = None
        for item in op_items(facts, recomputed):
            if simulations >= max_simulations:
                break
            kept = set(item)
            rest = [n for n in recomputed if n not in kept]
            cand = evaluate(workload, hardware,
                            build(workload, hardware, actions_for(recompute=rest), POLICY, budget_bytes),
                            math.inf, memo)
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


def best_recompute_only(workload: Workload, hardware: Hardware, budget_bytes: int, memo: dict):
    """Rule 7 (a): the fastest plan that only keeps or recomputes, by trying every such plan.

    Without copies nothing frees memory while compute waits, so such a plan fits exactly when
    its unlimited peak is within the budget, and then runs in its unlimited time: the answer is
    the same on every link and can only get faster as the budget grows."""
    facts = facts_for(workload)
    best = None
    for mask in range(2 ** len(facts.candidates)):
        recompute = [n for i, n in enumerate(facts.candidates) if mask >> i & 1]
        plan = build(workload, hardware, actions_for(recompute=recompute), POLICY, budget_bytes)
        cand = evaluate(workload, hardware, plan, math.inf, memo)
        fits = cand.fits and cand.timeline.peak_memory_bytes <= budget_bytes
        if fits and (best is None or _rank(cand) < _rank(best)):
            best = cand
    return best


def fit_fewer_swaps(workload: Workload, hardware: Hardware, budget_bytes: int, initial_need: int,
                    accepted: list[str], family, memo: dict, *, tries: int = 8):
    """Rule 4's fallback when a family cannot be sized: its far end (every accepted swap,
    everything else recomputed) may not fit, because copies back hold memory in backward that
    rebuilding would not. Bisect for the longest prefix of the accepted list whose far end fits
    (taking fewer swaps lowers that memory), and size it and the first prefix of 7/8, 6/8, ...
    of the list whose far end fits (it leaves the knapsack more room): both are start
    candidates. Without it a faster link, accepting more swaps, could lose every family that a
    slower link fits (bert-large at 20 % of its peak, 2x PCIe 4.0: 284 ms from everything
    swapped, where 1.5x gives 136 ms); the 1/8 steps alone lost most of the family on a link
    10 % faster (llama-7b at 20 %: 264 swaps fit at x1, 272 at x1.1 do not, and 238 gave
    2098 ms against 2025 ms)."""
    everything = keep_all_peak_bytes(facts_for(workload))  # a need no family can meet: its far end

    def far_end_fits(length: int) -> bool:
        return evaluate(workload, hardware, family(accepted[:length])(everything), budget_bytes, memo).fits

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
        found = fit_need(workload, hardware, budget_bytes, initial_need, family(accepted[:length]),
                         allow_memory_stalls=True, rounds=14, memo=memo)
        if found is not None:
            sized.append(found)
    return sized


def plan_slackswap(workload: Workload, hardware: Hardware, budget_bytes: int) -> Plan:
    facts = facts_for(workload)

    def family(accepted: list[str]):
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
            return build(workload, hardware, actions_for(swapped, recompute), POLICY, budget_bytes)
        return make

    orders = swap_orders(facts)
    families = (("value", orders["value"], False), ("value+spill", orders["value"], True),
                ("early", orders["early"], False))
    memo: dict = {}
    initial_need = keep_all_peak_bytes(facts) - budget_bytes
    start = None
    start_order = ""
    # Rule 6, the link-free floor: the recompute-only family, sized and then repaired without ever
    # adding a swap. No plan on this path copies anything, so the path and its result are the same
    # on every link; as a start candidate it bounds the result on any link (docs/planners.md).
    floor = fit_need(workload, hardware, budget_bytes, initial_need, family([]),
                     allow_memory_stalls=True, rounds=14, memo=memo)
    if floor is None:
        floor = recompute_peak_descent(workload, hardware, budget_bytes, memo)
    floor_simulations = 0
    if floor is not None:
        floor_repair = repair(workload, hardware, floor, budget_bytes, memo=memo, allow_swaps=False)
        floor, floor_simulations = floor_repair.best, floor_repair.simulations
    spare = Spare(WIDE_SEARCH_OP_SIMULATIONS // max(1, len(workload.ops)))
    if spare.left < 3 * len(facts.candidates):
        # Too few to try every single change once: rule 7 would only add arbitrary probes.
        spare.left = 0
    allowance = spare.left
    if 2 ** len(facts.candidates) <= spare.left // 2:
        # Rule 7 (a): few enough candidates to try every recompute-only plan.
        exact = best_recompute_only(workload, hardware, budget_bytes, memo)
        spare.left -= 2 ** len(facts.candidates)
        if exact is not None and (floor is None or _rank(exact) < _rank(floor)):
            floor = exact
    if floor is not None:
        start, start_order = floor, "recompute"
    others = []
    for label, ranked, spill in families:
        accepted = windowed_swaps(facts, hardware, ranked, spill=spill)
        found = fit_need(workload, hardware, budget_bytes, initial_need, family(accepted),
                         allow_memory_stalls=True, rounds=14, memo=memo)
        sized = [found] if found is not None else \
            fit_fewer_swaps(workload, hardware, budget_bytes, initial_need, accepted, family, memo)
        for found in sized:
            if start is None or found.step_time_s < start.step_time_s:
                if start is not None:
                    others.append((start, start_order))
                start, start_order = found, label
            else:
                others.append((found, label))
    swap_all = None
    if start is None or spare.left > 0:
        # The lowest-memory plan (everything swapped) fits every budget down to the minimum: the
        # start when not even the recompute-everything end of a family fits (the repair turns
        # stalling swaps into recomputes), otherwise one more start for rule 7.
        plan = build(workload, hardware, actions_for(swap=facts.candidates), POLICY, budget_bytes)
        swap_all = evaluate(workload, hardware, plan, budget_bytes, memo)
        if not swap_all.fits:
            from .minimum import lowest_memory_plan

            low = lowest_memory_plan(workload, budget_bytes)
            plan = build(workload, hardware, low.actions, POLICY, budget_bytes, prefetch_step=low.prefetch_step)
            swap_all = evaluate(workload, hardware, plan, budget_bytes, memo)
        if start is None:
            if not swap_all.fits:
                raise policy_cannot_fit(POLICY, budget_bytes, natural_peak_bytes(workload, hardware, plan),
                                        "raise the budget")
            start, start_order, swap_all = swap_all, "", None
    if swap_all is not None and swap_all.fits:
        others.append((swap_all, "all-swap"))
    result = repair(workload, hardware, start, budget_bytes, memo=memo, spare=spare)
    repair_simulations = floor_simulations + result.simulations
    # Rule 7 (c): the other starts, best first, while the spare lasts. Two families can size to
    # the same plan (a shorter swap prefix of both); the repeat and copies of the start are
    # dropped, so that rule 8's runner-up is another plan.
    others.sort(key=lambda item: _rank(item[0]))
    distinct = {tuple(start.plan.actions.items())}
    unique = []
    for other, label in others:
        key = tuple(other.plan.actions.items())
        if key not in distinct:
            distinct.add(key)
            unique.append((other, label))
    others = unique
    for other, label in others:
        if spare.left <= 0:
            break
        found = repair(workload, hardware, other, budget_bytes, memo=memo, spare=spare,
                       max_simulations=spare.left)
        spare.left -= found.simulations
        if _rank(found.best) < _rank(result.best):
            result, start_order = found, label
    if allowance == 0 and others and result.simulations >= MAX_SIMULATIONS:
        # Rule 8: the best start's repair was cut off still improving; the runner-up start gets
        # a repair of its own, and the faster result wins.
        other, label = others[0]
        found = repair(workload, hardware, other, budget_bytes, memo=memo)
        repair_simulations += found.simulations
        if _rank(found.best) < _rank(result.best):
            result, start_order = found, label
    simulations = repair_simulations + allowance - spare.left
    best, moves, exact_search = result.best, result.moves, None
    if len(facts.candidates) <= EXACT_MAX_CANDIDATES:
        # Rule 9: few enough candidates for an exact search, started from what rules 1-8 found.
        exact = branch_and_bound(workload, hardware, budget_bytes, best, memo, policy=POLICY)
        simulations += exact.simulations
        exact_search = "complete" if exact.complete else "cut off"
        if exact.best is not best:
            best, moves, start_order = exact.best, 0, "exact"
    info = {"exact_search": exact_search} if exact_search is not None else {}
    return with_info(best.plan, rule="windowed swaps + knapsack recompute + simulator repair",
                     start_order=start_order,
                     repair_moves=moves, simulations=simulations,
                     predicted_step_time_s=best.step_time_s, **info)
