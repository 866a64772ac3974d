"""The planner's search object (planners/search.py): the memory floor that answers without the
simulator, one simulation for both limits of a plan without copies, and the counters."""

from __future__ import annotations

import dataclasses
import math

import pytest

from slackswap.errors import InfeasiblePlanError
from slackswap.hardware import Hardware
from slackswap.planners import common
from slackswap.planners.common import facts_for
from slackswap.planners.search import Search
from slackswap.plans import Action
from slackswap.sim import simulate
from slackswap.workloads.synthetic import chain

K, S, R = Action.KEEP, Action.SWAP, Action.RECOMPUTE


def link(rate: float = 100.0) -> Hardware:
    return Hardware(name="toy", peak_flops_per_s=1.0, gemm_efficiency=1.0, attention_efficiency=1.0,
                    hbm_bytes_per_s=1.0, hbm_efficiency=1.0, hbm_capacity_bytes=10**6,
                    d2h_bytes_per_s=rate, h2d_bytes_per_s=rate, copy_latency_s=0.0)


def counted(monkeypatch) -> list[float]:
    """Record the limit of every simulation the planners run."""
    limits: list[float] = []
    real = common.simulate

    def simulate_counted(workload, hardware, plan, budget_bytes=None, **kwargs):
        limits.append(budget_bytes)
        return real(workload, hardware, plan, budget_bytes, **kwargs)

    monkeypatch.setattr(common, "simulate", simulate_counted)
    return limits


def test_memory_floor_of_a_chain_by_hand():
    # chain(4): a_i (100 B) is read by the backward of op_{i+1}; x (1 B) by op0's. When backward op
    # k runs, a_{k-1} is on the device whatever the plan; a kept tensor stays until its reader has
    # run. Keeping a0 and a1: at op3's backward a2 (needed), a0, a1 and x: 301 B.
    facts = facts_for(chain(4))
    assert facts.held_whatever_bytes == (1, 101, 101, 101, 1)
    assert facts.peak_floor_bytes(["a0", "a1"]) == 301
    assert facts.peak_floor_bytes([]) == 101
    w = chain(4)
    plan = Search(w, link(), 301, "test").plan({"a2": R})
    assert simulate(w, link(), plan, math.inf, check=False).peak_memory_bytes == 301


def test_a_plan_over_its_memory_floor_is_answered_without_the_simulator(monkeypatch):
    w = chain(4)
    limits = counted(monkeypatch)
    search = Search(w, link(), 300, "test")
    found = search.try_actions({"a2": R})  # keeps a0 and a1: floor 301 B > 300 B
    assert not found.fits and found.plan is None
    assert limits == [] and search.skipped_simulations == 1
    # the simulator agrees: the plan cannot run within 300 B
    with pytest.raises(InfeasiblePlanError):
        simulate(w, link(), search.plan({"a2": R}), 300, check=False)
    # under no limit it is simulated as usual
    assert search.try_actions({"a2": R}, unlimited=True).timeline.peak_memory_bytes == 301
    assert limits == [math.inf]


@pytest.mark.parametrize("below_peak_bytes, fits", [(0, True), (1, False)])
def test_a_plan_without_copies_is_simulated_once_for_both_limits(monkeypatch, below_peak_bytes, fits):
    # Recomputing a0 and a1 keeps a2 only: the floor is 101 B, but the unlimited run peaks higher
    # (forward holds two tensors at once; backward rebuilds a0 and a1 together).
    w = chain(4)
    actions = {"a0": R, "a1": R}
    peak = simulate(w, link(), Search(w, link(), 10**6, "t").plan(actions), math.inf, check=False).peak_memory_bytes
    budget = peak - below_peak_bytes
    assert facts_for(w).peak_floor_bytes(["a2"]) == 101 < budget
    limits = counted(monkeypatch)
    search = Search(w, link(), budget, "test")
    plan = search.plan(actions)
    free = search.evaluate(plan, unlimited=True)
    under = search.evaluate(plan)
    assert limits == [math.inf]  # the run under the budget came from the unlimited one
    assert free.timeline.peak_memory_bytes == peak
    assert under.fits is fits and search.skipped_simulations == 0
    if fits:
        direct = simulate(w, link(), plan, budget, check=False)
        # What the simulator gives under the budget, exactly; a planner's timeline leaves its
        # events to Candidate.events (built on demand from the simulator's records) and holds no
        # memory samples (planners read the totals).
        assert under.timeline.events == () and under.events == direct.events and under.timeline.memory == ()
        assert dataclasses.replace(under.timeline, events=under.events, memory=direct.memory) == direct
    else:
        with pytest.raises(InfeasiblePlanError):
            simulate(w, link(), plan, budget, check=False)


def test_swapping_plans_are_still_simulated_under_the_budget(monkeypatch):
    w = chain(4)
    limits = counted(monkeypatch)
    search = Search(w, link(), 301, "test")
    search.evaluate(search.plan({"a0": S}))
    assert limits == [301]


def test_value_orders_share_their_strict_pass():
    from slackswap.planners.slackswap import swap_orders, windowed_swaps

    w = chain(6, fwd_time_s=[1.0, 0.5, 0.5, 0.5, 2.0, 0.5], size_bytes=[100, 100, 80, 60, 40, 1])
    for rate in (30.0, 60.0, 200.0):
        facts, hw = facts_for(w), link(rate)
        value = swap_orders(facts)["value"]
        strict = windowed_swaps(facts, hw, value)
        assert windowed_swaps(facts, hw, value, spill=True, strict=strict) == windowed_swaps(facts, hw, value, spill=True)
        assert windowed_swaps(facts, hw, value, strict=strict) == strict


