"""slackswap's recompute-only and mixed plans beside PyTorch's activation memory budget, in one run.

For each model (the three example models and Hugging Face GPT-2, Llama, BERT and ViT built from
the small configs of tests/profiled/make_fixtures.py, train mode, CPU) and each budget
0.2-0.8 of ``torch._functorch.config.activation_memory_budget``:

- torch: the model compiled with ``torch.compile(backend="aot_eager_decomp_partition")`` under
  that budget (its min-cut partitioner with the knapsack over what to recompute);
- slackswap's recompute-only plan (`recompute-optimal`) and mixed plan (`slackswap`), planned
  for a budget in bytes equal to what torch's plan holds for backward (so both sides are compared
  at equal bytes held; slackswap's budget bounds its peak of saved bytes, which is at least what
  it holds at the boundary), run by slackswap's eager runtime (``slackswap.apply``);
- the recompute-only plan of slackswap's recompute space that re-runs the fewest FLOPs it finds
  within the same budget (``recompute_space.frontier_descent(..., objective="flops")``, torch's
  knapsack objective), so that the table separates what slackswap's objective (simulated time)
  chooses from what its recompute space allows.

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
running anything. The committed table is every model at ``--budgets 0.2,0.4,0.6,0.8``.

    PYTHONPATH=src python benchmarks/vs_torch_budget.py [--models example-gpt2,hf-gpt2] [--budgets 0.3,0.5]
    PYTHONPATH=src python benchmarks/vs_torch_budget.py --models hf-bert --rows /tmp/hf-bert.json
    PYTHONPATH=src python benchmarks/vs_torch_budget.py --merge /tmp/hf-gpt2.json,/tmp/hf-bert.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch._dynamo
import torch._functorch.config as functorch_config
from torch.utils.flop_counter import FlopCounterMode

import slackswap
from slackswap.errors import BudgetError
from slackswap.hardware import PRESETS
from slackswap.planners import minimum_budget_bytes
from slackswap.planners.common import build, facts_for
from slackswap.planners.recompute_space import frontier_descent
from slackswap.planners.selection import actions_for
from slackswap.sim import simulate, simulate_ideal

ROOT = Path(__file__).resolve().parent.parent
HW = PRESETS["a100-80gb-pcie4"]
BUDGETS = (0.2, 0.4, 0.6, 0.8)
POLICIES = ("recompute-optimal", "slackswap", "least-flops")
"""slackswap's columns: its two policies, then the fewest-FLOPs recompute-only plan of its space."""


def _makers():
    spec = importlib.util.spec_from_file_location("make_fixtures", ROOT / "tests" / "profiled" / "make_fixtures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MAKERS


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


def torch_step(maker, budget: float) -> tuple[int, int]:
    """(bytes held for backward, backward FLOPs) of one step compiled under ``budget``."""
    model, batch, loss_fn = _fresh(maker)
    torch._dynamo.reset()
    with functorch_config.patch(activation_memory_budget=budget):
        compiled = torch.compile(model, backend="aot_eager_decomp_partition")
        torch.manual_seed(1)
        loss_fn(compiled, batch).backward()  # compiles forward and backward
        model.zero_grad(set_to_none=True)
        excluded = _excluded_storages(model, batch)
        held: dict[int, int] = {}

        def pack(t):
            ptr = t.untyped_storage().data_ptr()
            if ptr not in excluded:
                held[ptr] = t.untyped_storage().nbytes()
            return t

        torch.manual_seed(1)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = loss_fn(compiled, batch)
        with FlopCounterMode(display=False) as counter:
            loss.backward()
    torch._dynamo.reset()
    return sum(held.values()), counter.get_total_flops()


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
    parser.add_argument("--models", default=",".join(makers))
    parser.add_argument("--budgets", default=",".join(str(b) for b in BUDGETS))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "vs-torch-budget.md"))
    parser.add_argument("--rows", help="also save this run's rows (JSON) here, for --merge")
    parser.add_argument("--merge", help="comma-separated row files of earlier runs: write their table, run nothing")
    args = parser.parse_args(argv)
    if args.merge:
        pieces = [json.loads(Path(f).read_text()) for f in args.merge.split(",")]
        rows = [row for piece in pieces for row in piece["rows"]]
        Path(args.out).write_text(_table(rows, sum(piece["elapsed_s"] for piece in pieces)))
        print(f"wrote {args.out}")
        return 0
    budgets = [float(b) for b in args.budgets.split(",")]
    started = time.perf_counter()
    rows = []
    for name in args.models.split(","):
        maker = makers[name]
        model, batch, loss_fn = _fresh(maker)
        workload = slackswap.profile(model, batch, loss_fn, hardware=HW, repeats=1)
        full_held, full_flops = torch_step(maker, 1.0)
        eager_flops = eager_backward_flops(maker)
        keep_all = simulate_ideal(workload, HW).peak_memory_bytes
        for budget in budgets:
            held, flops = torch_step(maker, budget)
            row = {"model": name, "budget": budget, "torch_held": held, "torch_flops": flops,
                   "full_held": full_held, "full_flops": full_flops, "eager_flops": eager_flops,
                   "keep_all_bytes": keep_all, "minimum_bytes": minimum_budget_bytes(workload)}
            for policy in POLICIES:
                row[policy] = slackswap_step(maker, workload, max(1, held), policy)
            rows.append(row)
            print(_line(row), flush=True)
    elapsed = time.perf_counter() - started
    Path(args.out).write_text(_table(rows, elapsed))
    if args.rows:
        Path(args.rows).write_text(json.dumps({"elapsed_s": elapsed, "rows": rows}))
    print(f"wrote {args.out} ({elapsed:.0f} s)")
    return 0


def _cell(result, row) -> str:
    if isinstance(result, str):
        return f"{result} | - | -"
    held, flops, throughput = result
    extra = 100.0 * (flops - row["eager_flops"]) / row["eager_flops"] if row["eager_flops"] else math.nan
    return f"{held / 1024:.1f} KiB | {extra:+.1f} % | {throughput:.2f} %"


def _line(row) -> str:
    return (f"{row['model']} {row['budget']}: torch {row['torch_held']} B, {row['torch_flops']} FLOPs; "
            + "; ".join(f"{policy} {row[policy]}" for policy in POLICIES))


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
        extra = 100.0 * (row["torch_flops"] - row["full_flops"]) / row["full_flops"] if row["full_flops"] else math.nan
        cells = " | ".join(_cell(row[policy], row) for policy in POLICIES)
        lines.append(f"| {row['model']} | {row['budget']:.1f} | {row['torch_held'] / 1024:.1f} KiB | {extra:+.1f} % | "
                     f"{cells} |")
    lines += [
        "",
        "What each side holds with nothing recomputed, and the least slackswap can hold:",
        "",
        "| model | torch held at budget 1.0 | slackswap keep-all peak | slackswap minimum budget |",
        "|---|---|---|---|",
    ]
    seen = set()
    for row in rows:
        if row["model"] not in seen:
            seen.add(row["model"])
            lines.append(f"| {row['model']} | {row['full_held'] / 1024:.1f} KiB | {row['keep_all_bytes'] / 1024:.1f} KiB "
                         f"| {row['minimum_bytes'] / 1024:.1f} KiB |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
