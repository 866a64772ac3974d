"""Planning time per policy per model, every policy's throughput on the 0.05 budget grid, the
check that `slackswap` is never below another heuristic there, and `slackswap`'s planning speed
side by side with a previous version.

Run: .venv/bin/python benchmarks/bench_planners.py [--repeats 3] [--out benchmarks/results/planners.md]
     .venv/bin/python benchmarks/bench_planners.py --speed-only [--previous COMMIT]  (new table on top of
         planning-speed.md, the earlier ones kept below it)
     .venv/bin/python benchmarks/bench_planners.py --alone [LAYERS ...]  (appends to planning-speed.md)
Prints medians; writes Markdown results tables. Speed targets live here, not in the tests.

Speed (``--speed-only`` runs only this, into benchmarks/results/planning-speed.md): the previous
version is exported from git (``git archive COMMIT src``) and both versions plan the same
workloads in child processes, alternating, a fresh process per run (process-internal wall time
of ``plan_workload``, the workload built before the clock starts); medians. Targets (issue 17):
llama-7b at 50 % in at most 0.2 s and at most n log n growth in the layer count (gpt2-xl at 192
layers within 5x its 48-layer time), measured over 12-1,024 layers (this version runs every count;
the previous one stops once a run takes STOP_AFTER_CPU_SECONDS). `optimal` is run at
OPTIMAL_BUDGETS only (seconds per solve); its MILP objective, dual bound, simulated result and
solve time are reported beside slackswap.
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
import tarfile
import tempfile
import time
from pathlib import Path

from slackswap._fields import write_text_atomic
from slackswap.experiments.sweep import run_sweep
from slackswap.hardware import PRESETS
from slackswap.planners import HEURISTICS, PLANNERS, plan_workload
from slackswap.sim import simulate, simulate_ideal
from slackswap.workloads.models import MODELS, build_model_workload

HARDWARE = "a100-80gb-pcie4"
BUDGETS = [round(0.2 + 0.05 * i, 2) for i in range(15)]  # 0.20 .. 0.90
OPTIMAL_BUDGETS = [0.3, 0.5, 0.7]
FLOAT_NOISE_PTS = 1e-9


def time_planning(repeats: int) -> dict[tuple[str, str], float]:
    hw = PRESETS[HARDWARE]
    medians = {}
    for model in MODELS:
        budget = None
        for policy in PLANNERS:
            samples = []
            for _ in range(repeats if policy != "optimal" else 1):
                # A fresh workload object each time: no per-workload cache carries over, so this is
                # the cold planning time a single `slackswap plan` pays.
                workload = build_model_workload(model, hw)
                budget = budget or int(0.5 * simulate_ideal(workload, hw).peak_memory_bytes)
                started = time.perf_counter()
                plan_workload(workload, hw, budget, policy)
                samples.append(time.perf_counter() - started)
            medians[(model, policy)] = statistics.median(samples)
            print(f"plan {model:<11} {policy:<20} {medians[(model, policy)]:8.3f} s")
    return medians


def throughput_tables() -> dict[str, list[dict]]:
    hw = PRESETS[HARDWARE]
    tables = {}
    for model in MODELS:
        workload = build_model_workload(model, hw)
        rows = run_sweep(workload, hw, BUDGETS, list(HEURISTICS) + ["slackswap"])
        rows += run_sweep(workload, hw, OPTIMAL_BUDGETS, ["optimal"])
        tables[model] = rows
        print(f"sweep {model} done")
    return tables


def optimal_details() -> list[dict]:
    """MILP figures at OPTIMAL_BUDGETS: objective, dual bound, simulated step, solve time."""
    hw = PRESETS[HARDWARE]
    out = []
    for model in MODELS:
        workload = build_model_workload(model, hw)
        ideal = workload.ideal_step_time_s
        peak = simulate_ideal(workload, hw).peak_memory_bytes
        for fraction in OPTIMAL_BUDGETS:
            budget = int(fraction * peak)
            plan = plan_workload(workload, hw, budget, "optimal")
            mine = plan_workload(workload, hw, budget, "slackswap")
            info = plan.info
            milp_steps = [r["simulated_step_time_s"] for r in info["milp_rounds"] if r["simulated_step_time_s"]]
            solved = "milp_predicted_step_time_s" in info
            out.append({
                "model": model, "fraction": fraction, "units": info["milp_units"],
                "predicted_pct": 100 * ideal / info["milp_predicted_step_time_s"] if solved else None,
                "bound_pct": 100 * ideal / info["milp_bound_step_time_s"] if solved else None,
                "milp_pct": 100 * ideal / min(milp_steps) if milp_steps else None,
                "simulated_pct": simulate(workload, hw, plan, budget).throughput_pct,
                "slackswap_pct": simulate(workload, hw, mine, budget).throughput_pct,
                "source": info["source"],
                "solve_s": info["milp_solve_time_s"], "rounds": len(info["milp_rounds"]),
                "proven": info.get("milp_proven_optimal", False),
            })
            print(f"optimal {model} {fraction}: {out[-1]}")
    return out


_PLAN_IN_A_PROCESS = """
import json, sys
from slackswap.hardware import PRESETS
from slackswap.planners import plan_workload
from slackswap.sim import simulate, simulate_ideal
from slackswap.workloads.models import build_model_workload
hw = PRESETS[sys.argv[1]]
w = build_model_workload(sys.argv[2], hw)
budget = int(float(sys.argv[3]) * simulate_ideal(w, hw).peak_memory_bytes)
plan = plan_workload(w, hw, budget, "optimal")
info = {k: v for k, v in plan.info.items() if "time_s" not in k or "step" in k}  # wall clock differs
t = simulate(w, hw, plan, budget)
print(json.dumps({"plan": plan.to_dict(w) | {"info": info}, "timeline": t.to_dict(),
                  "solve_s": plan.info["milp_solve_time_s"]}, sort_keys=True))
