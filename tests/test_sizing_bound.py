"""The sizing loop's step time bound (search.recompute_step_floor, selection.fit_need's
``step_floor_from``): a bound by hand, a bound under every plan of real families, and the same
answers as the sizing without it on random families, including those where a probe taken to clear
does not."""

from __future__ import annotations

import math
import random
import types

import pytest

from slackswap.hardware import PRESETS
from slackswap.planners import selection
from slackswap.planners import slackswap as planner
from slackswap.planners.search import STEP_FLOOR_MARGIN, Search, recompute_step_floor
from slackswap.sim import simulate_ideal
from slackswap.workloads.models import build_model_workload
from slackswap.workloads.synthetic import chain, dag


def shared_transient_workload():
    # a and b are both made from the transient t: rebuilding either re-runs op0 (4 s).
    return dag([("op0", ["x"], ["t"]), ("op1", ["t"], ["a"]), ("op2", ["t"], ["b"]), ("op3", ["a", "b"], ["y"])],
               {"x": 1, "t": 50, "a": 100, "b": 300, "y": 1}, {"x": ["op0"], "a": ["op3"], "b": ["op3"]},
               fwd_time_s={"op0": 4.0, "op1": 1.0, "op2": 2.0, "op3": 1.0})


def test_the_floor_by_hand():
    """op0's 4 s are shared by a and b (2 s each): a costs 3 s for 100 B, b 4 s for 300 B, so b
    comes first; the floor is the ideal step (8 s forward + 8 s backward) plus the fractional
    knapsack of those shares, after the swapped bytes."""
    workload = shared_transient_workload()
    search = Search(workload, PRESETS["a100-80gb-pcie4"], 10**6, "test")
    floor = recompute_step_floor(search, 0, ["a", "b"])
    assert workload.ideal_step_time_s == 16.0
    assert [floor(n) for n in (-5, 0, 150, 300, 350, 400, 10**6)] == [16.0, 16.0, 18.0, 20.0, 21.5, 23.0, 23.0]
    assert recompute_step_floor(search, 100, ["a", "b"])(250) == pytest.approx(16.0 + 4.0 * 150 / 300)
    assert recompute_step_floor(search, 0, ["a"])(50) == 16.0 + 5.0 * 50 / 100  # op0 and op1 wholly a's
    # The plans' own floors: recomputing both re-runs op0, op1, op2 (7 s), b alone op0 and op2 (6 s).
    both = search.plan({"a": selection.Action.RECOMPUTE, "b": selection.Action.RECOMPUTE})
    alone = search.plan({"b": selection.Action.RECOMPUTE})
    assert (search.step_floor_s(both), search.step_floor_s(alone)) == (23.0, 22.0)


