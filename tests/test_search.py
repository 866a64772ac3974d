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
        # events to Candidate.events (built on demand from the simulator's records).
        assert under.timeline.events == () and under.events == direct.events
        assert dataclasses.replace(under.timeline, events=under.events) == direct
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