"""


def repeatability(models=("bert-large", "gpt2-xl"), fraction: float = 0.5) -> list[dict]:
    """`optimal` twice per model in separate processes with different hash seeds: are the plans and
    simulated timelines identical (solve wall time aside)?"""
    out = []
    for model in models:
        runs = []
        for seed in ("1", "2"):
            env = dict(os.environ, PYTHONHASHSEED=seed)
            result = subprocess.run([sys.executable, "-c", _PLAN_IN_A_PROCESS, HARDWARE, model, str(fraction)],
                                    capture_output=True, text=True, env=env, check=True)
            runs.append(json.loads(result.stdout))
        same = all(json.dumps(runs[0][k], sort_keys=True) == json.dumps(runs[1][k], sort_keys=True)
                   for k in ("plan", "timeline"))
        out.append({"model": model, "fraction": fraction, "identical": same,
                    "solve_s": [r["solve_s"] for r in runs]})
        print(f"repeat optimal {model} {fraction}: identical={same} solve {out[-1]['solve_s']}")
    return out


PREVIOUS = "543dbc8"  # main before the second round of planning speed-ups (issue 17, item 4); 14d36c9 before the first
PROFILED = Path(__file__).resolve().parent.parent / "tests" / "profiled"
# The built-in models, then the profiled workloads of tests/profiled (1-12 layers; a name ending in
# .json is a workload file).
SPEED_CASES = [("llama-7b", None), ("bert-large", None), ("gpt2-xl", None)] + [
    (f"profiled/{p.name}", None) for p in sorted(PROFILED.glob("*.json"))]
SCALING_LAYERS = [12, 24, 48, 96, 192, 384, 768, 1024]
SCALING_REPEATS_UP_TO = 48  # layer counts up to this get ``repeats`` runs (medians); longer ones one run
STOP_AFTER_CPU_SECONDS = 20.0  # the previous version is not run on longer models once one of its runs takes this long
CURRENT_STOP_AFTER_CPU_SECONDS = 300.0
"""This version's stop, high enough that it runs every SCALING_LAYERS count (gpt2-xl at 1,024 layers
took 81.5 s of CPU alone, planning-speed.md), so the scaling table covers 12-1,024 layers (issue 17);
it only guards the run's length should a change make the long models much slower."""
ALONE_LAYERS = [384, 768, 1024, 2048, 3500]  # --alone: this version only, one run each (issue 15, defect 3)

_TIME_IN_A_PROCESS = """
import json, sys, time
from slackswap.hardware import PRESETS
from slackswap.planners import plan_workload
from slackswap.sim import simulate_ideal
from slackswap.workload import Workload
from slackswap.workloads.models import build_model_workload
hw = PRESETS[sys.argv[1]]
layers = int(sys.argv[3])
def build():
    if sys.argv[2].endswith(".json"):
        return Workload.load(sys.argv[2])
    return build_model_workload(sys.argv[2], hw, **({"layers": layers} if layers else {}))
w = build()
budget = int(float(sys.argv[4]) * simulate_ideal(w, hw).peak_memory_bytes)
w = build()  # no cache carried over
started, started_cpu = time.perf_counter(), time.process_time()
plan = plan_workload(w, hw, budget, "slackswap")
elapsed, elapsed_cpu = time.perf_counter() - started, time.process_time() - started_cpu
actions = [plan.actions[t.name].value for t in w.saved_tensors]
print(json.dumps({"seconds": elapsed, "cpu_seconds": elapsed_cpu, "ops": len(w.ops), "actions": actions,
                  "step_s": plan.info.get("predicted_step_time_s")}))
"""


