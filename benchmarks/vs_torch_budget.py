"""slackswap's recompute-only and mixed plans beside PyTorch's activation memory budget, in one run.

For each model (the three example models and Hugging Face GPT-2, Llama, BERT and ViT built from
the small configs of tests/profiled/make_fixtures.py, train mode, CPU) and each budget
0.2-0.8 of ``torch._functorch.config.activation_memory_budget``:

- torch: the model compiled like ``torch.compile(backend="aot_eager_decomp_partition")`` under
  that budget (its decompositions and its min-cut partitioner with the knapsack over what to
  recompute; vs_torch_compiled.py wraps the partition function to read what it saves);
- slackswap's recompute-only plan (`recompute-optimal`) and mixed plan (`slackswap`), planned
  for a budget in bytes equal to what torch's plan holds for backward (so both sides are compared
  at equal bytes held; slackswap's budget bounds its peak of saved bytes, which is at least what
  it holds at the boundary), run by slackswap's eager runtime (``slackswap.apply``);
- the recompute-only plan of slackswap's recompute space that re-runs the fewest FLOPs it finds
  within the same budget (``recompute_space.frontier_descent(..., objective="flops")``, torch's
  knapsack objective), so that the table separates what slackswap's objective (simulated time)
  chooses from what its recompute space allows;
- the compiled path (``--paths compiled``, vs_torch_compiled.py): the same three plans made by
  slackswap's own partition function on the joint graph torch partitions (``saved_set="min-cut"``:
  the candidates are what PyTorch's min-cut partitioner saves with no matmul re-run), each graph
  planned for the bytes torch's forward saves in that graph (its activations and step inputs);
  torch's plan simulated on the same workload; and `recompute-optimal` for the peak torch's plan
  reaches in that simulation (a budget torch's plan meets in slackswap's model).

Measured in the same process, one step each: the bytes held for backward when the forward pass
ends (torch: the distinct storages its compiled function saves, by saved-tensor hooks, less the
parameters and the batch; slackswap: ``runtime.stats.device_saved_bytes``, what its manager
holds on the device) and the backward FLOPs (``torch.utils.flop_counter.FlopCounterMode`` around
``loss.backward()``, so recompute counts; as a change from the same execution with nothing
recomputed: torch's plan at budget 1.0, the plain eager step for slackswap's); and for slackswap's plans the simulated throughput on
a100-80gb-pcie4 (the workload profiled with that preset's roofline). Per model it also reports
what torch holds at budget 1.0 and slackswap's keep-all bytes and minimum budget
(``minimum_budget_bytes``: no plan of any policy holds less in eager autograd's saved tensors).

Writes a markdown table to benchmarks/results/vs-torch-budget.md (or ``--out``). The whole grid
is long on a small machine, so it can be run a model at a time: ``--rows FILE`` saves the rows
of one run as JSON, and ``--merge FILE,FILE,...`` writes the table from saved rows without
running anything (rows of one model and budget from runs of different ``--paths`` are joined). The
committed table is every model at ``--budgets 0.2,0.4,0.6,0.8``. One larger model, ``example-gpt2-medium`` (LARGER),
is not in the default ``--models``: run alone with ``--paths compiled`` it fills its own section of the compiled
table and leaves the other rows as they are (and a run of the others keeps its section).

    PYTHONPATH=src python benchmarks/vs_torch_budget.py [--models example-gpt2,hf-gpt2] [--budgets 0.3,0.5]
    PYTHONPATH=src python benchmarks/vs_torch_budget.py --models hf-bert --rows /tmp/hf-bert.json
    PYTHONPATH=src python benchmarks/vs_torch_budget.py --merge /tmp/hf-gpt2.json,/tmp/hf-bert.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

import slackswap
from slackswap.errors import BudgetError
from slackswap.examples import ExampleConfig, loss_fn, make_batch, make_example
from slackswap.hardware import PRESETS
from slackswap.planners import minimum_budget_bytes
from slackswap.planners.common import build, facts_for
from slackswap.planners.recompute_space import frontier_descent
from slackswap.planners.selection import actions_for
from slackswap.sim import simulate, simulate_ideal

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vs_torch_compiled as compiled_path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
HW = PRESETS["a100-80gb-pcie4"]
BUDGETS = (0.2, 0.4, 0.6, 0.8)
POLICIES = ("recompute-optimal", "slackswap", "least-flops")
COMPILED_POLICIES = ("recompute-optimal", "slackswap", compiled_path.FEWEST_FLOPS, compiled_path.HOLDING,
                     compiled_path.MIXED)
"""The compiled path's columns besides AT_PEAK."""
AT_PEAK = "recompute-optimal at torch's peak"
"""The compiled path's fourth column: `recompute-optimal` for the peak torch's plan reaches in slackswap's model."""
"""slackswap's columns: its two policies, then the fewest-FLOPs recompute-only plan of its space
(on the eager path and, as "compiled <policy>", on the compiled path)."""


