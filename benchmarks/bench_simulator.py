"""How long one simulated training step takes to compute, on the three built-in models.

For each model: the ideal plan (keep everything, no budget) and a mixed plan (of the saved
tensors in production order, every 3rd is swapped, the next recomputed, the next kept;
prefetch steps as late as possible on the hardware), simulated under its own unlimited peak
as budget so memory checks run. Reports the median and the best of N runs, pinned to one
CPU core where the OS allows.

    .venv/bin/python benchmarks/bench_simulator.py [--runs 20] [--hardware a100-40gb-pcie4] [--output FILE]

With ``--previous COMMIT``, this version against that one (exported from git), each in its own
process, alternating: for each model the ideal and mixed plans above and every simulation one
``slackswap`` planning call at 50 % of the ideal peak runs (recorded from this version's planner
and replayed in both: the plan, the budget, and whether the run keeps a fork; forks resumed),
in process CPU time, with whether both versions' timelines, events and tensor logs are identical.

    .venv/bin/python benchmarks/bench_simulator.py --previous COMMIT --runs 5 \\
        --output benchmarks/results/simulator-side-by-side.md
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

from slackswap.hardware import get_hardware
from slackswap.plans import Action
from slackswap.schedule import make_plan
from slackswap.sim import simulate
from slackswap.workloads.models import MODELS, build_model_workload

TARGET_MS = {"llama-7b": 50.0}  # issue 2: a llama-7b step simulates in under 50 ms


def mixed_actions(workload) -> dict[str, Action]:
    cycle = (Action.SWAP, Action.RECOMPUTE, Action.KEEP)
    movable = [t.name for t in workload.saved_tensors if t.producer is not None]
    return {name: cycle[i % 3] for i, name in enumerate(movable)}


def time_runs(fn, runs: int) -> list[float]:
    fn()  # warm caches (cached workload indices) outside the timing
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


PLANNING_HARDWARE = "a100-80gb-pcie4"  # the preset of the planning-speed tables (issue 17)

# Run in each version's process: the cases' simulations, ``runs`` times; CPU medians per case and a
# digest of everything they produced (timelines with events, forks' timelines or errors, tensor logs).
_REPLAY = """
import hashlib, inspect, json, math, statistics, sys, time
from slackswap.errors import InfeasiblePlanError
from slackswap.hardware import PRESETS
from slackswap.plans import Plan
from slackswap.sim import simulator
from slackswap.workloads.models import build_model_workload
cases, runs = json.load(open(sys.argv[1])), int(sys.argv[2])
hw = PRESETS[cases["hardware"]]
def run_all(workload, sims, full, memory_records=False):
    # Timed (full=False) as the planners run them: event fields kept as records, no Events made;
    # with memory_records, the memory samples too (simulate(memory_records=...), where there is one).
    timeline = simulator._timeline
    if memory_records:
        timeline = lambda sim, budget, records: simulator._timeline(sim, budget, records, [])
    out = []
    for plan, budget, lift_to in sims:
        log = [] if full else None
        sim = simulator._Simulation(workload, hw, plan, budget, log, lift_to=lift_to)
        try:
            sim.run()
        except InfeasiblePlanError as exc:
            out.append(str(exc))
            continue
        fork = None
        if sim.fork is not None:
            try:
                sim.fork.resume()
                fork = timeline(sim.fork, None, None if full else [])
            except InfeasiblePlanError as exc:
                fork = str(exc)
        out.append((timeline(sim, None, None if full else []), fork, log))
    return out
result = {}
for model, groups in cases["models"].items():
    workload = build_model_workload(model, hw)
    for label, raw in groups.items():
        sims = [(Plan.from_dict(p), math.inf if b is None else b, None if l is None else math.inf) for p, b, l in raw]
        digest = hashlib.sha256(repr(run_all(workload, sims, True)).encode()).hexdigest()
        samples = []
        for _ in range(runs):
            started = time.process_time()
            run_all(workload, sims, False)
            samples.append(time.process_time() - started)
        result[model + "/" + label] = {"sims": len(sims), "cpu_s": statistics.median(samples), "digest": digest}
        if "memory_records" in inspect.signature(simulator._timeline).parameters:
            samples = []
            for _ in range(runs):
                started = time.process_time()
                run_all(workload, sims, False, memory_records=True)
                samples.append(time.process_time() - started)
            result[model + "/" + label]["cpu_s_memory_records"] = statistics.median(samples)