def export_version(commit: str, into: Path) -> Path:
    """``src`` of ``commit`` extracted under ``into`` (the repository is this file's parent's parent)."""
    repo = Path(__file__).resolve().parent.parent
    archive = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", commit, "src"],
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def time_in_process(src: Path, model: str, layers: int | None, fraction: float) -> dict:
    env = dict(os.environ, PYTHONPATH=str(src), PYTHONHASHSEED="0")
    if model.startswith("profiled/"):
        model = str(PROFILED / model.removeprefix("profiled/"))
    result = subprocess.run([sys.executable, "-c", _TIME_IN_A_PROCESS, HARDWARE, model, str(layers or 0),
                             str(fraction)], capture_output=True, text=True, env=env, check=True)
    return json.loads(result.stdout)


def speed_side_by_side(previous: str, repeats: int, fraction: float = 0.5) -> dict:
    """Both versions on SPEED_CASES (``repeats`` runs each) and the gpt2-xl scaling series (one run
    each beyond SCALING_REPEATS_UP_TO layers; the previous version stopped once a run takes
    STOP_AFTER_CPU_SECONDS of CPU, this one at CURRENT_STOP_AFTER_CPU_SECONDS), alternating; medians.
    Also whether the two versions' plans are identical (actions per saved tensor)."""
    stop_after = {"previous": STOP_AFTER_CPU_SECONDS, "current": CURRENT_STOP_AFTER_CPU_SECONDS}
    sources = {"current": Path(__file__).resolve().parent.parent / "src"}
    rows = []
    load_before = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    with tempfile.TemporaryDirectory() as tmp:
        sources["previous"] = export_version(previous, Path(tmp))
        stopped: set[str] = set()
        for model, layers in SPEED_CASES + [("gpt2-xl", layers) for layers in SCALING_LAYERS]:
            runs: dict[str, list[dict]] = {"previous": [], "current": []}
            unreadable = set()
            for _ in range(repeats if layers is None or layers <= SCALING_REPEATS_UP_TO else 1):
                for version in ("previous", "current"):
                    if version not in stopped and version not in unreadable:
                        try:
                            runs[version].append(time_in_process(sources[version], model, layers, fraction))
                        except subprocess.CalledProcessError as exc:
                            if version != "previous" or "ValidationError" not in exc.stderr:
                                raise
                            # A fixture saved in a workload format added since that version.
                            unreadable.add(version)
            row: dict = {"model": model, "layers": layers}
            if unreadable:
                row["previous_unreadable"] = True
            for version, done in runs.items():
                if done:
                    row["ops"] = done[0]["ops"]
                    row[f"{version}_s"] = statistics.median(r["seconds"] for r in done)
                    row[f"{version}_cpu_s"] = statistics.median(r["cpu_seconds"] for r in done)
                    if layers is not None and max(r["cpu_seconds"] for r in done) > stop_after[version]:
                        stopped.add(version)
            if runs["previous"] and runs["current"]:
                row["same_plan"] = runs["previous"][0]["actions"] == runs["current"][0]["actions"]
            if "ops" in row:
                rows.append(row)
            print(f"speed {model} layers={layers}: {row}")
    return {"previous": previous, "repeats": repeats, "fraction": fraction, "rows": rows,
            "load": (load_before, os.getloadavg()), "commit": _head_commit(),
            "when": (started, time.strftime("%Y-%m-%d %H:%M", time.gmtime()))}


def _head_commit() -> str:
    """The commit this version runs from (with ``+changes`` when the working tree differs from it)."""
    repo = Path(__file__).resolve().parent.parent
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no", "src"],
                           capture_output=True, text=True, check=True).stdout.strip()
    return head + (" with uncommitted changes to src" if dirty else "")


