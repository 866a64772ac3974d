"""The recompute space (planners/recompute_space.py): its replay is the simulator's run, its lower
bound is below every recompute-only plan, and its descent finds plans the knapsack does not."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from pathlib import Path

import pytest

from slackswap.errors import BudgetError
from slackswap.hardware import PRESETS
from slackswap.planners import minimum_budget_bytes, plan_workload
from slackswap.planners.common import build, facts_for
from slackswap.planners.recompute_space import (RecomputeReplay, frontier_descent,
                                                 recompute_lower_bound_s)
from slackswap.planners.selection import actions_for
from slackswap.sim import simulate, simulate_ideal
from slackswap.workload import Workload
from slackswap.workloads.synthetic import chain

HW = PRESETS["a100-80gb-pcie4"]
PROFILED = Path(__file__).parent / "profiled"


def simulated(workload: Workload, recomputed) -> tuple[int, float]:
    plan = build(workload, HW, actions_for(recompute=recomputed), "test", None)
    timeline = simulate(workload, HW, plan, math.inf, check=False)
    return timeline.peak_memory_bytes, timeline.recompute_time_s


@pytest.mark.parametrize("name", ["example-gpt2", "hf-llama", "hf-vit"])
def test_the_replay_is_the_simulators_run(name):
    w = Workload.load(PROFILED / f"{name}.json")
    facts = facts_for(w)
    replay = RecomputeReplay(facts)
    rng = random.Random(name)
    for share in (0.2, 0.5, 0.8, 1.0):
        recomputed = [n for n in facts.candidates if rng.random() < share]
        peak, recompute_s = replay.run(recomputed)
        want_peak, want_s = simulated(w, recomputed)
        assert peak == want_peak
        assert recompute_s == pytest.approx(want_s, rel=1e-12, abs=0.0)


@pytest.mark.parametrize("name", ["hf-bert", "hf-llama"])
def test_a_replay_from_a_record_is_the_whole_replay(name):
    # Random walks of one to three items flipped at a time (the search's moves, and more), each
    # plan replayed from the last record (run_flipped) against the whole replay from scratch.
    facts = facts_for(Workload.load(PROFILED / f"{name}.json"))
    replay = RecomputeReplay(facts)
    rng = random.Random(name)
    names = list(facts.candidates)
    for share in (0.1, 0.3, 0.5, 0.7, 0.9):
        recomputed = {n for n in names if rng.random() < share}
        record = replay.record(replay.gone_of(recomputed))
        assert (record.peak, record.cost) == replay.run(recomputed)
        for _ in range(100):
            flipped = rng.sample(names, rng.choice([1, 1, 2, 3]))
            want = replay.run(recomputed.symmetric_difference(flipped))
            assert replay.run_flipped(record, [replay.number[n] for n in flipped]) == want
            if rng.random() < 0.3:  # walk on: the next flips start from a new record
                recomputed.symmetric_difference_update(flipped)
                record = replay.record(replay.gone_of(recomputed))
        assert replay.run_flipped(record, []) == replay.run(recomputed)


def test_the_lower_bound_by_hand():
    # chain(4): a0, a1, a2 of 100 B and the 1 B input x; a2 is read by the last op, so it is on
    # the device when the forward pass ends whatever the plan. At 201 B, 100 B must go: a0 (op0,
    # 1 s) is the cheapest. At 101 B both a0 and a1 (op1, 5 s) must go: 6 s.
    w = chain(4, fwd_time_s=[1.0, 5.0, 9.0, 1.0])
    facts = facts_for(w)
    assert recompute_lower_bound_s(facts, 301) == 0.0
    assert recompute_lower_bound_s(facts, 201) == 1.0
    assert recompute_lower_bound_s(facts, 101) == 6.0
    assert recompute_lower_bound_s(facts, 100) == math.inf


def test_the_lower_bound_holds_its_staircases_only_below_what_it_reads(monkeypatch):
    # The bound reads its knapsack only at the need, so each staircase is held from the need less
    # the later items' units: the same bound as the whole staircases give, on random chains and
    # on a profiled workload at every tenth of its peak.
    from slackswap.planners import recompute_space

    rng = random.Random(4)
    cases = []
    for _ in range(20):
        n = rng.randint(3, 25)
        w = chain(n, fwd_time_s=[rng.choice([1.0, rng.uniform(0.1, 3.0)]) for _ in range(n)],
                  size_bytes=[rng.choice([100, rng.randint(1, 3000)]) for _ in range(n)])
        total = sum(t.size_bytes for t in w.tensors)
        cases += [(facts_for(w), int(total * rng.uniform(0.05, 1.0))) for _ in range(3)]
    profiled = Workload.load(PROFILED / "hf-gpt2.json")
    peak = simulate_ideal(profiled, HW).peak_memory_bytes
    cases += [(facts_for(profiled), int(i / 10 * peak)) for i in range(1, 10)]
    held = [recompute_lower_bound_s(facts, budget) for facts, budget in cases]
    monkeypatch.setattr(recompute_space, "held_from", lambda stairs, low: stairs)
    assert held == [recompute_lower_bound_s(facts, budget) for facts, budget in cases]
    assert any(0 < s < math.inf for s in held)


def test_the_lower_bound_is_below_every_recompute_only_plan_that_fits(summary_lines):
    # Every recompute-only plan of small random chains, by brute force. The descent is greedy: it
    # need not find a plan at every budget some plan meets, nor the fastest one.
    rng = random.Random(7)
    budgets = found = fastest = 0
    for _ in range(6):
        n = 7
        w = chain(n, fwd_time_s=[rng.uniform(0.5, 3.0) for _ in range(n)],
                  size_bytes=[rng.randint(20, 200) for _ in range(n)])
        facts = facts_for(w)
        replay = RecomputeReplay(facts)
        runs = [replay.run(subset) for k in range(len(facts.candidates) + 1)
                for subset in itertools.combinations(facts.candidates, k)]
        for budget in sorted({peak for peak, _ in runs}):
            best = min(s for peak, s in runs if peak <= budget)
            assert recompute_lower_bound_s(facts, budget) <= best + 1e-12
            chosen, lowest = frontier_descent(facts, budget)
            budgets += 1
            if chosen is None:
                assert lowest > budget
                continue
            peak, recompute_s = replay.run(chosen)
            assert peak <= budget and lowest <= budget and recompute_s >= best - 1e-12
            found += 1
            fastest += recompute_s <= best + 1e-12
    summary_lines.append(f"frontier descent on random chains: a plan at {found} of {budgets} budgets some "
                         f"recompute-only plan meets, the fastest at {fastest}")
    assert found >= 0.8 * budgets


def test_recompute_optimal_fits_where_only_the_descent_finds_a_plan():
    # TINY BERT-like at 30 % of its peak: every knapsack set and layer-wise plan rebuilds groups
    # that peak over the budget (the policy refused it, the lowest peak 83,072 B against 59,636 B);
    # the descent keeps the tensors that cut those groups short.
    w = Workload.load(PROFILED / "example-bert.json")
    budget = int(0.3 * simulate_ideal(w, HW).peak_memory_bytes)
    plan = plan_workload(w, HW, budget, "recompute-optimal")
    timeline = simulate(w, HW, plan, budget)
    assert timeline.peak_memory_bytes <= budget and timeline.d2h_bytes == 0
    assert "frontier descent" in plan.info["rule"]
    assert plan.info["recompute_bound_step_time_s"] <= timeline.step_time_s
    assert timeline.throughput_pct > 75.0  # measured 81.59-83.50 % as the descent was tuned


def test_the_flops_objective_drops_the_pointwise_tensor_by_hand():
    # chain(5) of 100 B tensors, op1 pointwise (5 s, no FLOPs), the others matmuls (1,000 FLOPs;
    # op0 1 s, op2 and op3 9 s). Everything kept peaks at 401 B (x and a0-a3 when op3 runs; a4 has
    # no backward reader). At 301 B a0 or a1 must go: dropping a2 still holds it while op3 reads it,
    # and a3 is read by the last op. Rebuilding a0 re-runs op0 from the input: 1 s, 1,000 FLOPs;
    # rebuilding a1 re-runs op1 from a0 (kept): 5 s, 0 FLOPs. Fastest: drop a0; fewest FLOPs
    # (PyTorch's knapsack objective): drop a1.
    w = chain(5, fwd_time_s=[1.0, 5.0, 9.0, 9.0, 1.0])
    ops = [dataclasses.replace(op, flops=0.0 if op.name == "op1" else 1000.0) for op in w.ops]
    ops[1] = dataclasses.replace(ops[1], kind="elementwise")
    w = dataclasses.replace(w, ops=tuple(ops))
    facts = facts_for(w)
    assert RecomputeReplay(facts).run([]) == (401, 0.0)
    assert [RecomputeReplay(facts).run([n])[0] for n in ("a0", "a1", "a2")] == [301, 301, 401]
    assert frontier_descent(facts, 301)[0] == ("a0",)
    assert frontier_descent(facts, 301, objective="flops")[0] == ("a1",)
    assert build(w, HW, actions_for(recompute=["a1"]), "test", 301).recompute_flops(w) == 0.0
    assert build(w, HW, actions_for(recompute=["a0"]), "test", 301).recompute_flops(w) == 1000.0
    with pytest.raises(ValueError, match="unknown recompute objective"):
        frontier_descent(facts, 301, objective="bytes")


def test_recompute_optimal_reaches_budgets_both_greedy_walks_stall_over():
    # HF GPT-2 (2 layers) at 25 % of its peak: the descent stalls at 377,856 B and the ascent at
    # 361,472 B (the policy refused, naming 361,472 B); the wander's flips reach a plan within it.
    w = Workload.load(PROFILED / "hf-gpt2.json")
    peak = simulate_ideal(w, HW).peak_memory_bytes
    budget = int(0.25 * peak)
    plan = plan_workload(w, HW, budget, "recompute-optimal")
    timeline = simulate(w, HW, plan, budget)
    assert timeline.peak_memory_bytes <= budget < 361_472 and timeline.d2h_bytes == 0
    # At 20 % no recompute-only plan it finds fits: the error names the lowest peak it reached,
    # which is no lower than the least budget any plan reaches and below what it named before.
    budget = int(0.2 * peak)
    with pytest.raises(BudgetError) as error:
        plan_workload(w, HW, budget, "recompute-optimal")
    lowest = error.value.minimum_bytes
    assert max(budget, minimum_budget_bytes(w)) < lowest < 361_472
    assert f"({lowest} bytes)" in str(error.value)


@pytest.mark.parametrize("name", sorted(p.stem for p in PROFILED.glob("*.json")))
def test_recompute_optimal_meets_every_budget_full_recompute_meets(name):
    # The tightest budget full-recompute meets is its own peak: recompute-optimal fits it, no slower.
    w = Workload.load(PROFILED / f"{name}.json")
    layer_wise = plan_workload(w, HW, 10**12, "full-recompute")
    budget = simulate(w, HW, layer_wise, 10**12).peak_memory_bytes
    plan = plan_workload(w, HW, budget, "recompute-optimal")
    timeline = simulate(w, HW, plan, budget)
    assert timeline.peak_memory_bytes <= budget and timeline.d2h_bytes == 0
    assert timeline.step_time_s <= simulate(w, HW, layer_wise, budget).step_time_s