print(json.dumps(result))
"""


def planning_simulations(workload, hardware, fraction: float = 0.5) -> list[tuple]:
    """(plan, budget, lift_to) of every simulation one ``slackswap`` planning call at ``fraction``
    of the ideal peak runs, in order (recorded at the simulator's constructor)."""
    from slackswap.planners import plan_workload
    from slackswap.sim import simulate_ideal, simulator

    budget = int(fraction * simulate_ideal(workload, hardware).peak_memory_bytes)
    seen = []
    real = simulator._Simulation.__init__

    def recording(self, w, hw, plan, budget_bytes, tensor_log=None, *, lift_to=None):
        seen.append((plan, budget_bytes, lift_to))
        real(self, w, hw, plan, budget_bytes, tensor_log, lift_to=lift_to)

    simulator._Simulation.__init__ = recording
    try:
        plan_workload(workload, hardware, budget, "slackswap")
    finally:
        simulator._Simulation.__init__ = real
    return seen


def side_by_side(previous: str, runs: int) -> str:
    """Both versions on each model's ideal and mixed plans and one planning call's simulations."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_planners import export_version

    hardware = get_hardware(PLANNING_HARDWARE)
    cases: dict = {"hardware": PLANNING_HARDWARE, "models": {}}
    for model in MODELS:
        workload = build_model_workload(model, hardware)
        mixed = make_plan(workload, mixed_actions(workload), policy="mixed", budget_bytes=None, hardware=hardware)
        groups = {
            "ideal": [(make_plan(workload, {}, policy="ideal", budget_bytes=None), None, None)],
            "mixed 1/3 swap, 1/3 recompute": [(mixed, simulate(workload, hardware, mixed).peak_memory_bytes, None)],
            "slackswap at 50 %: its planning call's simulations": planning_simulations(workload, hardware),
        }
        cases["models"][model] = {
            label: [(plan.to_dict(), None if budget is None or math.isinf(budget) else budget, None if lift_to is None else "inf")
                    for plan, budget, lift_to in sims]
            for label, sims in groups.items()}
    this_commit = subprocess.run(["git", "-C", str(Path(__file__).resolve().parent), "rev-parse", "--short", "HEAD"],
                                 capture_output=True, text=True, check=True).stdout.strip()
    measured: dict[str, list[dict]] = {"previous": [], "current": []}
    with tempfile.TemporaryDirectory() as tmp:
        sources = {"previous": export_version(previous, Path(tmp)), "current": Path(__file__).resolve().parent.parent / "src"}
        case_file = Path(tmp) / "cases.json"
        case_file.write_text(json.dumps(cases))
        for _ in range(2):  # alternating, each process timing ``runs`` replays of every case
            for version in ("previous", "current"):
                env = dict(os.environ, PYTHONPATH=str(sources[version]), PYTHONHASHSEED="0")
                done = subprocess.run([sys.executable, "-c", _REPLAY, str(case_file), str(runs)],
                                      capture_output=True, text=True, env=env, check=True)
                measured[version].append(json.loads(done.stdout))
    lines = [
        f"## This version ({this_commit}) against commit {previous} ({date.today().isoformat()})", "",
        "Process CPU time of the simulations of each case (made, run, forks resumed, timelines made with the",
        f"events kept as records, as the planners ask), median of {runs} replays in each of two processes per",
        f"version (alternating; the table gives the lower of the two medians). Hardware preset `{PLANNING_HARDWARE}`,",
        f"Python {platform.python_version()} on {platform.machine()}. \"Identical\": both versions' timelines (with",
        "events and memory samples), forks' runs or errors and tensor logs are equal.",
        f"Command: `.venv/bin/python benchmarks/bench_simulator.py --previous {previous} --runs {runs} "
        "--output benchmarks/results/simulator-side-by-side.md`; load average at the start: "
        f"{os.getloadavg()[0]:.1f} (the machine is shared; CPU time is the comparison).", "",
        "The last column: this version with the memory samples handed over as records too",
        "(`simulate(memory_records=...)`), which the planners do not ask for yet.", "",
        "| model | case | simulations | previous (ms CPU) | this version (ms CPU) | ratio | identical "
        "| this version, memory as records (ms CPU) |",
        "|---|---|---:|---:|---:|---:|---|---:|",
    ]
    for key in measured["current"][0]:
        model, label = key.split("/", 1)
        before = min(m[key]["cpu_s"] for m in measured["previous"]) * 1e3
        after = min(m[key]["cpu_s"] for m in measured["current"]) * 1e3
        same = measured["previous"][0][key]["digest"] == measured["current"][0][key]["digest"]
        as_records = min(m[key]["cpu_s_memory_records"] for m in measured["current"]) * 1e3
        lines.append(f"| {model} | {label} | {measured['current'][0][key]['sims']} | {before:.1f} | {after:.1f} "
                     f"| {before / after:.2f}x | {'yes' if same else 'NO'} | {as_records:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--hardware", default="a100-40gb-pcie4")
    parser.add_argument("--output", help="also write the markdown table to this file")
    parser.add_argument("--previous", help="compare with this commit, side by side (planning preset, CPU time)")
    args = parser.parse_args(argv)
    if args.previous:
        table = side_by_side(args.previous, args.runs)
        print(table)
        if args.output:
            Path(args.output).write_text("# Simulator speed, side by side with a previous version\n\n" + table + "\n",
                                         encoding="utf-8")
        return 0 if "| NO |" not in table else 1
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    hardware = get_hardware(args.hardware)
    rows = []
    for model in MODELS:
        workload = build_model_workload(model, hardware)
        ideal = make_plan(workload, {}, policy="ideal", budget_bytes=None)
        mixed = make_plan(workload, mixed_actions(workload), policy="mixed", budget_bytes=None, hardware=hardware)
        mixed_budget = simulate(workload, hardware, mixed).peak_memory_bytes
        for label, plan, budget in (("ideal", ideal, None), ("mixed 1/3 swap, 1/3 recompute", mixed, mixed_budget)):
            timeline = simulate(workload, hardware, plan, budget)
            samples = time_runs(lambda: simulate(workload, hardware, plan, budget, check=False), args.runs)
            checked = time_runs(lambda: simulate(workload, hardware, plan, budget), args.runs)
            rows.append((model, len(workload.ops), len(workload.saved_tensors), label, len(timeline.events),
                         statistics.median(samples) * 1e3, min(samples) * 1e3,
                         statistics.median(checked) * 1e3, timeline.step_time_s * 1e3))
            print(f"{model:10s} {label:32s} median {rows[-1][5]:7.2f} ms  best {rows[-1][6]:7.2f} ms  "
                  f"with plan check {rows[-1][7]:7.2f} ms ({len(timeline.events)} events; "
                  f"simulated step {rows[-1][8]:.1f} ms)", flush=True)
    lines = [
        f"Wall time of one `simulate()` call: median and best of {args.runs} runs with the plan check off, and the",
        f"median with it on (the default). One CPU core, hardware preset `{args.hardware}`, "
        f"Python {platform.python_version()} on {platform.machine()}.",
        "Command: `.venv/bin/python benchmarks/bench_simulator.py --output benchmarks/results/simulator.md`.",
        "",
        "| model | ops | saved tensors | plan | events | median (ms) | best (ms) | median with check (ms) "
        "| simulated step (ms) |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for model, ops, saved, label, events, median_ms, best_ms, checked_ms, step_ms in rows:
        lines.append(f"| {model} | {ops} | {saved} | {label} | {events} | {median_ms:.2f} | {best_ms:.2f} "
                     f"| {checked_ms:.2f} | {step_ms:.1f} |")
    failed = [(m, l, med) for m, _, _, l, _, med, _, chk, _ in rows if m in TARGET_MS and max(med, chk) > TARGET_MS[m]]
    lines.append("")
    lines.append("Target: " + ", ".join(f"{m} under {v:.0f} ms median" for m, v in TARGET_MS.items())
                 + (" - met." if not failed else f" - NOT met: {failed}."))
    table = "\n".join(lines)
    print()
    print(table)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            handle.write("# Simulator benchmark\n\n" + table + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