def alone(layer_counts: list[int], fraction: float = 0.5) -> list[dict]:
    """This version alone on gpt2-xl at ``layer_counts`` layers, one run each."""
    src = Path(__file__).resolve().parent.parent / "src"
    rows = []
    for layers in layer_counts:
        load = os.getloadavg()
        row = {"layers": layers, "load": load} | time_in_process(src, "gpt2-xl", layers, fraction)
        rows.append(row)
        print(f"alone gpt2-xl layers={layers}: {row['seconds']:.1f} s wall, {row['cpu_seconds']:.1f} s CPU")
    return rows


def speed_markdown(speed: dict) -> str:
    rows = speed["rows"]
    current_layers = [r["layers"] for r in rows if r["layers"] is not None and "current_s" in r]
    current_stop = (f"this version ran every layer count up to {SCALING_LAYERS[-1]:,}"
                    if current_layers == SCALING_LAYERS else
                    f"this version was stopped after {max(current_layers, default=0):,} layers, a run over "
                    f"{CURRENT_STOP_AFTER_CPU_SECONDS:.0f} s of CPU")
    lines = ["# Planning speed: `slackswap`, this version against a previous one", "",
             f"Hardware preset {HARDWARE}, budget {speed['fraction']:.0%} of each workload's unconstrained "
             f"activation peak. Machine: {platform.processor() or platform.machine()}, Python "
             f"{platform.python_version()}, 2 cores shared with other jobs, so absolute times vary with the "
             "load; the two versions alternate, so their ratio is measured under the same load. Produced by "
             "`benchmarks/bench_planners.py --speed-only`: each version in a fresh process per run; "
             "process-internal time of `plan_workload` (its budget check included, the workload built "
             f"before the clock starts), wall and CPU; median of {speed['repeats']} runs for the built-in "
             f"models, the profiled workloads and the gpt2-xl series up to {SCALING_REPEATS_UP_TO} layers, one run per layer count "
             f"beyond (the previous version is not run on longer models once a run takes over "
             f"{STOP_AFTER_CPU_SECONDS:.0f} s of CPU; {current_stop}). Previous version: commit {speed['previous']}; this version: "
             f"{speed['commit']}. Run on {speed['when'][0]}-{speed['when'][1][-5:]} UTC. Machine load (1/5/15-minute "
             f"load averages, 2 cores): {_load(speed['load'][0])} at the start, {_load(speed['load'][1])} at the "
             "end; under load the wall time is mostly waiting for a core, so the CPU columns are the comparison.", "",
             "*cannot read it*: the previous version refuses the profiled fixture (saved in a workload format "
             "added after it, slackswap.workload/2 with ops' shape inputs).", "",
             "| workload | ops | previous, wall | this version, wall | previous, CPU | this version, CPU | "
             "speed-up (CPU) | same plan |", "|---|---:|---:|---:|---:|---:|---:|---|"]

    def cell(row, key):
        if key in row:
            return f"{row[key]:.3f} s"
        return "cannot read it" if key.startswith("previous") and row.get("previous_unreadable") else "not run"

    for r in rows:
        name = r["model"].removesuffix(".json") if r["layers"] is None else f"{r['model']} L{r['layers']}"
        ratio = f"{r['previous_cpu_s'] / r['current_cpu_s']:.2f}x" if "previous_cpu_s" in r and "current_cpu_s" in r else ""
        same = {True: "yes", False: "no"}.get(r.get("same_plan"), "")
        lines.append(f"| {name} | {r['ops']} | {cell(r, 'previous_s')} | {cell(r, 'current_s')} | "
                     f"{cell(r, 'previous_cpu_s')} | {cell(r, 'current_cpu_s')} | {ratio} | {same} |")
    scaling = {r["layers"]: r for r in rows if r["layers"] is not None}
    for version, label in (("previous", "Previous version"), ("current", "This version")):
        llama = [r[f"{version}_s"] for r in rows if r["model"] == "llama-7b" and f"{version}_s" in r]
        profiled = [r[f"{version}_s"] for r in rows if r["model"].startswith("profiled/") and f"{version}_s" in r]
        which = "the profiled workloads" if len(profiled) == sum(r["model"].startswith("profiled/") for r in rows) \
            else f"the {len(profiled)} profiled workloads it reads"
        if llama and profiled:
            lines += ["", f"{label}: llama-7b at 50 % plans in {llama[0]:.3f} s of process wall time (target: at "
                      f"most 0.2 s); {which} in at most {max(profiled):.3f} s (target: at most 0.1 s)."]
    for version, label in (("previous", "Previous version"), ("current", "This version")):
        key = f"{version}_cpu_s"
        if key in scaling.get(48, {}) and key in scaling.get(192, {}):
            ops = scaling[192]["ops"] / scaling[48]["ops"]
            n_log_n = ops * math.log(scaling[192]["ops"]) / math.log(scaling[48]["ops"])
            lines += ["", f"{label}: gpt2-xl at 192 layers takes {scaling[192][key] / scaling[48][key]:.2f}x "
                      f"its 48-layer CPU time (target: at most 5x; {ops:.2f}x the ops, n log n in the op count "
                      f"would be {n_log_n:.2f}x)."]
            longest = max(layers for layers, r in scaling.items() if key in r)
            if longest > 192:
                ops = scaling[longest]["ops"] / scaling[48]["ops"]
                n_log_n = ops * math.log(scaling[longest]["ops"]) / math.log(scaling[48]["ops"])
                lines += ["", f"{label}: gpt2-xl at {longest:,} layers takes "
                          f"{scaling[longest][key] / scaling[48][key]:.2f}x its 48-layer CPU time ({ops:.2f}x the "
                          f"ops; n log n in the op count from 48 layers would be {n_log_n:.2f}x)."]
    return "\n".join(lines) + "\n"