def _makers():
    spec = importlib.util.spec_from_file_location("make_fixtures", ROOT / "tests" / "profiled" / "make_fixtures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {**module.MAKERS, LARGER: _larger_gpt2}


LARGER = "example-gpt2-medium"
"""A model large enough that a copy can end within its forward pass on a100-80gb-pcie4 (the others' forward
passes, 2-13 us simulated, are shorter than one copy's 6 us latency); run alone, not in the default --models."""
MEDIUM = ExampleConfig(vocab=1024, seq_len=256, hidden=512, heads=8, layers=2, ffn=2048, micro_batch=2)


def _larger_gpt2():
    return make_example("gpt2", MEDIUM), make_batch(MEDIUM), loss_fn


def _fresh(maker):
    torch.manual_seed(0)
    model, batch, loss_fn = maker()
    model.train()
    return model, batch, loss_fn


def _excluded_storages(model, batch) -> set[int]:
    tensors = list(model.parameters()) + list(model.buffers())
    values = batch.values() if isinstance(batch, dict) else batch
    tensors += [t for t in values if isinstance(t, torch.Tensor)]
    return {t.untyped_storage().data_ptr() for t in tensors}


def torch_step(maker, budget: float):
    """(bytes held for backward, backward FLOPs, per compiled graph: its activation bytes and its
    plan's simulation or None) of one step compiled under ``budget`` (vs_torch_compiled.torch_step)."""
    model, batch, loss_fn = _fresh(maker)
    return compiled_path.torch_step(model, batch, loss_fn, budget, HW, _excluded_storages(model, batch))


def compiled_step(maker, policy: str, budgets_bytes: list[int], torch_budget: float | None = None):
    """slackswap's plan of ``policy`` on the compiled path, each graph planned for its budget
    (vs_torch_compiled.slackswap_step), less the plans. The fewest-FLOPs plan runs with the partitioner's
    FLOPs objective, its candidates widened with torch's own saved set at ``torch_budget``."""
    model, batch, loss_fn = _fresh(maker)
    make = compiled_path.plan_maker(policy, budgets_bytes, HW, least_flops_plan)
    flops = policy == compiled_path.FEWEST_FLOPS
    objective = "flops" if flops else "mixed" if policy == compiled_path.MIXED else "time"
    result = compiled_path.slackswap_step(model, batch, loss_fn, make, HW, _excluded_storages(model, batch),
                                          objective=objective,
                                          torch_budget=torch_budget if objective != "time" else None)
    if isinstance(result, str):
        return result
    if flops and any(g.plan.info.get("search") == "cut off" for g in result[3]):  # keep-all plans have no search
        raise RuntimeError("a fewest-FLOPs search stopped at its node cap: the table says every search completed")
    if objective == "mixed":  # and the bytes its plans swap, to say whether they mix at all
        return [*result[:3], sum(g.swapped_bytes for g in result[3])]
    return list(result[:3])



def eager_backward_flops(maker) -> int:
    """Backward FLOPs of the plain eager step: the baseline of slackswap's columns."""
    model, batch, loss_fn = _fresh(maker)
    torch.manual_seed(1)
    loss = loss_fn(model, batch)
    with FlopCounterMode(display=False) as counter:
        loss.backward()
    return counter.get_total_flops()


def least_flops_plan(workload, budget_bytes: int):
    """The recompute-only plan of slackswap's recompute space with the fewest recomputed FLOPs
    its search finds within ``budget_bytes`` (None: none found)."""
    chosen, _ = frontier_descent(facts_for(workload), budget_bytes, objective="flops")
    if chosen is None:
        return None
    plan = build(workload, HW, actions_for(recompute=chosen), "least-flops", budget_bytes)
    return plan if simulate(workload, HW, plan, math.inf, check=False).peak_memory_bytes <= budget_bytes else None


def slackswap_step(maker, workload, budget_bytes: int, policy: str) -> tuple[int, int, float] | str:
    """(bytes held for backward, backward FLOPs, simulated throughput %) of one step under the
    policy's plan for ``budget_bytes``; why not when there is no plan ("below minimum": under
    minimum_budget_bytes, which no plan reaches; "refuses": the policy's BudgetError)."""
    if budget_bytes < minimum_budget_bytes(workload):
        return "below minimum"
    if policy == "least-flops":
        plan = least_flops_plan(workload, budget_bytes)
        if plan is None:
            return "none found"
    else:
        try:
            plan = slackswap.plan(workload, budget=budget_bytes, policy=policy, hardware=HW)
        except BudgetError:
            return "refuses"
    model, batch, loss_fn = _fresh(maker)
    runtime = slackswap.apply(model, plan, workload=workload)
    torch.manual_seed(1)
    with runtime:
        loss = loss_fn(model, batch)
        held = runtime.stats.device_saved_bytes
        with FlopCounterMode(display=False) as counter:
            loss.backward()
    throughput = simulate(workload, HW, plan, budget_bytes).throughput_pct
    return held, counter.get_total_flops(), throughput


def main(argv=None) -> int:
    makers = _makers()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(name for name in makers if name != LARGER))
    parser.add_argument("--budgets", default=",".join(str(b) for b in BUDGETS))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "vs-torch-budget.md"))
    parser.add_argument("--rows", help="also save this run's rows (JSON) here, for --merge")
    parser.add_argument("--merge", help="comma-separated row files of earlier runs: write their table, run nothing "
                        "(rows of the same model and budget from runs of different --paths are joined)")
    parser.add_argument("--paths", default="eager,compiled", help="which of slackswap's columns to run: eager, compiled")
    args = parser.parse_args(argv)
    if args.merge:
        pieces = [json.loads(Path(f).read_text()) for f in args.merge.split(",")]
        joined: dict[tuple[str, float], dict] = {}
        for piece in pieces:
            for row in piece["rows"]:
                joined.setdefault((row["model"], row["budget"]), {}).update(row)
        _write(Path(args.out), list(joined.values()), sum(piece["elapsed_s"] for piece in pieces))
        print(f"wrote {args.out}")
        return 0
    budgets = [float(b) for b in args.budgets.split(",")]
    paths = set(args.paths.split(","))
    started = time.perf_counter()
    rows = []
    for name in args.models.split(","):
        maker = makers[name]
        model_started, load_before = time.perf_counter(), os.getloadavg()[0]
        first_row = len(rows)
        full_held, full_flops, _ = torch_step(maker, 1.0)
        common = {"model": name, "full_held": full_held, "full_flops": full_flops}
        if "eager" in paths:
            model, batch, loss_fn = _fresh(maker)
            workload = slackswap.profile(model, batch, loss_fn, hardware=HW, repeats=1)
            common.update(eager_flops=eager_backward_flops(maker), keep_all_bytes=simulate_ideal(workload, HW).peak_memory_bytes,
                          minimum_bytes=minimum_budget_bytes(workload))
        if "compiled" in paths:
            keep_held, keep_flops, _ = compiled_step(maker, "keep-all", [])
            common.update(compiled_keep_held=keep_held, compiled_keep_flops=keep_flops)
        for budget in budgets:
            held, flops, graphs = torch_step(maker, budget)
            row = dict(common, budget=budget, torch_held=held, torch_flops=flops)
            if "eager" in paths:
                for policy in POLICIES:
                    row[policy] = slackswap_step(maker, workload, max(1, held), policy)
            if "compiled" in paths:
                row.update(_compiled_columns(maker, graphs, budget))
            rows.append(row)
            print(_line(row), flush=True)
        run = (f"{name} {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, commit {_commit()}, "
               f"{time.perf_counter() - model_started:.0f} s, load (1-min average) {load_before:.2f} -> "
               f"{os.getloadavg()[0]:.2f}")
        for row in rows[first_row:]:
            row["run"] = run
    elapsed = time.perf_counter() - started
    if args.rows:
        Path(args.rows).write_text(json.dumps({"elapsed_s": elapsed, "rows": rows}))
    _write(Path(args.out), rows, elapsed)
    print(f"wrote {args.out} ({elapsed:.0f} s)")
    return 0


