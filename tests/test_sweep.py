"""The budget sweep: CSV shape, budget parsing, and slackswap against every other heuristic."""

from __future__ import annotations

import csv
import io
import time

import pytest

from slackswap.errors import UnknownNameError, ValidationError
from slackswap.experiments.sweep import COLUMNS, parse_budgets, parse_policies, rows_to_csv, run_sweep
from slackswap.hardware import PRESETS
from slackswap.planners import HEURISTICS, plan_workload
from slackswap.workloads.synthetic import chain

GRID = [0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
MODELS = ("bert-large", "gpt2-xl", "llama-7b")
# slackswap must never fall below another heuristic: exact comparison of throughput_pct, with
# 1e-9 points for float noise only. This test covers the 0.1 grid; benchmarks/bench_planners.py
# checks the 0.05 grid (0.20 .. 0.90) and commits the table (benchmarks/results/planners.md).
FLOAT_NOISE_PTS = 1e-9
# The MILP takes seconds per solve: the printed gap to it is measured on one cell per model here
# (llama-7b solves fastest); the benchmark prints it on more.
OPTIMAL_CELLS = {"llama-7b": [0.5]}


def test_parse_budgets_ranges_and_lists():
    assert parse_budgets("0.2:0.4:0.1") == [0.2, 0.3, 0.4]
    assert parse_budgets("0.5,0.75") == [0.5, 0.75]
    with pytest.raises(ValidationError, match="start:stop:step"):
        parse_budgets("half")
    with pytest.raises(ValidationError, match="at most 1"):
        parse_budgets("0.5,1.5")


def test_parse_policies_rejects_unknown_names():
    assert parse_policies("ideal,slackswap") == ["ideal", "slackswap"]
    with pytest.raises(UnknownNameError):
        parse_policies("ideal,bogus")


def test_sweep_rows_and_csv_on_a_chain():
    w = chain(6)
    hw = PRESETS["a100-80gb-pcie4"]
    seen = []
    rows = run_sweep(w, hw, [0.5, 1.0], ["ideal", "full-recompute", "slackswap"],
                     progress=lambda done, total, label: seen.append((done, total)))
    assert [(r["budget_fraction"], r["policy"]) for r in rows] == [
        (0.5, "ideal"), (0.5, "full-recompute"), (0.5, "slackswap"),
        (1.0, "ideal"), (1.0, "full-recompute"), (1.0, "slackswap")]
    assert seen[-1] == (6, 6)
    # chain(6) saves 5 x 100 B + a 1 B input: 50% is 250 B, above the 201 B minimum.
    assert all(r["fits"] for r in rows if r["policy"] != "full-recompute")
    for r in rows:
        if r["fits"] and r["policy"] != "ideal":
            assert r["peak_memory_bytes"] <= r["budget_bytes"]
    parsed = list(csv.DictReader(io.StringIO(rows_to_csv(rows))))
    assert list(parsed[0]) == list(COLUMNS) and len(parsed) == 6


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_slackswap_is_never_below_another_heuristic_nor_slower_with_more_budget(model, summary_lines):
    from slackswap.workloads.models import build_model_workload

    hw = PRESETS["a100-80gb-pcie4"]
    workload = build_model_workload(model, hw)
    started = time.perf_counter()
    rows = run_sweep(workload, hw, GRID, list(HEURISTICS) + ["slackswap"])
    rows += run_sweep(workload, hw, OPTIMAL_CELLS.get(model, []), ["optimal"])
    elapsed = time.perf_counter() - started
    gaps = []
    for fraction in GRID:
        at = {r["policy"]: r for r in rows if r["budget_fraction"] == fraction}
        ours = at["slackswap"]
        assert ours["fits"] and ours["peak_memory_bytes"] <= ours["budget_bytes"]
        for name in HEURISTICS:
            if at[name]["fits"]:
                assert ours["throughput_pct"] >= at[name]["throughput_pct"] - FLOAT_NOISE_PTS, (fraction, name)
        best_other = max((at[n]["throughput_pct"] for n in HEURISTICS if at[n]["fits"]), default=None)
        optimal = at["optimal"]["throughput_pct"] if "optimal" in at else None
        mine = ours["throughput_pct"]
        other_text = "n/a" if best_other is None else f"{best_other:.2f}%"
        optimal_text = "n/a" if optimal is None else f"{optimal:.2f}%, gap to optimal {optimal - mine:+.2f} points"
        gaps.append(f"{fraction:.1f}: {mine:.2f}% (best other heuristic {other_text}, optimal {optimal_text})")
    # More budget never made slackswap slower on these models' grid (issue 6's property, checked
    # here on real workloads; the random small ones are in test_invariants.py).
    ours_pct = [next(r["throughput_pct"] for r in rows if r["policy"] == "slackswap" and r["budget_fraction"] == f)
                for f in sorted(GRID)]
    for (low, low_pct), (high, high_pct) in zip(zip(sorted(GRID), ours_pct), zip(sorted(GRID)[1:], ours_pct[1:])):
        assert high_pct >= low_pct - FLOAT_NOISE_PTS, f"{model}: {high_pct}% at {high} < {low_pct}% at {low}"
    summary_lines.append(f"sweep {model} ({elapsed:.1f} s): " + "; ".join(gaps))
    print("\n".join(gaps))


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_slackswap_is_not_slower_on_a_faster_link_for_the_built_in_models(model):
    """Issue 6's bandwidth property on real workloads: the PCIe 4.0 preset, then both directions
    1.5x and 2x faster (about PCIe 5.0), at 30 % and 50 % of the unconstrained peak."""
    from slackswap.sim import simulate, simulate_ideal
    from slackswap.workloads.models import build_model_workload

    hw = PRESETS["a100-80gb-pcie4"]
    workload = build_model_workload(model, hw)
    peak = simulate_ideal(workload, hw).peak_memory_bytes
    for fraction in (0.3, 0.5):
        budget = int(peak * fraction)
        previous_s = None
        for factor in (1.0, 1.5, 2.0):
            link = hw.replace(d2h_bytes_per_s=hw.d2h_bytes_per_s * factor, h2d_bytes_per_s=hw.h2d_bytes_per_s * factor)
            step_s = simulate(workload, link, plan_workload(workload, link, budget, "slackswap"), budget).step_time_s
            if previous_s is not None:
                assert step_s <= previous_s * (1 + 1e-12), f"{fraction}: x{factor} link {step_s} s > {previous_s} s"
            previous_s = step_s


@pytest.mark.slow
def test_bert_large_at_20_percent_is_not_slower_on_a_faster_link():
    """Found by benchmarks/monotone_models.py: at 20 % of the peak, 3x the H2D rate gave 387 ms
    where 2x gave 138 ms (copies back timed for the backward read arrived after the recompute
    that reads them: schedule.first_need_step), and both directions 2x gave 284 ms where 1.5x
    gave 136 ms (every family's far end too high: fit_fewer_swaps)."""
    from slackswap.sim import simulate, simulate_ideal
    from slackswap.workloads.models import build_model_workload

    hw = PRESETS["a100-80gb-pcie4"]
    workload = build_model_workload("bert-large", hw)
    budget = int(simulate_ideal(workload, hw).peak_memory_bytes * 0.2)

    def step_s(d2h: float, h2d: float) -> float:
        link = hw.replace(d2h_bytes_per_s=hw.d2h_bytes_per_s * d2h, h2d_bytes_per_s=hw.h2d_bytes_per_s * h2d)
        return simulate(workload, link, plan_workload(workload, link, budget, "slackswap"), budget).step_time_s

    assert step_s(1.0, 3.0) <= step_s(1.0, 2.0) < 0.139
    assert step_s(2.0, 2.0) <= step_s(1.5, 1.5) < 0.137
