"""What running under a plan costs per training step, side by side with PyTorch's own tools,
on the CPU example models.

For each example model (gpt2, bert, llama) this times one training step (zero_grad, loss_fn
forward, backward), all rows in one process and interleaved (each round runs one step of every
row, so a change in machine load hits every row alike): plain torch; torch.utils.checkpoint
around every block (non-reentrant); ``torch.autograd.graph.save_on_cpu``; ``slackswap.apply``
(default ``backend="auto"``: the ``path`` column says which path ran) under an all-keep plan
(the keep fast path), the ``full-recompute`` policy's plan (the checkpoint fast path; also forced
onto the replay path), an all-swap and an all-recompute plan and the ``slackswap`` policy's
mixed plan at 50 % of the activation peak (replay path); and, with ``--compiled``, torch.compile
(inductor) without a plan, with ``activation_memory_budget=0.5``, and ``slackswap.compile``
(inductor, ``slackswap`` policy at 0.5). It reports medians and best times, each row against
plain and against checkpoint per block, the overhead per forward aten op of each slackswap eager
row against plain, and checks once per row that the loss and every gradient equal the plain
step's bit for bit (compiled rows: within float tolerance, as inductor reorders float sums).

On CPU a swap copies to CPU memory (no PCIe, no pinned pool), so the swap and recompute
rows measure bookkeeping plus recompute compute, not GPU behaviour.

    .venv/bin/python benchmarks/runtime_overhead.py [--steps 20] [--warmup 3] [--layers 2] [--compiled] [--results FILE]
    .venv/bin/python benchmarks/runtime_overhead.py --quick      # a few seconds, for the test suite
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

import slackswap
from slackswap import Action, make_plan
from slackswap.examples import ExampleConfig, loss_fn, make_batch, make_example
from slackswap.hardware import DEFAULT_HARDWARE
from slackswap.profiler import profile_model
from slackswap.runtime import runtime_prefetch_steps

KINDS = ("gpt2", "bert", "llama")
PLAIN = "none (plain torch)"
CHECKPOINT_BLOCKS = "torch.utils.checkpoint per block"
BLOCK_LISTS = ("h", "layers")  # the examples' nn.ModuleList of transformer blocks
BUDGET_DROPOUT = (
    "below a budget of 1.0 PyTorch's partitioner may recompute dropout's random op in backward without "
    "replaying its RNG state, so the backward draws another mask (docs/runtime.md, The compiled path)"
)


@dataclass
class Row:
    name: str
    context: Callable[[], Any] | None = None
    """Makes the context manager entered around each step (a runtime is reused, as a loop would)."""
    runner: Any = None
    """What loss_fn calls: the model itself, or its compiled form."""
    path: str = ""
    eager_plan: bool = False
    exact: bool = True
    same: bool | None = None
    known_difference: str = ""
    """Why this row may differ from plain without it being a failure of the run (a PyTorch behaviour)."""
    samples: list = field(default_factory=list)


def plan_for(workload, action: Action):
    """Every saved tensor that has a producer gets ``action`` (as tests/test_runtime_safety.py)."""
    actions = {t.name: action for t in workload.saved_tensors if t.producer is not None}
    return make_plan(workload, actions, policy=f"all-{action.value}", budget_bytes=None,
                     prefetch_step=runtime_prefetch_steps(workload, actions))


def step(model, batch, row: Row | None):
    """One training step of ``model`` (its parameters get the gradients)."""
    torch.manual_seed(7)  # the examples' dropout draws from the global generator
    model.zero_grad(set_to_none=True)
    context = row.context() if row is not None and row.context is not None else contextlib.nullcontext()
    with context:
        loss = loss_fn(row.runner if row is not None and row.runner is not None else model, batch)
        loss.backward()
    return loss


def same_as_plain(model, batch, row: Row) -> bool:
    def loss_and_grads(r):
        loss = step(model, batch, r).detach()
        return loss, {n: p.grad.clone() for n, p in model.named_parameters()}

    (loss_a, grads_a), (loss_b, grads_b) = loss_and_grads(None), loss_and_grads(row)
    if grads_a.keys() != grads_b.keys():
        return False
    pairs = [(loss_a, loss_b)] + [(grads_a[n], grads_b[n]) for n in grads_a]
    if row.exact:
        return all(torch.equal(a, b) for a, b in pairs)
    return all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in pairs)


@contextlib.contextmanager
def checkpoint_blocks(model):
    """torch.utils.checkpoint (non-reentrant) around every transformer block, as Hugging Face's
    gradient_checkpointing_enable does."""
    from torch.utils.checkpoint import checkpoint

    blocks = next(getattr(model, name) for name in BLOCK_LISTS if hasattr(model, name))
    for block in blocks:
        block.forward = (lambda f: lambda *a, **k: checkpoint(f, *a, use_reentrant=False, **k))(block.forward)
    try:
        yield
    finally:
        for block in blocks:
            del block.forward


def eager_rows(model, workload, hardware: str) -> list[Row]:
    plans = [("all-keep", plan_for(workload, Action.KEEP), "auto")]
    full = slackswap.plan(workload, hardware, 1.0, "full-recompute")
    plans += [("full-recompute policy", full, "auto"), ("full-recompute policy", full, "replay")]
    plans += [(f"all-{a.value}", plan_for(workload, a), "auto") for a in (Action.SWAP, Action.RECOMPUTE)]
    plans.append(("mixed (slackswap, 0.5)", slackswap.plan(workload, hardware, 0.5, "slackswap"), "auto"))
    rows = []
    for label, plan, backend in plans:
        # One runtime per plan, entered once per step, as a training loop would.
        runtime = slackswap.apply(model, plan, workload=workload, backend=backend)
        name = f"slackswap.apply {label}" + (f' (backend="{backend}")' if backend != "auto" else "")
        rows.append(Row(name, context=lambda r=runtime: r, path=runtime.path, eager_plan=True))
    return rows


def compiled_rows(model, batch, hardware: str) -> list[Row]:
    """The torch.compile variants; each compiles here (in its correctness check), not while timed."""
    import torch._functorch.config as functorch_config

    torch._dynamo.reset()
    plain = Row("torch.compile, no plan", runner=torch.compile(model, dynamic=False), exact=False)
    plain.same = same_as_plain(model, batch, plain)
    torch._dynamo.reset()
    with functorch_config.patch(activation_memory_budget=0.5):
        budgeted = Row("torch.compile, activation_memory_budget=0.5", runner=torch.compile(model, dynamic=False),
                       exact=False, known_difference=BUDGET_DROPOUT)
        budgeted.same = same_as_plain(model, batch, budgeted)  # compiles under the patch
    torch._dynamo.reset()
    planned = Row("slackswap.compile (slackswap, 0.5)", exact=False,
                  runner=slackswap.compile(model, batch, loss_fn, hardware=hardware, budget=0.5, policy="slackswap"))
    planned.same = same_as_plain(model, batch, planned)
    return [plain, budgeted, planned]


def usable_cpus() -> int:
    """What `nproc` prints: the CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def time_rows(model, batch, rows: list[Row], warmup: int, steps: int) -> None:
    """Interleaved rounds: each round times one step of every row."""
    for round_ in range(warmup + steps):
        for row in rows:
            start = time.perf_counter()
            step(model, batch, row)
            elapsed = time.perf_counter() - start
            if round_ >= warmup:
                row.samples.append(elapsed)