@pytest.mark.parametrize("name", ["bert-large", "gpt2-xl"])
def test_the_floor_is_under_every_plan_of_a_family_from_its_need_on(name):
    """For the families of `slackswap` (no swap, and the value order's accepted swaps), at needs
    from none to everything, the floor at a need is at most the step time floor of the family's
    plan at that need and at every larger one."""
    hw = PRESETS["a100-80gb-pcie4"]
    workload = build_model_workload(name, hw, layers=4)
    search = Search(workload, hw, int(0.5 * simulate_ideal(workload, hw).peak_memory_bytes), "test")
    total = selection.keep_all_peak_bytes(search.facts)
    value = planner.windowed_swaps(search.facts, hw, planner.swap_orders(search.facts)["value"])
    assert value
    for accepted in ([], value):
        make, floor = planner.family(search, accepted), planner.family_floor(search, accepted)
        needs = [total * i // 40 for i in range(41)]
        floors = [floor(n) for n in needs]
        plans = [search.step_floor_s(make(n)) for n in needs]
        assert floors == sorted(floors) and floors[0] == workload.ideal_step_time_s
        for i, at_least in enumerate(floors):
            assert at_least <= min(plans[i:]) * (1 + STEP_FLOOR_MARGIN)
        assert max(floors) > workload.ideal_step_time_s  # the bound says something


def fake_family(breaks, cost, wait, peak, extra, budget_bytes):
    """A family of plans for fit_need, without a simulator: plan k holds from need ``breaks[k-1]``
    on, takes 1 s plus ``cost[k]`` (non-decreasing) plus ``wait[k]``, peaks at ``peak[k]``, and when
    that is over the budget by at most 40 B fits under it ``extra[k]`` later. Returns its evaluate,
    ``floor(need)`` (1 s plus the cost of the plan at the need) and ``plan_of(need)``."""
    def plan_of(need: int) -> int:
        return sum(b <= need for b in breaks)

    def evaluate(need, *, unlimited=False, cutoff_s=None):
        k = plan_of(need)
        step = 1.0 + cost[k] + wait[k]
        if not unlimited and peak[k] > budget_bytes:
            step = step + extra[k] if peak[k] <= budget_bytes + 40 else float("inf")
        return types.SimpleNamespace(fits=step != float("inf"), step_time_s=step, need=need,
                                     timeline=types.SimpleNamespace(peak_memory_bytes=peak[k]))

    return evaluate, (lambda need: 1.0 + cost[plan_of(need)]), plan_of


def sized(monkeypatch, family, start: int, *, bounded: bool, stalls: bool = True, beat_s: float | None = None):
    """fit_need over a fake family from ``start``, with the bound or without; returns its answer
    and what it did, in order: ("make", need), ("bound", need), ("simulate", need, unlimited)."""
    evaluate, floor, _ = family
    search = Search(chain(4), PRESETS["a100-80gb-pcie4"], 120, "test")
    events: list[tuple] = []

    def counted(need, *, unlimited=False, cutoff_s=None):
        events.append(("simulate", need, unlimited))
        return evaluate(need, unlimited=unlimited, cutoff_s=cutoff_s)

    def make(need: int) -> int:
        events.append(("make", need))
        return need

    def bound(need: int) -> float:
        events.append(("bound", need))
        return floor(need)

    monkeypatch.setattr(search, "evaluate", counted)
    best = selection.fit_need(search, start, make, allow_memory_stalls=stalls, rounds=14,
                              step_floor_from=bound if bounded else None, beat_s=beat_s)
    return best, events


def test_a_wrong_guess_is_found_and_its_best_is_the_answer(monkeypatch):
    """From need 100 (plan A: over the budget, fits it waiting, 1.05 s) the sizing grows to 130
    (plan H: clears, 1.10 s) and bisects. Its probe 115 (plan M, 1.06 s at least) cannot beat A, so
    it is taken to clear; it does not (it peaks 50 B over). Below it, 108 finds plan B, which clears
    in 1.01 s; but the sizing that simulates 115 goes on above it and answers A. The check of the
    guess simulates 115, finds it does not clear, and answers A too."""
    #         A: 100..104  B: 105..109  M: 110..124  H: 125..
    family = fake_family([100, 105, 110, 125], cost=[0.0, 0.0, 0.01, 0.06, 0.10], wait=[0.0] * 5,
                         peak=[250, 150, 110, 170, 100], extra=[0.0, 0.05, 0.0, 0.0, 0.0], budget_bytes=120)
    full, events_full = sized(monkeypatch, family, 100, bounded=False)
    bounded, events = sized(monkeypatch, family, 100, bounded=True)
    assert ("simulate", 115, True) in events_full and ("make", 108) not in events_full
    assert (full.need, full.step_time_s) == (100, 1.05)
    assert (bounded.need, bounded.step_time_s) == (100, 1.05)
    at = events.index(("bound", 115))
    assert events[at + 1] == ("bound", 108) and ("make", 108) in events  # guessed, then B found below
    assert events[-2:] == [("make", 115), ("simulate", 115, True)]  # the check


def test_the_bound_gives_the_sizing_without_it_on_random_families(monkeypatch):
    """300 random families (plans changing at random needs, costs rising, random waits, peaks
    falling about a byte per byte of need with random bumps), with and without waits for memory:
    the same plan as the sizing that simulates every probe, with fewer simulations in all; and
    with ``beat_s``, that plan where it runs in at most ``beat_s``, else None."""
    rng = random.Random(11)
    simulations = {False: 0, True: 0}
    for case in range(300):
        breaks = sorted(rng.sample(range(1, 700), rng.randint(5, 40)))
        count = len(breaks) + 1
        cost = [0.0]
        for _ in range(count - 1):
            cost.append(cost[-1] + rng.random() * 0.01)
        clears = rng.randint(100, 500)  # about where the plans come within the budget
        family = fake_family(
            breaks, cost, wait=[rng.choice([0.0, 0.0, rng.random() * 0.005]) for _ in range(count)],
            peak=[120 + clears - ([0] + breaks)[k] + rng.choice([0, 0, rng.randint(-30, 40)]) for k in range(count)],
            extra=[rng.random() * 0.002 for _ in range(count)], budget_bytes=120)
        start, stalls = max(0, clears - rng.randint(0, 60)), case % 2 == 0
        found = {}
        for bounded in (False, True):
            best, events = sized(monkeypatch, family, start, bounded=bounded, stalls=stalls)
            found[bounded] = None if best is None else (best.need, best.step_time_s)
            # A plan simulated again is answered from the search's memo: count each plan and limit once.
            simulations[bounded] += len({(family[2](e[1]), e[2]) for e in events if e[0] == "simulate"})
        assert found[True] == found[False], case
        # Wanting only a plan at most as fast as a bar: the same plan where it is, else None.
        if found[False] is not None:
            for beat_s in (found[False][1], math.nextafter(found[False][1], 0.0), found[False][1] + 0.003):
                best, _ = sized(monkeypatch, family, start, bounded=True, stalls=stalls, beat_s=beat_s)
                wanted = found[False] if found[False][1] <= beat_s else None
                assert (None if best is None else (best.need, best.step_time_s)) == wanted, (case, beat_s)
    assert simulations[True] < simulations[False]


@pytest.mark.parametrize("name", ["bert-large", "gpt2-xl"])
def test_cannot_beat_is_under_every_sized_plan_of_an_order_and_its_prefixes(name):
    """For each swap order's accepted list and two shorter prefixes, at three budgets: the step
    time of the family's sized plan (where one fits) is never one cannot_beat rules out, and the
    bound says something (it rules out the ideal step where the accepted bytes fall short of the
    need)."""
    hw = PRESETS["a100-80gb-pcie4"]
    workload = build_model_workload(name, hw, layers=4)
    ruled_out = 0
    for fraction in (0.3, 0.5, 0.7):
        search = Search(workload, hw, int(fraction * simulate_ideal(workload, hw).peak_memory_bytes), "test")
        orders = planner.swap_orders(search.facts)
        for ranked, spill in ((orders["value"], False), (orders["value"], True), (orders["early"], False)):
            accepted = planner.windowed_swaps(search.facts, hw, ranked, spill=spill)
            for prefix in (accepted, accepted[: len(accepted) * 3 // 4], accepted[: len(accepted) // 2]):
                found = planner.size(search, planner.family(search, prefix), planner.family_floor(search, prefix))
                if found is not None:
                    assert not planner.cannot_beat(search, prefix, found.step_time_s)
                ruled_out += planner.cannot_beat(search, prefix, workload.ideal_step_time_s)
    assert ruled_out > 0


def test_a_family_left_out_changes_no_plan_even_when_rule_9_reads_the_runner_up(monkeypatch):
    """llama-7b at 50 %: the early order's family cannot beat the value order's start and is not
    sized. With rule 9 made to fire after any repair (its cap read as one simulation), the whole
    list of starts is made and the plan is the one made with no family left out."""
    hw = PRESETS["a100-80gb-pcie4"]
    workload = build_model_workload("llama-7b", hw)
    budget = int(0.5 * simulate_ideal(workload, hw).peak_memory_bytes)
    search = Search(workload, hw, budget, "slackswap")
    starts, deferred = planner.sized_starts(search, None)
    complete, none_left = planner.sized_starts(search, None, defer=False)
    assert deferred and not none_left
    assert starts[0] == complete[0] and "early" in {label for _, label in complete} - {label for _, label in starts}
    monkeypatch.setattr(planner, "MAX_SIMULATIONS", 1)
    asked = []
    real = planner.sized_starts

    def spied(search, floor, *, defer=True):
        asked.append(defer)
        return real(search, floor, defer=defer)

    monkeypatch.setattr(planner, "sized_starts", spied)
    with_deferral = planner.plan_slackswap(build_model_workload("llama-7b", hw), hw, budget)
    assert asked == [True, False]
    monkeypatch.setattr(planner, "cannot_beat", lambda *args: False)
    without = planner.plan_slackswap(build_model_workload("llama-7b", hw), hw, budget)
    assert with_deferral.actions == without.actions and with_deferral.info == without.info
