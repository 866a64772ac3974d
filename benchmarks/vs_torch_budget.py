"""slackswap's recompute-only and mixed plans beside PyTorch's activation memory budget, in one run.

For each model (the three example models and Hugging Face GPT-2, Llama, BERT and ViT built from
the small configs of tests/profiled/make_fixtures.py, train mode, CPU) and each budget
0.2-0.8 of ``torch._functorch.config.activation_memory_budget``:

- torch: the model compiled with ``torch.compile(backend="aot_eager_decomp_partition")`` under
  that budget (its min-cut partitioner with the knapsack over what to recompute);
- slackswap's recompute-only plan (`recompute-optimal`) and mixed plan (`slackswap`), planned
  for a budget in bytes equal to what torch's plan holds for backward (so both sides are compared
  at equal bytes held; slackswap's budget bounds its peak of saved bytes, which is at least what
  it holds at the boundary), run by slackswap's eager runtime (``slackswap.apply``).

Measured in the same process, one step each: the bytes held for backward when the forward pass
ends (torch: the distinct storages its compiled function saves, by saved-tensor hooks, less the
parameters and the batch; slackswap: ``runtime.stats.device_saved_bytes``, what its manager
holds on the device) and the backward FLOPs (``torch.utils.flop_counter.FlopCounterMode`` around
``loss.backward()``, so recompute counts; as a change from the same execution with nothing
recomputed: torch's plan at budget 1.0, the plain eager step for slackswap's); and for slackswap's plans the simulated throughput on
a100-80gb-pcie4 (the workload profiled with that preset's roofline). Writes a markdown table to
benchmarks/results/vs-torch-budget.md (or ``--out``). The default (every model, seven budgets) runs longer than the table committed; that
table is ``--models example-gpt2,hf-gpt2,hf-llama --budgets 0.2,0.4,0.6,0.8`` (11 minutes on 2
heavily shared CPU cores).

    PYTHONPATH=src python benchmarks/vs_torch_budget.py [--models gpt2,hf-gpt2] [--budgets 0.3,0.5]
"""

from __future__ import annotations

import argparse
import importlib.util
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
from slackswap.sim import simulate

ROOT = Path(__file__).resolve().parent.parent
HW = PRESETS["a100-80gb-pcie4"]
BUDGETS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)


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


def slackswap_step(maker, workload, budget_bytes: int, policy: str) -> tuple[int, int, float] | None:
    """(bytes held for backward, backward FLOPs, simulated throughput %) of one step under the
    policy's plan for ``budget_bytes``; None when the policy refuses the budget."""
    try:
        plan = slackswap.plan(workload, budget=budget_bytes, policy=policy, hardware=HW)
    except BudgetError:
        return None
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
    args = parser.parse_args(argv)
    budgets = [float(b) for b in args.budgets.split(",")]
    started = time.perf_counter()
    rows = []
    for name in args.models.split(","):
        maker = makers[name]
        model, batch, loss_fn = _fresh(maker)
        workload = slackswap.profile(model, batch, loss_fn, hardware=HW, repeats=1)
        full_held, full_flops = torch_step(maker, 1.0)
        eager_flops = eager_backward_flops(maker)
        for budget in budgets:
            held, flops = torch_step(maker, budget)
            row = {"model": name, "budget": budget, "torch_held": held, "torch_flops": flops,
                   "full_held": full_held, "full_flops": full_flops, "eager_flops": eager_flops}
            for policy in ("recompute-optimal", "slackswap"):
                row[policy] = slackswap_step(maker, workload, max(1, held), policy)
            rows.append(row)
            print(_line(row), flush=True)
    elapsed = time.perf_counter() - started
    Path(args.out).write_text(_table(rows, elapsed))
    print(f"wrote {args.out} ({elapsed:.0f} s)")
    return 0


def _cell(result, row) -> str:
    if result is None:
        return "refuses | - | -"
    held, flops, throughput = result
    extra = 100.0 * (flops - row["eager_flops"]) / row["eager_flops"] if row["eager_flops"] else math.nan
    return f"{held / 1024:.1f} KiB | {extra:+.1f} % | {throughput:.2f} %"


def _line(row) -> str:
    return (f"{row['model']} {row['budget']}: torch {row['torch_held']} B, {row['torch_flops']} FLOPs; "
            f"recompute-optimal {row['recompute-optimal']}; slackswap {row['slackswap']}")


def _table(rows, elapsed_s: float) -> str:
    lines = [
        "# slackswap beside PyTorch's activation memory budget",
        "",
        "Produced by `benchmarks/vs_torch_budget.py` (one step per cell, CPU, float32, "
        f"{elapsed_s:.0f} s for the whole table on a shared 2-core machine). Bytes held: what is saved for "
        "backward when the forward pass ends (torch: distinct storages its compiled function saves, "
        "parameters and batch excluded; slackswap: the runtime's device_saved_bytes). Backward FLOPs: "
        "FlopCounterMode around loss.backward(), as a change from the same mode with nothing recomputed: "
        "torch's plan at budget 1.0 for torch's column, the plain eager step for slackswap's (the eager "
        "and the decomposed compiled backward count differently). Slackswap plans for a budget equal to torch's bytes held at "
        "that row; throughput: simulated on a100-80gb-pcie4.",
        "",
        "| model | torch budget | torch held | torch bwd FLOPs | recompute-optimal held | its bwd FLOPs | its "
        "throughput | slackswap held | its bwd FLOPs | its throughput |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        extra = 100.0 * (row["torch_flops"] - row["full_flops"]) / row["full_flops"] if row["full_flops"] else math.nan
        lines.append(f"| {row['model']} | {row['budget']:.1f} | {row['torch_held'] / 1024:.1f} KiB | {extra:+.1f} % | "
                     f"{_cell(row['recompute-optimal'], row)} | {_cell(row['slackswap'], row)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