def measure(kind: str, config: ExampleConfig, args) -> tuple[int, list[Row]]:
    model = make_example(kind, config)
    batch = make_batch(config, seed=1)
    workload = profile_model(model, batch, loss_fn, repeats=1, hardware=args.hardware)
    rows = [Row(PLAIN), Row(CHECKPOINT_BLOCKS, context=lambda: checkpoint_blocks(model)),
            Row("save_on_cpu", context=lambda: torch.autograd.graph.save_on_cpu(pin_memory=False))]
    rows += eager_rows(model, workload, args.hardware)
    for row in rows[1:]:
        row.same = same_as_plain(model, batch, row)
    if args.compiled and kind in args.compiled_kinds.split(","):
        rows += compiled_rows(model, batch, args.hardware)
    print(f"{kind}: {len(rows)} rows checked, timing ({time.strftime('%H:%M:%S')})", flush=True)
    time_rows(model, batch, rows, args.warmup, args.steps)
    return len(workload.ops), rows


def table(results: dict[str, tuple[int, list[Row]]], args, config: ExampleConfig, loads: tuple, seconds: float,
          command: str) -> str:
    lines = [
        f"Wall time of one training step (zero_grad, loss_fn forward, backward): median and best of "
        f"{args.steps} timed steps per row after {args.warmup} warm-up steps, `time.perf_counter`; the rows of",
        "one model run interleaved (one step of each row per round), in one process.",
        f"Machine: {os.cpu_count()}-core CPU (`nproc` = {usable_cpus()}), "
        f"{platform.machine()}, torch {torch.__version__} ({torch.get_num_threads()} intra-op threads"
        f"{', the default' if args.threads is None else ', --threads'}), "
        f"Python {platform.python_version()}.",
        f"Load average (1 min, `os.getloadavg`): {loads[0]:.1f} at the start, {loads[1]:.1f} at the end, on "
        f"{usable_cpus()} usable CPUs (above that count other processes shared the cores and the times spread).",
        f"Models: `ExampleConfig(vocab={config.vocab}, seq_len={config.seq_len}, hidden={config.hidden}, "
        f"heads={config.heads}, layers={config.layers}, ffn={config.ffn}, micro_batch={config.micro_batch})`, "
        f"float32, dropout 0.1. The run took {seconds:.0f} s.",
        f"Command: `{command}`.",
        "",
        "Rows: plain torch; `torch.utils.checkpoint(block, use_reentrant=False)` around every block;",
        "`torch.autograd.graph.save_on_cpu(pin_memory=False)`; `slackswap.apply` (eager runtime, default",
        "`backend=\"auto\"`; *path* is the runtime's `path`: `keep` and `checkpoint` are the fast paths, `replay`",
        "the recorder and swap manager) under: every saved tensor with a producer kept (all-keep); the",
        "`full-recompute` policy's plan (every block's saved tensors recomputed from its input, the memory of",
        "checkpointing every block), also forced onto the replay path; every saved tensor swapped (all-swap) or",
        "recomputed (all-recompute), prefetch steps from `runtime_prefetch_steps`, no budget; the `slackswap`",
        f"policy's plan at 0.5 of the activation peak on `{args.hardware}` (mixed). One runtime per plan, entered",
        "once per step. With `--compiled`: `torch.compile` (inductor) without a plan, with",
        "`torch._functorch.config.activation_memory_budget=0.5`, and `slackswap.compile` (inductor, `slackswap`",
        "policy, 0.5); `torch._inductor.config.fallback_random=True` in all three so dropout draws the eager masks;",
        "compile time is not in the step times.",
        "On CPU a \"swap\" copies to CPU memory (no PCIe, no pinned pool effect): swap rows measure bookkeeping",
        "and copies in host memory, not GPU behaviour; the compiled path's offload is a no-op on a CPU-only build.",
        "Per forward op = (median - plain median) / forward aten ops, for the slackswap eager rows: the runtime's",
        "host overhead for all-keep; for the other rows it also holds the recompute and copy work the plan asks.",
        "Same as plain: loss and every gradient `torch.equal` to the plain step's (compiled rows: `torch.allclose`,",
        "rtol 1e-4, atol 1e-6), `torch.manual_seed(7)` before each.",
        "",
        "| model | forward aten ops | row | path | median | best | vs plain | vs checkpoint per block "
        "| per forward op | same as plain |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for kind, (ops, rows) in results.items():
        med = {row.name: statistics.median(row.samples) for row in rows}
        plain, blocks = med[PLAIN], med[CHECKPOINT_BLOCKS]
        for row in rows:
            m = med[row.name]
            per_op = f"{(m - plain) / ops * 1e6:.1f} us" if row.eager_plan else ""
            same = "-" if row.same is None else "yes" if row.same else "NO" + ("*" if row.known_difference else "")
            lines.append(f"| {kind} | {ops} ops | {row.name} | {row.path} | {m * 1e3:.2f} ms "
                         f"| {min(row.samples) * 1e3:.2f} ms | {m / plain:.2f}x | {m / blocks:.2f}x | {per_op} "
                         f"| {same} |")
    notes = sorted({row.known_difference for _, rows in results.values() for row in rows
                    if row.same is False and row.known_difference})
    if notes:
        lines += ["", *[f"\\* NO: {note}." for note in notes]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per row")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps before them")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--ffn", type=int, default=512)
    parser.add_argument("--layers", type=int, default=2, help="transformer blocks (2: the compiles fit in minutes)")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--hardware", default=DEFAULT_HARDWARE,
                        help="hardware the mixed plans are made for (roofline op times)")
    parser.add_argument("--compiled", action="store_true", help="also time the torch.compile rows (inductor)")
    parser.add_argument("--kinds", default=",".join(KINDS), help="example models, comma-separated")
    parser.add_argument("--compiled-kinds", default="gpt2",
                        help="models that get the --compiled rows (inductor compiles take minutes on 2 cores)")
    parser.add_argument("--quick", action="store_true",
                        help="tiny models, 2 timed steps: checks the benchmark runs (numbers mean nothing)")
    parser.add_argument("--threads", type=int, default=None,
                        help="intra-op threads (default: torch's); 1 keeps a loaded machine's spread down")
    parser.add_argument("--results", help="also write the markdown table to this file")
    raw = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(raw)
    if args.quick:
        args.steps, args.warmup = 2, 1
        config = ExampleConfig(vocab=64, seq_len=16, hidden=32, heads=4, layers=2, ffn=64, micro_batch=2)
    else:
        config = ExampleConfig(vocab=512, seq_len=args.seq_len, hidden=args.hidden, heads=4, layers=args.layers,
                               ffn=args.ffn, micro_batch=args.micro_batch)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch._inductor.config.fallback_random = True  # compiled dropout draws the eager masks: comparable
    start, load_start = time.perf_counter(), os.getloadavg()[0]
    results = {}
    for kind in args.kinds.split(","):
        results[kind] = measure(kind, config, args)
        for row in results[kind][1]:
            print(f"{kind:6s} {row.name:58s} {row.path:10s} median {statistics.median(row.samples) * 1e3:8.2f} ms  "
                  f"same as plain: {'-' if row.same is None else row.same}", flush=True)
    command = ".venv/bin/python benchmarks/runtime_overhead.py " + " ".join(raw)
    text = table(results, args, config, (load_start, os.getloadavg()[0]), time.perf_counter() - start,
                 command.strip())
    print()
    print(text)
    if args.results:
        with open(args.results, "w", encoding="utf-8") as handle:
            handle.write("# Runtime overhead benchmark, side by side with PyTorch's tools and the compiled path\n\n"
                         + text + "\n")
    return 0 if all(row.same is not False or row.known_difference for _, rows in results.values() for row in rows) \
        else 1


if __name__ == "__main__":
    sys.exit(main())
