"""Rule 10 of `slackswap`: the branch and bound (planners/exact.py).

Its answer is only exact if every bound it prunes with is a true lower bound, so each bound is
checked against the simulator on every assignment of random tiny workloads, and the search
itself against tests/brute_force.py (test_brute_force.py) and hand-solved chains here.
"""

from __future__ import annotations

import itertools
import math

import pytest
from brute_force import ACTIONS, candidates
from hypothesis import given, settings
from hypothesis import strategies as st
from test_invariants import PROPERTY, _slow_link, _workload, budget_between, budget_points, hardware, workloads

from slackswap.hardware import PRESETS
from slackswap.planners import plan_workload
from slackswap.planners.common import build, evaluate
from slackswap.planners.exact import EXACT_MAX_CANDIDATES, Bounds, branch_and_bound, one_stream_bound
from slackswap.planners.search import Search
from slackswap.plans import Action
from slackswap.sim import simulate, simulate_ideal
from slackswap.workloads.models import build_model_workload

REL = 1e-9


# ---- one stream of copies -----------------------------------------------------------------------

def test_one_stream_bound_on_a_hand_solved_pair():
    """Copy a (ready 0 s, 2 s, 1 s after) and b (ready 1 s, 2 s, 5 s after). b first: 1-3 s, then
    5 s more (8 s); a runs 3-5 s, then 1 s (6 s): 8 s. a first: b ends at 4 s, then 9 s. Best 8 s,
    which the subset {b} gives: ready 1 s + 2 s + 5 s."""
    assert one_stream_bound([(0.0, 2.0, 1.0), (1.0, 2.0, 5.0)]) == 8.0
    assert one_stream_bound([]) == 0.0


def best_order_end_s(jobs) -> float:
    """Oracle: the least end over every order of the copies, each started as early as it can."""
    best = math.inf
    for order in itertools.permutations(jobs):
        clock, end = 0.0, 0.0
        for ready_s, copy_s, after_s in order:
            clock = max(clock, ready_s) + copy_s
            end = max(end, clock + after_s)
        best = min(best, end)
    return best


jobs = st.lists(st.tuples(*(st.floats(0, 10, allow_nan=False),) * 3), min_size=1, max_size=5)


@settings(PROPERTY)
@given(jobs=jobs)
def test_one_stream_bound_never_exceeds_the_best_order(generated_cases, jobs):
    generated_cases["exact search: stream bound vs every order"] += 1
    bound = one_stream_bound(jobs)
    assert bound <= best_order_end_s(jobs) * (1 + REL) + 1e-12
    if len(jobs) == 1:
        assert bound == pytest.approx(sum(jobs[0][i] for i in range(3)))


# ---- the bounds, against the simulator on every assignment ------------------------------------

@settings(PROPERTY, max_examples=40)
@given(workload=workloads(max_ops=5), hw=hardware())
def test_bounds_hold_for_every_assignment(generated_cases, workload, hw):
    names = candidates(workload)
    if len(names) > 6:  # 3**6 simulations per case at most
        return
    generated_cases["exact search: workloads whose every assignment is checked against the bounds"] += 1
    bounds = Bounds(workload, hw)
    size = {t.name: t.size_bytes for t in workload.tensors}
    for choice in itertools.product(ACTIONS, repeat=len(names)):
        actions = dict(zip(names, choice))
        # no memory limit: every assignment runs, and presence in memory does not depend on it
        t = evaluate(workload, hw, build(workload, hw, actions, "check", None), math.inf).timeline
        recomputed = [n for n, a in actions.items() if a is Action.RECOMPUTE]
        swapped = [n for n, a in actions.items() if a is Action.SWAP]
        kept = [n for n, a in actions.items() if a is Action.KEEP]
        assert bounds.step_time_s(recomputed, swapped) <= t.step_time_s * (1 + REL) + 1e-12, actions
        assert bounds.peak_bytes(kept, size) <= t.peak_memory_bytes, actions


# ---- the search ------------------------------------------------------------------------------------

CHAIN = _workload([("op0", ["x"], ["t0"], 1.0, 2.0), ("op1", ["x"], ["t1"], 1.0, 2.0)],
                  [("x", 15, None, ["op0"]), ("t0", 100, "op0", ["op0"]), ("t1", 100, "op1", ["op1"])])


def start(workload, hw, budget, actions):
    return evaluate(workload, hw, build(workload, hw, actions, "start", budget), budget, {})


@pytest.mark.parametrize("rate, incumbent, expected_s, expected", [
    # fast link: from recomputing both (8 s), swapping t0 is best (6 s + two 0.1 ms copies)
    (1e6, {"t0": Action.RECOMPUTE, "t1": Action.RECOMPUTE}, 6.0 + 2e-4, Action.SWAP),
    # 1 B/s: a copy takes 100 s; from swapping t0 (206 s), recomputing it is best (7 s)
    (1.0, {"t0": Action.SWAP, "t1": Action.KEEP}, 7.0, Action.RECOMPUTE),
])
def test_search_finds_the_hand_solved_best(rate, incumbent, expected_s, expected):
    """The chain of test_brute_force.py at 116 B: t0 and t1 cannot both stay."""
    hw = _slow_link(rate)
    first = start(CHAIN, hw, 116, incumbent)
    assert first.fits and first.step_time_s > expected_s
    found = branch_and_bound(Search(CHAIN, hw, 116, "test"), first)
    assert found.complete
    assert found.best.step_time_s == pytest.approx(expected_s)
    assert found.best.plan.actions["t0"] is expected and found.best.plan.actions["t1"] is Action.KEEP
    # the bounds leave fewer than the 3**2 assignments to simulate
    assert 1 <= found.simulations < 9


def test_search_cut_off_by_its_cap_keeps_the_incumbent_and_says_so():
    hw = _slow_link(1e6)
    first = start(CHAIN, hw, 116, {"t0": Action.RECOMPUTE, "t1": Action.RECOMPUTE})
    found = branch_and_bound(Search(CHAIN, hw, 116, "test"), first, max_simulations=0)
    assert not found.complete and found.simulations == 0 and found.best is first


def test_search_simulates_nothing_when_the_incumbent_is_ideal():
    hw = _slow_link(1e6)
    first = start(CHAIN, hw, 1000, {})  # everything kept fits: the ideal step
    found = branch_and_bound(Search(CHAIN, hw, 1000, "test"), first)
    assert found.complete and found.simulations == 0 and found.best is first


# ---- in the planner -----------------------------------------------------------------------------------

@settings(PROPERTY, max_examples=60)
@given(workload=workloads(), hw=hardware(), where=budget_points)
def test_slackswap_reports_the_exact_search(generated_cases, workload, hw, where):
    budget, _, _ = budget_between(workload, hw, where)
    plan = plan_workload(workload, hw, budget, "slackswap")
    generated_cases["exact search: random workloads planned"] += 1
    if len(candidates(workload)) > EXACT_MAX_CANDIDATES:
        assert "exact_search" not in plan.info
    else:
        assert plan.info["exact_search"] in ("complete", "cut off")
    step_s = simulate(workload, hw, plan, budget).step_time_s
    assert step_s == pytest.approx(plan.info["predicted_step_time_s"], rel=REL)


def test_built_in_models_are_too_large_for_the_exact_search():
    hw = PRESETS["a100-80gb-pcie4"]
    w = build_model_workload("bert-large", hw, layers=1)
    assert len(candidates(w)) > EXACT_MAX_CANDIDATES
    plan = plan_workload(w, hw, simulate_ideal(w, hw).peak_memory_bytes * 9 // 10, "slackswap")
    assert "exact_search" not in plan.info