EARLIER_RUNS = "The tables below are from earlier runs, kept as they were (each labelled with the main it ran on)."


def with_earlier_runs(new_top: str, old_text: str) -> str:
    """``new_top`` followed by every earlier table of ``old_text`` (the file it replaces), kept as
    they were: the old top table's heading becomes a second-level one, so each run stays labelled
    by the commits and date its own text names."""
    if not old_text.strip():
        return new_top
    first, _, rest = old_text.partition("\n")
    if first.startswith("# "):
        old_text = "## An earlier side-by-side run, as written then (" + first[2:].strip() + ")\n" + rest
    return new_top + "\n" + EARLIER_RUNS + "\n\n" + old_text


def _load(averages) -> str:
    return " / ".join(f"{x:.1f}" for x in averages)


def alone_markdown(rows: list[dict]) -> str:
    lines = ["", "## Longer models, this version alone (`--alone`, one run each)", "",
             "| workload | ops | wall | CPU | load at start (1/5/15 min) |", "|---|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| gpt2-xl L{r['layers']} | {r['ops']} | {r['seconds']:.1f} s | {r['cpu_seconds']:.1f} s | "
                     f"{_load(r['load'])} |")
    return "\n".join(lines) + "\n"


def dominance(tables) -> list[str]:
    """Cells where slackswap is below another heuristic (should be none)."""
    losses = []
    for model, rows in tables.items():
        for fraction in BUDGETS:
            at = {r["policy"]: r for r in rows if r["budget_fraction"] == fraction}
            ours = at["slackswap"]["throughput_pct"]
            for name in HEURISTICS:
                theirs = at[name]["throughput_pct"]
                if theirs is not None and (ours is None or ours < theirs - FLOAT_NOISE_PTS):
                    losses.append(f"{model} at {fraction:.2f}: slackswap {ours} < {name} {theirs}")
    return losses


OPTIMAL_HEADING = "## optimal (MILP) against slackswap"