def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _write(out: Path, rows, elapsed_s: float) -> None:
    """The table of ``rows``; rows of the compiled path alone replace the compiled section of ``out``."""
    if out.exists() and not any("eager_flops" in row for row in rows) and COMPILED_HEADING in out.read_text():
        out.write_text(_splice_compiled(out.read_text(), rows))
    else:
        out.write_text(_table(rows, elapsed_s))


def _compiled_columns(maker, torch_graphs, budget: float) -> dict:
    """The compiled path's columns of one row: slackswap's plans for torch's bytes held, graph by graph,
    and `recompute-optimal` for the peak torch's plan reaches in slackswap's model where it is one of
    the workload's plans."""
    timelines = [timeline for _, timeline, _ in torch_graphs]
    shares = compiled_path.shared_budgets(torch_graphs)
    columns = {"torch_graph_held": [share for share, _, _ in torch_graphs], "graph_budgets": shares,
               "torch_throughput": None if None in timelines else compiled_path.step_throughput_pct(timelines)}
    for policy in COMPILED_POLICIES:
        # The fewest-FLOPs and mixed plans bound what each graph holds at its boundary: torch's bytes there as they are.
        budgets = ([share for share, _, _ in torch_graphs] if policy in (compiled_path.FEWEST_FLOPS, compiled_path.MIXED)
                   else shares)
        columns[f"compiled {policy}"] = compiled_step(maker, policy, budgets, budget)
    columns[f"compiled {AT_PEAK}"] = ("torch's plan not in the space" if None in timelines else
                                      compiled_step(maker, "recompute-optimal", [t.peak_memory_bytes for t in timelines]))
    return columns


