"""Planning time per policy per model, and every policy's throughput at budgets 0.3 to 0.9.

Run: .venv/bin/python benchmarks/bench_planners.py [--repeats 5] [--out benchmarks/results/planners.md]
Prints medians; writes a Markdown results table. Speed targets live here, not in the tests:
`slackswap` must plan llama-7b in under one second.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

from slackswap._fields import write_text_atomic
from slackswap.experiments.sweep import run_sweep
from slackswap.hardware import PRESETS
from slackswap.planners import PLANNERS, plan_workload
from slackswap.sim import simulate_ideal
from slackswap.workloads.models import MODELS, build_model_workload

HARDWARE = "a100-80gb-pcie4"
BUDGETS = [0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]


def time_planning(repeats: int) -> dict[tuple[str, str], float]:
    hw = PRESETS[HARDWARE]
    medians = {}
    for model in MODELS:
        workload = build_model_workload(model, hw)
        budget = int(0.5 * simulate_ideal(workload, hw).peak_memory_bytes)
        for policy in PLANNERS:
            samples = []
            for _ in range(repeats if policy != "optimal" else 1):
                started = time.perf_counter()
                plan = plan_workload(workload, hw, budget, policy)
                samples.append(time.perf_counter() - started)
            medians[(model, policy)] = statistics.median(samples)
            extra = f" (MILP solve {plan.info['milp_solve_time_s']:.2f} s)" if policy == "optimal" else ""
            print(f"plan {model:<11} {policy:<20} {medians[(model, policy)]:8.3f} s{extra}")
    return medians


def throughput_table() -> dict[str, list[dict]]:
    hw = PRESETS[HARDWARE]
    tables = {}
    for model in MODELS:
        workload = build_model_workload(model, hw)
        tables[model] = run_sweep(workload, hw, BUDGETS, [p for p in PLANNERS if p != "ideal"])
        print(f"sweep {model} done")
    return tables


def markdown(medians, tables, repeats: int) -> str:
    lines = ["# Planner benchmark", "",
             f"Hardware preset {HARDWARE}; budget 50% of the unconstrained activation peak for planning times. "
             f"Median of {repeats} runs (`optimal`: 1 run). Machine: {platform.processor() or platform.machine()}, "
             f"Python {platform.python_version()}. Produced by `benchmarks/bench_planners.py`.", "",
             "## Planning time (seconds)", "", "| policy | " + " | ".join(MODELS) + " |",
             "|---|" + "---:|" * len(MODELS)]
    for policy in PLANNERS:
        lines.append(f"| {policy} | " + " | ".join(f"{medians[(m, policy)]:.3f}" for m in MODELS) + " |")
    for model, rows in tables.items():
        policies = [p for p in PLANNERS if p != "ideal"]
        lines += ["", f"## {model}: throughput (% of ideal) by budget fraction", "",
                  "| budget | " + " | ".join(policies) + " |", "|---:|" + "---:|" * len(policies)]
        for fraction in BUDGETS:
            at = {r["policy"]: r for r in rows if r["budget_fraction"] == fraction}
            cells = [f"{at[p]['throughput_pct']:.2f}" if at[p]["fits"] else "n/a" for p in policies]
            lines.append(f"| {fraction:.1f} | " + " | ".join(cells) + " |")
    lines += ["", "n/a: the policy cannot reach that budget (it raises BudgetError)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results/planners.md")
    args = parser.parse_args()
    medians = time_planning(args.repeats)
    tables = throughput_table()
    write_text_atomic(args.out, markdown(medians, tables, args.repeats))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
