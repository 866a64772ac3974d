"""No recursion that deepens with the model: planning, simulating and a plan's JSON round trip run
under a recursion limit a hundred frames above the caller's, on workloads with several
times that many ops (and, for the chain, layers). A recursion per op or per layer would raise
RecursionError here, as it would near the accepted 4,096 layers (workloads.spec.MAX_LAYERS)
under Python's default limit; timing those sizes is benchmarks/bench_planners.py --alone."""

from __future__ import annotations

import sys
from contextlib import contextmanager

from slackswap.errors import BudgetError
from slackswap.hardware import PRESETS
from slackswap.planners import HEURISTICS, plan_workload
from slackswap.plans import Plan
from slackswap.sim import simulate, simulate_ideal
from slackswap.workloads.models import build_model_workload
from slackswap.workloads.synthetic import chain

HW = PRESETS["a100-80gb-pcie4"]
HEADROOM_FRAMES = 100
"""Frames allowed above the test's own: the planners' fixed call depth (plan_workload -> a rule ->
the search -> the simulator -> dataclasses and validation) is a few dozen."""


def _depth() -> int:
    frame, depth = sys._getframe(), 0
    while frame is not None:
        depth += 1
        frame = frame.f_back
    return depth


def _plan_simulate_round_trip(workload, fraction: float, policy: str) -> None:
    budget = int(fraction * simulate_ideal(workload, HW).peak_memory_bytes)
    try:
        plan = plan_workload(workload, HW, budget, policy)
    except BudgetError:  # the layer-wise policies on a chain at low budgets: refused, no recursion
        return
    simulate(workload, HW, plan, budget)
    assert Plan.from_dict(plan.to_dict(workload)).actions == plan.actions


def _chain(ops: int):
    return chain(ops, size_bytes=[100 + (i * 37) % 500 for i in range(ops)],
                 fwd_time_s=[1.0 + (i * 13) % 7 for i in range(ops)])


@contextmanager
def shallow_limit():
    """Python's recursion limit HEADROOM_FRAMES above the caller's depth within, restored before a
    failure is reported."""
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(_depth() + HEADROOM_FRAMES)
    try:
        yield
    finally:
        sys.setrecursionlimit(before)


def test_every_heuristic_and_slackswap_plan_a_long_chain_under_a_shallow_limit():
    ops = 3 * HEADROOM_FRAMES  # one op per layer: 300 layers
    policies = HEURISTICS + ("slackswap",)
    for policy in policies:  # imports first, at the normal limit
        _plan_simulate_round_trip(_chain(ops), 0.3, policy)
    with shallow_limit():
        for fraction in (0.1, 0.3):
            for policy in policies:
                _plan_simulate_round_trip(_chain(ops), fraction, policy)  # a fresh workload: nothing remembered


def test_slackswap_plans_gpt2_xl_under_a_shallow_limit():
    # 24 layers, 245 ops: more than twice the headroom.
    _plan_simulate_round_trip(build_model_workload("gpt2-xl", HW, layers=24), 0.5, "slackswap")
    with shallow_limit():
        _plan_simulate_round_trip(build_model_workload("gpt2-xl", HW, layers=24), 0.5, "slackswap")