def test_step_floor_is_every_compute_task_by_hand():
    # chain(4): forward 1 s per op, backward 2 s: 12 s with nothing rebuilt. Recomputing a1 re-runs
    # op1 (1 s) before op2's backward: 13 s, and with nothing to wait for the step takes exactly that.
    w = chain(4)
    search = Search(w, link(), 10**6, "test")
    assert search.step_floor_s(search.plan({})) == 12.0
    plan = search.plan({"a1": R})
    assert search.step_floor_s(plan) == 13.0
    assert simulate(w, link(), plan, math.inf, check=False).step_time_s == 13.0
    # Backward waits for a copy back (0.5 s backward ops; a1's copy back takes 2 s and starts when
    # forward ends, 0.5 s before op2's backward needs it): 1.5 s of stall over the 6 s floor.
    quick = chain(4, bwd_time_s=0.5)
    slow = Search(quick, link(rate=50.0), 10**6, "test")
    swapped = slow.plan({"a1": S})
    assert slow.step_floor_s(swapped) == 6.0
    assert simulate(quick, link(rate=50.0), swapped, math.inf, check=False).step_time_s == 7.5


def test_a_plan_over_the_cutoff_is_answered_without_the_simulator(monkeypatch):
    w = chain(4)
    limits = counted(monkeypatch)
    search = Search(w, link(), 10**6, "test")
    plan = search.plan({"a1": R})  # floor 13 s
    assert not search.evaluate(plan, cutoff_s=12.5).fits
    assert limits == [] and search.pruned_simulations == 1
    # at or over its floor it is simulated as usual
    assert search.evaluate(plan, cutoff_s=13.0).step_time_s == 13.0
    assert limits == [math.inf] and search.pruned_simulations == 1


def test_plans_are_built_once_per_actions():
    w = chain(4)
    search = Search(w, link(), 10**6, "test")
    plan = search.plan({"a1": R})
    assert search.plan({"a1": R, "a0": K}) is plan  # the same actions, the kept tensor named
    assert search.plan({"a1": S}) is not plan
    assert plan == common.build(w, link(), {"a1": R}, "test", 10**6)
    # a plan with info (the caller's own) is built anew
    assert search.plan({"a1": R}, info={"rule": "x"}).info == {"rule": "x"}


@pytest.mark.parametrize("name, fraction", [("example-bert", 0.5), ("hf-gpt2", 0.7), ("hf-vit", 0.5)])
def test_the_cutoff_changes_no_plan(monkeypatch, name, fraction):
    # Cases where `slackswap` answers some evaluation from the step time floor: the plan (info
    # and its simulation count included) is the one the search makes simulating everything.
    from pathlib import Path

    from slackswap.hardware import PRESETS
    from slackswap.planners import search as search_module
    from slackswap.planners import slackswap as slackswap_module
    from slackswap.sim import simulate_ideal
    from slackswap.workload import Workload

    made: list[Search] = []

    class Recorded(Search):
        def __post_init__(self) -> None:
            super().__post_init__()
            made.append(self)

    monkeypatch.setattr(slackswap_module, "Search", Recorded)
    w = Workload.load(Path(__file__).resolve().parent / "profiled" / f"{name}.json")
    hw = PRESETS["a100-80gb-pcie4"]
    budget = int(fraction * simulate_ideal(w, hw).peak_memory_bytes)
    with_cutoff = slackswap_module.plan_slackswap(w, hw, budget)
    assert sum(s.pruned_simulations for s in made) > 0
    made.clear()
    monkeypatch.setattr(search_module, "STEP_FLOOR_MARGIN", math.inf)  # no floor is over the cutoff
    simulated = slackswap_module.plan_slackswap(w, hw, budget)
    assert sum(s.pruned_simulations for s in made) == 0
    assert with_cutoff.to_dict(w) == simulated.to_dict(w)


def test_the_run_under_the_budget_after_the_unlimited_run_comes_from_its_fork(monkeypatch):
    # Swapping a0 on a slow link (2 s a copy): unlimited, op2 makes a2 while a0's copy out still
    # runs (peak 301 B); under 250 B op2 waits 1 s for it. The search simulates once from the start,
    # without a limit, and the run under the budget goes on from where the two part.
    from slackswap.sim import simulator

    w = chain(4, bwd_time_s=0.5)
    hw = link(rate=50.0)
    search = Search(w, hw, 250, "test")
    plan = search.plan({"a0": S})
    starts: list = []
    real = simulator._Simulation.run
    monkeypatch.setattr(simulator._Simulation, "run", lambda self: starts.append(self.budget) or real(self))
    free = search.evaluate(plan, unlimited=True)
    under = search.evaluate(plan)
    assert len(starts) == 1 and search.fork is None
    records: list = []
    direct = simulate(w, hw, plan, 250, check=False, event_records=records, memory_records=[])
    assert free.timeline.peak_memory_bytes == 301 and direct.stall_memory_s == 1.0
    assert under.timeline == direct and list(under.records) == records  # no memory samples in either
