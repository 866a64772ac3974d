"""The run under a budget continued from the unlimited run where the two part
(sim.simulator.simulate_unlimited_with_fork): the same timeline and events, bit for bit, as
simulating under the budget from the start, or the same InfeasiblePlanError."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from slackswap.errors import InfeasiblePlanError
from slackswap.hardware import PRESETS
from slackswap.plans import Action
from slackswap.schedule import make_plan
from slackswap.sim import simulate
from slackswap.sim.simulator import simulate_unlimited_with_fork
from slackswap.workloads.models import build_model_workload
from slackswap.workloads.synthetic import chain

HW = PRESETS["a100-80gb-pcie4"]


def run_under(workload, hardware, plan, budget):
    records: list = []
    try:
        return simulate(workload, hardware, plan, budget, check=False, event_records=records), records
    except InfeasiblePlanError as exc:
        return str(exc), None


def forked(workload, hardware, plan, budget):
    """(unlimited timeline, its records, the run under the budget as run_under gives it, whether it forked)."""
    free_records: list = []
    free, resume = simulate_unlimited_with_fork(workload, hardware, plan, budget, event_records=free_records)
    if resume is None:
        return free, free_records, (dataclasses.replace(free, budget_bytes=budget), free_records), False
    records: list = []
    try:
        return free, free_records, (resume(records), records), True
    except InfeasiblePlanError as exc:
        return free, free_records, (str(exc), None), True


@pytest.mark.parametrize("model", ["llama-7b", "gpt2-xl"])
def test_the_fork_runs_on_as_a_run_under_the_budget_from_the_start(model):
    w = build_model_workload(model, HW, layers=2)
    names = [t.name for t in w.saved_tensors if t.producer is not None]
    rng = random.Random(17)
    seen = {"forked": 0, "fits after a fork": 0, "never bound": 0}
    for _ in range(60):
        actions = {n: rng.choice((Action.KEEP, Action.SWAP, Action.RECOMPUTE)) for n in names}
        plan = make_plan(w, actions, policy="t", budget_bytes=None, hardware=HW)
        peak = simulate(w, HW, plan, math.inf, check=False).peak_memory_bytes
        budget = int(peak * rng.uniform(0.8, 1.02))
        free, free_records, under, did_fork = forked(w, HW, plan, budget)
        direct_records: list = []
        assert free == simulate(w, HW, plan, math.inf, check=False, event_records=direct_records)
        assert free_records == direct_records
        assert under == run_under(w, HW, plan, budget)
        seen["forked"] += did_fork
        seen["fits after a fork"] += did_fork and under[1] is not None
        seen["never bound"] += not did_fork
    # the cases this test is for all occur
    assert min(seen.values()) > 0, seen


def test_a_fork_at_the_step_inputs_raises_as_the_run_from_the_start():
    w = chain(3, input_bytes=50)
    plan = make_plan(w, {"a0": Action.SWAP}, policy="t", budget_bytes=None, hardware=HW)
    free, _, under, did_fork = forked(w, HW, plan, 40)
    assert did_fork and free.peak_memory_bytes > 40
    assert "step inputs alone" in under[0] and under == run_under(w, HW, plan, 40)


def test_memory_records_hold_the_samples_the_timeline_would_hold():
    """With ``memory_records`` the samples go to the list, in order, and the Timeline holds none;
    everything else is as without (simulate, the unlimited run, and the fork's run)."""
    w = build_model_workload("gpt2-xl", HW, layers=2)
    names = [t.name for t in w.saved_tensors if t.producer is not None]
    rng = random.Random(3)
    forks = 0
    for _ in range(30):
        plan = make_plan(w, {n: rng.choice((Action.KEEP, Action.SWAP, Action.RECOMPUTE)) for n in names},
                         policy="t", budget_bytes=None, hardware=HW)
        plain = simulate(w, HW, plan, math.inf, check=False)
        samples: list = []
        kept = simulate(w, HW, plan, math.inf, check=False, memory_records=samples)
        assert kept.memory == () and len(samples) > 1 and dataclasses.replace(kept, memory=tuple(samples)) == plain
        budget = int(plain.peak_memory_bytes * rng.uniform(0.9, 0.99))
        free_samples: list = []
        free, resume = simulate_unlimited_with_fork(w, HW, plan, budget, memory_records=free_samples)
        assert dataclasses.replace(free, memory=tuple(free_samples)) == plain
        if resume is None:
            continue
        under_samples: list = []
        try:
            under = resume(None, under_samples)
        except InfeasiblePlanError:
            continue
        forks += 1
        assert under.memory == () and dataclasses.replace(under, memory=tuple(under_samples)) == simulate(
            w, HW, plan, budget, check=False)
    assert forks >= 3