def _cell(result, row, baseline_key: str = "eager_flops") -> str:
    if isinstance(result, str):
        return f"{result} | - | -"
    held, flops, throughput = result[:3]
    extra = 100.0 * (flops - row[baseline_key]) / row[baseline_key] if row[baseline_key] else math.nan
    return f"{held / 1024:.1f} KiB | {extra:+.1f} % | {throughput:.2f} %"


def _kib(value) -> str:
    return "-" if value is None else f"{value / 1024:.1f} KiB"


def _line(row) -> str:
    return (f"{row['model']} {row['budget']}: torch {row['torch_held']} B, {row['torch_flops']} FLOPs; "
            + "; ".join(f"{key} {value}" for key, value in row.items() if key in POLICIES or key.startswith("compiled ")
                        or key == "torch_throughput"))


def _table(rows, elapsed_s: float) -> str:
    lines = [
        "# slackswap beside PyTorch's activation memory budget",
        "",
        "Produced by `benchmarks/vs_torch_budget.py` (one step per cell, CPU, float32, "
        f"{elapsed_s:.0f} s for the whole table on a shared 2-core machine, run a model at a time). Bytes held: "
        "what is saved for backward when the forward pass ends (torch: distinct storages its compiled function "
        "saves, parameters and batch excluded; slackswap: the runtime's device_saved_bytes). Backward FLOPs: "
        "FlopCounterMode around loss.backward(), as a change from the same mode with nothing recomputed: "
        "torch's plan at budget 1.0 for torch's column, the plain eager step for slackswap's (the eager "
        "and the decomposed compiled backward count differently). Slackswap plans for a budget equal to torch's "
        "bytes held at that row; throughput: simulated on a100-80gb-pcie4. least-FLOPs: the recompute-only plan "
        "of slackswap's recompute space with the fewest recomputed FLOPs its search finds in that budget "
        "(torch's knapsack objective), not a policy. below minimum: under the least budget any slackswap plan "
        "reaches (minimum_budget_bytes, below); refuses: the policy's BudgetError.",
        "",
        "| model | torch budget | torch held | torch bwd FLOPs | recompute-optimal held | its bwd FLOPs | its "
        "throughput | slackswap held | its bwd FLOPs | its throughput | least-FLOPs held | its bwd FLOPs | its "
        "throughput |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if "eager_flops" not in row:
            continue
        extra = 100.0 * (row["torch_flops"] - row["full_flops"]) / row["full_flops"] if row["full_flops"] else math.nan
        cells = " | ".join(_cell(row[policy], row) for policy in POLICIES)
        lines.append(f"| {row['model']} | {row['budget']:.1f} | {row['torch_held'] / 1024:.1f} KiB | {extra:+.1f} % | "
                     f"{cells} |")
    others = [row for row in rows if row["model"] != LARGER]
    larger = [row for row in rows if row["model"] == LARGER]
    lines += _compiled_section(others) + (_larger_section(larger) if larger else [])
    lines += [
        "",
        "What each side holds with nothing recomputed, and the least slackswap can hold:",
        "",
        "| model | torch held at budget 1.0 | slackswap keep-all peak | slackswap minimum budget | compiled keep-all "
        "held |",
        "|---|---|---|---|---|",
    ]
    seen = set()
    for row in rows:
        if row["model"] not in seen:
            seen.add(row["model"])
            cells = [_kib(row.get(key)) for key in ("full_held", "keep_all_bytes", "minimum_bytes", "compiled_keep_held")]
            lines.append(f"| {row['model']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


COMPILED_HEADING = "## The compiled path: the same joint graph"
SUMMARY_HEADING = "What each side holds with nothing recomputed"
LARGER_HEADING = "### A larger model: copies that end within the forward pass"


def _compiled_section(rows) -> list[str]:
    lines = [
        "",
        COMPILED_HEADING,
        "",
        "slackswap's own partition function (`slackswap.compiled.partition.PlanningPartitioner`, "
        "`saved_set=\"min-cut\"`) on the joint graph torch partitions (the decompositions of "
        "`aot_eager_decomp_partition`): its plans choose among the tensors PyTorch's min-cut partitioner saves "
        "with no matmul re-run (`slackswap.compiled.min_cut`), each graph planned for the bytes torch's forward "
        "saves in it (activations and step inputs; the step inputs are the batch or, after a graph break, the "
        "previous graph's outputs). Bytes held: "
        "distinct activation storages the compiled forward saves (torch: by saved-tensor hooks as above; slackswap: "
        "the partition's saved layout, so that the RNG states of replayed dropouts, 5,056 bytes each for a CPU "
        "generator, and swapped tensors' host copies are left out). Backward FLOPs: FlopCounterMode around "
        "loss.backward(), both sides as a change from slackswap's keep-all plan on the same graph (nothing "
        "recomputed that counts FLOPs). Throughput: simulated on a100-80gb-pcie4 on the graph's workload; torch's "
        "plan simulated as its saved set (saved candidates kept, the others recomputed; - where it saves a "
        "tensor that is no candidate). fewest FLOPs holding torch's bytes: `PlanningPartitioner(objective=\"flops\", "
        "torch_budget=<the row's budget>)`, the plan `slackswap.compiled.fewest_flops` finds exactly (branch and "
        "bound; every search here completed) among the min-cut candidates widened with torch's own saved set at "
        "that budget, with what each graph holds when its forward pass ends (kept tensors and step inputs) at most "
        "torch's bytes in that graph, each re-run node run once. recompute-optimal holding torch's bytes: its plan "
        "for the largest budget "
        "(bisected, 10 steps) whose kept tensors and step inputs, what it holds when the forward pass ends, are at "
        "most torch's bytes in that graph, so that both hold the same. mixed holding torch's bytes: "
        "`PlanningPartitioner(objective=\"mixed\", torch_budget=<the row's budget>)`, the fastest plan in the "
        "simulator (`slackswap.compiled.mixed_held`, a descent over keep / swap / recompute from the fewest-FLOPs "
        "plan, from torch's own plan and from recompute-optimal holding torch's bytes) with what each graph holds when its forward pass ends at most torch's "
        "bytes there; a swapped tensor counts as not held only if the simulator ends its copy out before the "
        "forward pass ends. recompute-optimal at torch's peak: planned, "
        "graph by graph, for the peak "
        "torch's plan reaches in that simulation, which counts the backward's rebuilt tensors too (a budget torch's "
        "plan meets in slackswap's model). Where the budget is at least the keep-all plan's peak, the keep-all plan "
        "is used.",
        "",
    ]
    return lines + _compiled_rows(rows)


def _compiled_rows(rows) -> list[str]:
    """The compiled path's table of ``rows`` and its counts."""
    lines = [
        "| model | torch budget | torch held | torch bwd FLOPs | torch simulated | recompute-optimal held | its bwd "
        "FLOPs | its throughput | slackswap held | its bwd FLOPs | its throughput | fewest FLOPs holding torch's "
        "bytes: held | its bwd FLOPs | its throughput | recompute-optimal holding torch's bytes: held | its bwd "
        "FLOPs | its throughput | mixed holding torch's bytes: held | its bwd FLOPs | its throughput | "
        "recompute-optimal at torch's peak: held | its bwd FLOPs | its throughput |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    compiled = [row for row in rows if "compiled_keep_flops" in row]
    for row in compiled:
        base = row["compiled_keep_flops"]
        extra = 100.0 * (row["torch_flops"] - base) / base if base else math.nan
        simulated = "-" if row["torch_throughput"] is None else f"{row['torch_throughput']:.2f} %"
        cells = " | ".join(_cell(row[f"compiled {policy}"], row, "compiled_keep_flops")
                           for policy in (*COMPILED_POLICIES, AT_PEAK))
        lines.append(f"| {row['model']} | {row['budget']:.1f} | {row['torch_held'] / 1024:.1f} KiB | {extra:+.1f} % | "
                     f"{simulated} | {cells} |")
    lines += ["", "Cells where a column holds at most torch's bytes and re-runs no more FLOPs than torch's plan "
              "(backward FLOPs measured, both in the same run), of the cells where it has a plan:", ""]
    for policy in COMPILED_POLICIES:
        results = [(row, row[f"compiled {policy}"]) for row in compiled]
        planned = [(row, r) for row, r in results if not isinstance(r, str)]
        meets = [row for row, (held, flops, *_) in planned if held <= row["torch_held"] and flops <= row["torch_flops"]]
        lines.append(f"- {policy}: {len(meets)} of {len(planned)} ({len(results)} cells)")
    simulated = [row for row in compiled if row["torch_throughput"] is not None]
    faster = [row for row in simulated for r in [row[f"compiled {compiled_path.MIXED}"]] if not isinstance(r, str)
              and r[0] <= row["torch_held"] and r[2] >= row["torch_throughput"]]
    lines += ["", f"Cells where {compiled_path.MIXED} holds at most torch's bytes and simulates at least as fast as "
              f"torch's plan, of the cells where torch's plan is simulated: {len(faster)} of {len(simulated)} "
              f"({len(compiled)} cells)."]
    mixed = [r for row in compiled for r in [row[f"compiled {compiled_path.MIXED}"]] if not isinstance(r, str)]
    swapping = [r for r in mixed if len(r) > 3 and r[3] > 0]
    lines.append(f"Its plans swap a tensor in {len(swapping)} of the {len(mixed)} cells where it has a plan "
                 "(a swap counts only if its copy out ends before the forward pass does; a copy takes 6 us "
                 "before its bytes, a100-80gb-pcie4's copy latency).")
    runs = [run for row in compiled for run in [row.get("run")] if run]
    if runs:
        lines += ["", "Run: " + "; ".join(dict.fromkeys(runs)) + "."]
    return lines


def _larger_section(rows) -> list[str]:
    lines = ["", LARGER_HEADING, "",
             f"{LARGER}: the example GPT-2 with vocab {MEDIUM.vocab}, sequence {MEDIUM.seq_len}, "
             f"hidden {MEDIUM.hidden}, "
             f"{MEDIUM.heads} heads, {MEDIUM.layers} layers, FFN {MEDIUM.ffn}, batch {MEDIUM.micro_batch} (dropout "
             f"{MEDIUM.dropout}), large enough that a copy out can end before the forward pass does; run alone "
             "(`--models example-gpt2-medium --paths compiled`), its rows added here without re-running the models "
             "above. Columns and counts as above, over its rows alone.", ""]
    return lines + _compiled_rows(rows)


def _splice_compiled(old_text: str, rows) -> str:
    """``old_text`` (a committed table) with its compiled section replaced by ``rows``' (a run of
    --paths compiled alone, which leaves the eager section and the summary from their own run). LARGER's
    rows have their own section: a run with no row of it keeps its section, a run of it alone keeps the rest."""
    end = old_text.index(SUMMARY_HEADING)
    larger_at = old_text.find(LARGER_HEADING)
    main_end = larger_at if larger_at >= 0 else end
    others = [row for row in rows if row["model"] != LARGER]
    larger = [row for row in rows if row["model"] == LARGER]
    head = old_text[:old_text.index(COMPILED_HEADING)].rstrip("\n").split("\n")
    main = (_compiled_section(others) if others
            else ["", *old_text[old_text.index(COMPILED_HEADING):main_end].rstrip("\n").split("\n")])
    extra = (_larger_section(larger) if larger
             else ["", *old_text[larger_at:end].rstrip("\n").split("\n")] if larger_at >= 0 else [])
    return "\n".join(head + main + extra + ["", ""]) + old_text[end:]


if __name__ == "__main__":
    sys.exit(main())
