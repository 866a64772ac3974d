"""The simulator's two fused loops against its plain event loop.

``_Simulation.run`` runs a plan that copies nothing in ``fused_loops.run_copy_free`` and a plan that copies in
``fused_loops.run_with_copies``; ``_dispatch`` and ``_run_events`` (the plain event loop, one method per rule,
which node.py's ranks run) take the same steps one call at a time. On random plans, prefetch steps,
hardware and budgets (some too small, some binding, with and without a fork), both give the same
timeline, tensor log, errors and fork's resumed run, bit for bit.
"""

from __future__ import annotations

import math
import random

import pytest

from slackswap.errors import InfeasiblePlanError
from slackswap.hardware import PRESETS
from slackswap.plans import Action
from slackswap.schedule import make_plan
from slackswap.sim import simulate, simulate_ideal
from slackswap.sim import simulator as sim_module
from slackswap.workloads.models import build_model_workload

HW = PRESETS["a100-80gb-pcie4"]


def _plain_run(run: sim_module._Simulation, *, fork: bool) -> None:
    if fork:  # resume(), through the plain loop
        if run.mem > run.budget:
            run._raise_over_inputs()
    else:  # run(), through the plain loop
        run._alloc(list(run.step_inputs))
        if run.mem > run.budget and not run._lift_budget():
            run._raise_over_inputs()
    run._dispatch()
    run._run_events()


def outcome(workload, hw, plan, budget, lift_to, *, plain, logged=True):
    """(timeline, the fork's timeline or error or None, tensor log), or ("infeasible", error, log)."""
    log: list | None = [] if logged else None
    shown = None if math.isinf(budget) else budget
    run = sim_module._Simulation(workload, hw, plan, budget, log, lift_to=lift_to)
    try:
        _plain_run(run, fork=False) if plain else run.run()
    except InfeasiblePlanError as exc:
        return ("infeasible", str(exc), log)
    forked = None
    if run.fork is not None:
        try:
            _plain_run(run.fork, fork=True) if plain else run.fork.resume()
            forked = sim_module._timeline(run.fork, shown, None)
        except InfeasiblePlanError as exc:
            forked = str(exc)
    return (sim_module._timeline(run, shown, None), forked, log)


def _out_of_order(plan, timeline) -> bool:
    """Whether a copy back passed one before it in the plan's copy-back order."""
    copied_back = [e.name for e in timeline.events if e.kind == "copy_in"]
    return copied_back != [c.tensor for c in plan.schedule.copy_backs if c.tensor in copied_back]


def fused_as_plain(workload, hw, plan, budget, lift_to):
    """The fused loop's outcome, after checking it equals the plain loop's, and that without a tensor
    log (as planners run) it gives the same timelines, forks and errors."""
    fused = outcome(workload, hw, plan, budget, lift_to, plain=False)
    assert fused == outcome(workload, hw, plan, budget, lift_to, plain=True)
    assert outcome(workload, hw, plan, budget, lift_to, plain=False, logged=False)[:2] == fused[:2]
    return fused


def _compare(workload, hw, plans_and_budgets):
    """How many runs failed, forked, fitted, and (of those that ran) stalled for a copy and for memory."""
    kinds = {"infeasible": 0, "forked": 0, "fits": 0, "stall copy": 0, "stall memory": 0, "out of order": 0}
    for plan, budget in plans_and_budgets:
        for lift_to in (None, math.inf):
            fused = fused_as_plain(workload, hw, plan, budget, lift_to)
            kinds["infeasible" if fused[0] == "infeasible" else "forked" if fused[1] else "fits"] += 1
            ran = [t for t in fused[:2] if isinstance(t, sim_module.Timeline)]
            kinds["stall copy"] += any(t.stall_copy_s > 0 for t in ran)
            kinds["stall memory"] += any(t.stall_memory_s > 0 for t in ran)
            kinds["out of order"] += any(_out_of_order(plan, t) for t in ran)
    return kinds


def test_copy_free_loop_matches_the_event_loop():
    """Recompute-only plans run in fused_loops.run_copy_free."""
    workload = build_model_workload("llama-7b", HW, layers=2)
    peak = simulate_ideal(workload, HW).peak_memory_bytes
    names = [t.name for t in workload.saved_tensors if t.producer is not None]
    rng = random.Random(4)
    cases = []
    for _ in range(40):
        actions = {t: Action.RECOMPUTE for t in names if rng.random() < rng.choice([0.2, 0.6, 0.9])}
        plan = make_plan(workload, actions, policy="test", budget_bytes=None, hardware=HW)
        cases.append((plan, int(peak * rng.uniform(0.3, 1.1))))
    kinds = _compare(workload, HW, cases)
    assert min(kinds["infeasible"], kinds["forked"], kinds["fits"]) >= 5, kinds


