"""Count how often "more bandwidth or more budget never makes `slackswap` slower" fails.

The property tests in tests/test_invariants.py stop at the first failing case and run 120
derandomized cases in CI. This hunt draws new random cases (the same generators), records every
failing draw, and writes them to a JSON file to pin or study. One draw checks both properties:
a faster link (x1.5, x2 or x10 on D2H, H2D or both) and a larger budget.

Run: .venv/bin/python benchmarks/hunt_monotone.py --draws 20000 --seed 42 [--out failures.json]
         [--results benchmarks/results/monotone.md]
     .venv/bin/python benchmarks/hunt_monotone.py --exhaustive --draws 1500 --seed 3
With --exhaustive the plans come from the exhaustive search of tests/brute_force.py instead
(workloads of at most 6 candidate tensors): is the property true of exact answers?
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import test_invariants as cases  # noqa: E402  (the generators of the property tests)
from brute_force import best_step_time_s, candidates  # noqa: E402
from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--exhaustive", action="store_true")
    parser.add_argument("--out", type=Path, help="every failing draw as JSON (workload, hardware, budgets)")
    parser.add_argument("--results", type=Path, help="a Markdown table of the failing draws")
    args = parser.parse_args()

    failures: list[dict] = []
    counted = [0]

    def step_s(workload, hw, budget) -> float:
        if args.exhaustive:
            return best_step_time_s(workload, hw, budget)[0]
        return cases.slackswap_step_s(workload, hw, budget)

    @settings(max_examples=args.draws, deadline=None, database=None, phases=(Phase.generate,),
              suppress_health_check=list(HealthCheck))
    @given(workload=cases.workloads(max_ops=5 if args.exhaustive else 7), hw=cases.hardware(),
           where=cases.budget_points, factor=st.sampled_from([1.5, 2.0, 10.0]),
           which=st.sampled_from(["d2h", "h2d", "both"]), more=st.floats(0.01, 1.0))
    def draw(workload, hw, where, factor, which, more):
        if args.exhaustive and len(candidates(workload)) > 6:
            return
        counted[0] += 1
        budget, _, peak = cases.budget_between(workload, hw, where)
        faster = hw.replace(
            d2h_bytes_per_s=hw.d2h_bytes_per_s * (factor if which in ("d2h", "both") else 1),
            h2d_bytes_per_s=hw.h2d_bytes_per_s * (factor if which in ("h2d", "both") else 1))
        larger = budget + max(1, int(more * (peak - budget)))
        base = step_s(workload, hw, budget)
        common = {"budget_bytes": budget, "base_step_s": base, "workload": json.loads(workload.to_json()),
                  "hardware": hw.to_dict()}
        fast = step_s(workload, faster, budget)
        if fast > base * (1 + cases.REL):
            failures.append({"kind": "bandwidth", "which": which, "factor": factor, "other_step_s": fast, **common})
        loose = step_s(workload, hw, larger)
        if loose > base * (1 + cases.REL):
            failures.append({"kind": "budget", "larger_budget_bytes": larger, "other_step_s": loose, **common})

    started = time.perf_counter()
    seed(args.seed)(draw)()
    elapsed_s = time.perf_counter() - started
    worst = max((f["other_step_s"] / f["base_step_s"] - 1 for f in failures), default=0.0)
    by_kind = {k: sum(f["kind"] == k for f in failures) for k in ("bandwidth", "budget")}
    summary = (f"{'exhaustive search' if args.exhaustive else 'slackswap'}: {counted[0]} draws (seed {args.seed}), "
               f"{len(failures)} failing ({by_kind['bandwidth']} bandwidth, {by_kind['budget']} budget), "
               f"largest excess {100 * worst:.2f} %, {elapsed_s:.0f} s")
    print(summary)
    if args.out:
        args.out.write_text(json.dumps(failures, indent=1) + "\n")
    if args.results:
        args.results.write_text(results_markdown(summary, " ".join(sys.argv[1:]), failures))


def results_markdown(summary: str, arguments: str, failures: list[dict]) -> str:
    lines = ["# Monotonicity hunt", "", f"`benchmarks/hunt_monotone.py {arguments}`", "", summary, ""]
    if failures:
        lines += ["| property | change | budget | step before | step after | excess | ops | tensors |",
                  "|---|---|---:|---:|---:|---:|---:|---:|"]
        for f in failures:
            if f["kind"] == "bandwidth":
                change = f"{f['which']} x{f['factor']}"
            else:
                change = f"budget to {f['larger_budget_bytes']} B"
            excess = 100 * (f["other_step_s"] / f["base_step_s"] - 1)
            lines.append(f"| {f['kind']} | {change} | {f['budget_bytes']} B | {f['base_step_s']:.4f} s | "
                         f"{f['other_step_s']:.4f} s | {excess:.2f} % | {len(f['workload']['ops'])} | "
                         f"{len(f['workload']['tensors'])} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