def optimal_section(details: list[dict]) -> list[str]:
    """The Markdown lines of the `optimal` table (heading first)."""
    def pct(value):
        return "none" if value is None else f"{value:.2f} %"

    lines = [OPTIMAL_HEADING, "",
             "Throughput in % of ideal. *predicted*: the MILP objective turned into a step time; *bound*: "
             "HiGHS's dual bound, a bound of the MILP's linear model only (no plan is faster *in that model*; "
             "the simulator can run plans faster, docs/planners.md); *MILP plan*: the fastest of the MILP's "
             "own plans in the simulator; *optimal*: the plan `optimal` returns, the faster in the simulator of "
             "that and `slackswap`'s (*from*).", "",
             "| model | budget | units | predicted | bound | MILP plan | optimal | from | slackswap | "
             "gap (MILP plan - slackswap) | solve time | rounds |",
             "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
    for d in details:
        gap = "none" if d["milp_pct"] is None else f"{d['milp_pct'] - d['slackswap_pct']:+.2f} points"
        lines.append(f"| {d['model']} | {d['fraction']:.1f} | {d['units']} | {pct(d['predicted_pct'])} | "
                     f"{pct(d['bound_pct'])} | {pct(d['milp_pct'])} | {pct(d['simulated_pct'])} | {d['source']} | "
                     f"{pct(d['slackswap_pct'])} | {gap} | {d['solve_s']:.1f} s | {d['rounds']} |")
    return lines


def markdown(medians, tables, details, repeats: int, repeats_optimal: list[dict]) -> str:
    slack_cells = [r["plan_time_s"] for r in tables["llama-7b"] if r["policy"] == "slackswap" and r["fits"]]
    losses = dominance(tables)
    lines = ["# Planner benchmark", "",
             f"Hardware preset {HARDWARE}. Machine: {platform.processor() or platform.machine()}, "
             f"Python {platform.python_version()}, shared with other jobs (2 cores). Produced by "
             "`benchmarks/bench_planners.py`.", "",
             "## Planning time (seconds)", "",
             f"Budget 50% of the unconstrained activation peak; median of {repeats} cold runs (a fresh "
             "workload each time), `optimal` 1 run.", "",
             "| policy | " + " | ".join(MODELS) + " |", "|---|" + "---:|" * len(MODELS)]
    for policy in PLANNERS:
        lines.append(f"| {policy} | " + " | ".join(f"{medians[(m, policy)]:.3f} s" for m in MODELS) + " |")
    lines += ["", f"`slackswap` on llama-7b over the 0.05 grid (in the sweep, workload reused): median "
              f"{statistics.median(slack_cells):.3f} s, worst {max(slack_cells):.3f} s.", "",
              "## slackswap against every other heuristic (0.20 .. 0.90 in steps of 0.05)", "",
              ("No cell where `slackswap` is below another heuristic (exact comparison of throughput, "
               "1e-9 points for float noise)." if not losses else "Cells where slackswap is below: " + "; ".join(losses)),
              "", *optimal_section(details)]
    lines += ["", "## optimal repeats exactly", "",
              "Each model planned twice with `optimal` at the given budget, in separate processes with "
              "different PYTHONHASHSEED; the plan JSON and the simulated timeline are compared byte for byte "
              "(the solve's wall time is left out).", "",
              "| model | budget | plan and timeline identical | solve time, run 1 / run 2 |", "|---|---:|---|---:|"]
    for r in repeats_optimal:
        lines.append(f"| {r['model']} | {r['fraction']:.1f} | {'yes' if r['identical'] else 'NO'} | "
                     f"{r['solve_s'][0]:.1f} s / {r['solve_s'][1]:.1f} s |")
    policies = list(HEURISTICS) + ["slackswap", "optimal"]
    for model, rows in tables.items():
        lines += ["", f"## {model}: throughput (% of ideal) by budget fraction", "",
                  "| budget | " + " | ".join(policies) + " |", "|---:|" + "---:|" * len(policies)]
        for fraction in BUDGETS:
            at = {r["policy"]: r for r in rows if r["budget_fraction"] == fraction}
            cells = [("" if p not in at else f"{at[p]['throughput_pct']:.2f}" if at[p]["fits"] else "n/a")
                     for p in policies]
            lines.append(f"| {fraction:.2f} | " + " | ".join(cells) + " |")
    lines += ["", "n/a: the policy cannot reach that budget (it raises BudgetError); empty: not run "
              f"(`optimal` only at {', '.join(str(b) for b in OPTIMAL_BUDGETS)})."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/planners.md")
    parser.add_argument("--speed-only", action="store_true", help="only the side-by-side planning speed")
    parser.add_argument("--previous", default=PREVIOUS, help="commit of the previous version (default %(default)s)")
    parser.add_argument("--speed-out", default="benchmarks/results/planning-speed.md")
    parser.add_argument("--alone", nargs="*", type=int, metavar="LAYERS",
                        help=f"only time this version on gpt2-xl at these layer counts (default {ALONE_LAYERS}), one "
                             "run each, and append the table to --speed-out")
    args = parser.parse_args()
    if args.alone is not None:
        text = Path(args.speed_out).read_text() + alone_markdown(alone(args.alone or ALONE_LAYERS))
        write_text_atomic(args.speed_out, text)
        print(f"wrote {args.speed_out}")
        return
    speed = speed_side_by_side(args.previous, args.repeats)
    old = Path(args.speed_out).read_text() if Path(args.speed_out).exists() else ""
    write_text_atomic(args.speed_out, with_earlier_runs(speed_markdown(speed), old))
    print(f"wrote {args.speed_out}")
    if args.speed_only:
        return
    medians = time_planning(args.repeats)
    tables = throughput_tables()
    details = optimal_details()
    repeats_optimal = repeatability()
    for loss in dominance(tables):
        print("LOSS", loss)
    write_text_atomic(args.out, markdown(medians, tables, details, args.repeats, repeats_optimal))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