@pytest.mark.parametrize("model, hardware", [
    ("llama-7b", HW.replace(d2h_bytes_per_s=HW.d2h_bytes_per_s / 8, h2d_bytes_per_s=HW.h2d_bytes_per_s / 8)),
    ("gpt2-xl", HW),  # the h2d copy slows while a copy out runs
    ("bert-large", HW.replace(duplex_d2h_factor=0.7, copy_latency_s=0.0)),  # both slow, no launch latency
])
def test_copy_loop_matches_the_event_loop(model, hardware):
    """Plans with swaps (and recomputes, and early prefetch steps) run in fused_loops.run_with_copies."""
    workload = build_model_workload(model, hardware, layers=2)
    names = [t.name for t in workload.saved_tensors if t.producer is not None]
    rng = random.Random(17)
    cases = []
    for _ in range(40):
        share = rng.choice([0.2, 0.5, 0.9])
        actions = {t: rng.choice([Action.SWAP, Action.SWAP, Action.RECOMPUTE]) for t in names if rng.random() < share}
        plan = make_plan(workload, actions, policy="test", budget_bytes=None, hardware=hardware)
        if rng.random() < 0.4:  # some copies back issued early, holding memory longer
            early = {t: rng.randint(0, workload.first_bwd_step[t]) for t, a in actions.items() if a is Action.SWAP}
            plan = make_plan(workload, actions, policy="test", budget_bytes=None, prefetch_step=early)
        own_peak = simulate(workload, hardware, plan, math.inf).peak_memory_bytes
        cases.append((plan, int(own_peak * rng.uniform(0.6, 1.05))))
    kinds = _compare(workload, hardware, cases)
    assert min(n for kind, n in kinds.items() if kind != "out of order") >= 5, kinds


def test_copy_loop_matches_the_event_loop_on_small_random_cases():
    """The oracle test's random small workloads, plans, hardware and budgets (tests/test_simulator_oracle.py),
    where copies back go out of order, get skipped, and launches overlap, with and without a fork."""
    from hypothesis import HealthCheck, given, settings

    from test_simulator_oracle import cases

    seen = {"copies": 0, "skipped copy back": 0, "forked": 0, "infeasible": 0}

    @settings(max_examples=100, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(cases())
    def run(case):
        workload, hardware, plan, budget = case
        budget = math.inf if budget is None else budget
        for lift_to in (None, math.inf):
            fused = fused_as_plain(workload, hardware, plan, budget, lift_to)
            if fused[0] == "infeasible":
                seen["infeasible"] += 1
                continue
            seen["forked"] += fused[1] is not None
            swapped = [c.tensor for c in plan.schedule.copy_backs]
            for timeline in (t for t in fused[:2] if isinstance(t, sim_module.Timeline)):
                copied_back = [e.name for e in timeline.events if e.kind == "copy_in"]
                seen["copies"] += bool(swapped)
                seen["skipped copy back"] += len(copied_back) < len(swapped)

    run()
    assert min(seen.values()) >= 10, seen


def test_copy_loop_matches_the_event_loop_when_copies_back_go_out_of_order():
    """Random chains where op i makes a_i (read by the backward of op i + 1) and sometimes k_i (kept, read
    by its own backward; test_simulator.py's out_of_order_workload is one), most a_i swapped, some
    prefetched at step 0: under budgets below the unlimited peak, a copy back compute waits for passes
    a head that does not fit (docs/simulator.md, "Out of order") in about one run in a hundred."""
    from test_simulator import link

    from slackswap.schedule import first_use_step
    from slackswap.workloads.synthetic import dag

    rng = random.Random(5)
    cases = []
    for _ in range(1500):
        n = rng.randint(4, 9)
        ops, sizes, readers, previous = [], {"x": 1}, {"x": ["op0"]}, "x"
        for i in range(n):
            outputs = [f"a{i}"]
            sizes[f"a{i}"] = rng.choice([10, 50, 100, 200, 300])
            if i + 1 < n:
                readers[f"a{i}"] = [f"op{i + 1}"]
            if rng.random() < 0.4:
                outputs.append(f"k{i}")
                sizes[f"k{i}"] = rng.choice([100, 300, 500])
                readers[f"k{i}"] = [f"op{i}"]
            ops.append((f"op{i}", [previous], outputs))
            previous = f"a{i}"
        workload = dag(ops, sizes, readers, fwd_time_s={f"op{i}": rng.choice([0.5, 1.0, 2.0]) for i in range(n)},
                       bwd_time_s={f"op{i}": rng.choice([1.0, 2.0]) for i in range(n)})
        swapped = [t.name for t in workload.saved_tensors if t.name.startswith("a") and rng.random() < 0.7]
        prefetch = {t: rng.choice([0, rng.randint(0, first_use_step(workload, t)), first_use_step(workload, t)])
                    for t in swapped}
        plan = make_plan(workload, dict.fromkeys(swapped, Action.SWAP), policy="test", budget_bytes=None,
                         prefetch_step=prefetch)
        hardware = link(d2h=rng.choice([100.0, 200.0]), h2d=rng.choice([100.0, 200.0]),
                        latency=rng.choice([0.0, 0.25]), duplex_h2d=rng.choice([1.0, 0.5]))
        peak = simulate(workload, hardware, plan, math.inf).peak_memory_bytes
        cases.append((workload, hardware, plan, int(peak * rng.uniform(0.5, 1.0))))
    out_of_order = 0
    for workload, hardware, plan, budget in cases:
        out_of_order += _compare(workload, hardware, [(plan, budget)])["out of order"]
    assert out_of_order >= 10
