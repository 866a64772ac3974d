"""Does the `slackswap` plan for a built-in model ever get slower with more budget or a faster link?

A finer check than tests/test_sweep.py: budgets from 15 % to 95 % of each model's unconstrained
activation peak in steps of 1 %, and at 20, 30, 50 and 70 % the link made faster step by step
(x1.1, 1.25, 1.5, 2, 3, 4, 8 on D2H, on H2D, and on both). Each neighbouring pair is one check;
a pair fails when the step on the larger budget or faster link is slower. Every failing pair is
listed with its excess. Takes about 10 minutes on a 2-core machine (one plan takes 0.5-2 s).

    python benchmarks/monotone_models.py --results benchmarks/results/monotone-models.md
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from slackswap.errors import SlackswapError
from slackswap.hardware import PRESETS
from slackswap.planners import plan_workload
from slackswap.sim import simulate, simulate_ideal
from slackswap.workloads.models import build_model_workload

MODELS = ("bert-large", "gpt2-xl", "llama-7b")
BUDGET_PCTS = range(15, 96)
LINK_FRACTIONS = (0.2, 0.3, 0.5, 0.7)
LINK_FACTORS = (1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 4.0, 8.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="a100-80gb-pcie4", choices=sorted(PRESETS))
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--results", type=Path, help="write the Markdown table here")
    parser.add_argument("--steps-json", type=Path,
                        help="also write every planned step time (s) as JSON, to compare two versions' quality")
    args = parser.parse_args()
    hw = PRESETS[args.preset]
    failures: list[tuple] = []
    steps: dict[str, float] = {}
    checked = 0
    started = time.perf_counter()
    for model in args.models.split(","):
        workload = build_model_workload(model, hw)
        peak = simulate_ideal(workload, hw).peak_memory_bytes

        def step_s(link, budget: int) -> float:
            try:
                found = simulate(workload, link, plan_workload(workload, link, budget, "slackswap"), budget).step_time_s
            except SlackswapError:
                found = float("inf")  # below what the policy can fit: any later fit is an improvement
            steps[f"{model} {budget} B d2h {link.d2h_bytes_per_s:g} h2d {link.h2d_bytes_per_s:g}"] = found
            return found

        previous = None
        for pct in BUDGET_PCTS:
            now = step_s(hw, int(peak * pct / 100))
            if previous is not None:
                checked += 1
                if now > previous[1] * (1 + 1e-12):
                    failures.append((model, "budget", f"{previous[0]} % -> {pct} %", previous[1], now))
            previous = (pct, now)
        for fraction in LINK_FRACTIONS:
            budget = int(peak * fraction)
            for which in ("d2h", "h2d", "both"):
                previous = None
                for factor in LINK_FACTORS:
                    link = hw.replace(
                        d2h_bytes_per_s=hw.d2h_bytes_per_s * (factor if which != "h2d" else 1.0),
                        h2d_bytes_per_s=hw.h2d_bytes_per_s * (factor if which != "d2h" else 1.0))
                    now = step_s(link, budget)
                    if previous is not None:
                        checked += 1
                        if now > previous[1] * (1 + 1e-12):
                            failures.append((model, f"{which} link at {round(100 * fraction)} %",
                                             f"x{previous[0]:g} -> x{factor:g}", previous[1], now))
                    previous = (factor, now)
        print(f"{model}: done after {time.perf_counter() - started:.0f} s, {len(failures)} failing pairs so far",
              file=sys.stderr, flush=True)
    elapsed_s = time.perf_counter() - started
    worst = max((after / before - 1 for *_, before, after in failures), default=0.0)
    summary = (f"{args.preset}: {checked} pairs checked, {len(failures)} failing, "
               f"largest excess {100 * worst:.2f} %, {elapsed_s:.0f} s")
    lines = ["# Monotonicity of `slackswap` on the built-in models", "",
             f"`benchmarks/monotone_models.py --preset {args.preset}`", "", summary, ""]
    if failures:
        lines += ["| model | what grows | from -> to | step before | step after | excess |",
                  "|---|---|---|---:|---:|---:|"]
        lines += [f"| {m} | {what} | {change} | {1e3 * a:.3f} ms | {1e3 * b:.3f} ms | {100 * (b / a - 1):.3f} % |"
                  for m, what, change, a, b in failures]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.results:
        args.results.write_text(text)
    if args.steps_json:
        args.steps_json.write_text(json.dumps(steps, indent=0, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
