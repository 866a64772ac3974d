"""What running under a plan costs per training step, side by side with PyTorch's own tools,
on the CPU example models.

The eager runtime's forward recorder is a Python TorchDispatchMode (one Python call per
aten op in forward) plus saved-tensor hooks, so a planned step pays Python bookkeeping
that an unplanned one does not; the compiled path (``slackswap.compile``) pays none at run
time. For each example model (gpt2, bert, llama) this times one training step (zero_grad,
loss_fn forward, backward), in one process: plain torch; torch.utils.checkpoint around
every block (non-reentrant); ``torch.autograd.graph.save_on_cpu``; ``slackswap.apply`` under
four plans (every movable saved tensor kept, swapped or recomputed, and the ``slackswap``
policy's mixed plan at 50 % of the activation peak); and, with ``--compiled``, torch.compile
(inductor) without a plan, with ``activation_memory_budget=0.5``, and ``slackswap.compile``
(inductor, ``slackswap`` policy at 0.5). It reports the median and best wall time, the forward
aten ops per step and the all-keep overhead per op, and checks once per model and eager row
that the loss and every gradient equal the plain step's bit for bit (compiled rows: within
float tolerance, as inductor reorders float sums).

On CPU a swap copies to CPU memory (no PCIe, no pinned pool), so the swap and recompute
rows measure bookkeeping plus recompute compute, not GPU behaviour.

    .venv/bin/python benchmarks/runtime_overhead.py [--steps 15] [--warmup 3] [--compiled] [--results FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import time

import torch

import slackswap
from slackswap import Action, make_plan
from slackswap.examples import ExampleConfig, loss_fn, make_batch, make_example
from slackswap.hardware import DEFAULT_HARDWARE
from slackswap.profiler import profile_model
from slackswap.runtime import runtime_prefetch_steps

KINDS = ("gpt2", "bert", "llama")
PLANS = ("keep", "swap", "recompute")
PLAIN = "none (plain torch)"
MIXED = "slackswap.apply mixed (slackswap, 0.5)"


def plan_for(workload, action: Action):
    """Every saved tensor that has a producer gets ``action`` (as tests/test_runtime_safety.py)."""
    actions = {t.name: action for t in workload.saved_tensors if t.producer is not None}
    return make_plan(workload, actions, policy=f"all-{action.value}", budget_bytes=None,
                     prefetch_step=runtime_prefetch_steps(workload, actions))


def step(model, batch, runtime=None, runner=None):
    """One training step of ``model`` (its parameters get the gradients); ``runner`` is what is
    called (the model itself, or its compiled or block-checkpointed form)."""
    torch.manual_seed(7)  # the examples' dropout draws from the global generator
    model.zero_grad(set_to_none=True)
    with runtime if runtime is not None else contextlib.nullcontext():
        loss = loss_fn(runner if runner is not None else model, batch)
        loss.backward()
    return loss


def same_as_plain(model, batch, runtime, runner=None, *, exact: bool = True) -> bool:
    def loss_and_grads(rt, run):
        loss = step(model, batch, rt, run).detach()
        return loss, {n: p.grad.clone() for n, p in model.named_parameters()}

    (loss_a, grads_a), (loss_b, grads_b) = loss_and_grads(None, None), loss_and_grads(runtime, runner)
    if grads_a.keys() != grads_b.keys():
        return False
    pairs = [(loss_a, loss_b)] + [(grads_a[n], grads_b[n]) for n in grads_a]
    if exact:
        return all(torch.equal(a, b) for a, b in pairs)
    return all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in pairs)


def time_steps(model, batch, runtime, warmup: int, steps: int, runner=None) -> list[float]:
    for _ in range(warmup):
        step(model, batch, runtime, runner)
    samples = []
    for _ in range(steps):
        start = time.perf_counter()
        step(model, batch, runtime, runner)
        samples.append(time.perf_counter() - start)
    return samples


BLOCK_LISTS = ("h", "layers")  # the examples' nn.ModuleList of transformer blocks


@contextlib.contextmanager
def checkpoint_blocks(model):
    """torch.utils.checkpoint (non-reentrant) around every transformer block, as Hugging Face's
    gradient_checkpointing_enable does."""
    from torch.utils.checkpoint import checkpoint

    blocks = next(getattr(model, name) for name in BLOCK_LISTS if hasattr(model, name))
    originals = [block.forward for block in blocks]
    for block, forward in zip(blocks, originals):
        block.forward = (lambda f: lambda *a, **k: checkpoint(f, *a, use_reentrant=False, **k))(forward)
    try:
        yield
    finally:
        for block, forward in zip(blocks, originals):
            block.forward = forward


def compiled_rows(model, batch, args) -> list[tuple[str, object, bool]]:
    """(row name, runner, same as plain) of the torch.compile variants; each compiles once here."""
    import torch._functorch.config as functorch_config

    rows = []
    torch._dynamo.reset()
    plain = torch.compile(model, dynamic=False)
    rows.append(("torch.compile, no plan", plain, same_as_plain(model, batch, None, plain, exact=False)))
    torch._dynamo.reset()
    with functorch_config.patch(activation_memory_budget=0.5):
        budgeted = torch.compile(model, dynamic=False)
        same = same_as_plain(model, batch, None, budgeted, exact=False)  # compiles under the patch
    rows.append(("torch.compile, activation_memory_budget=0.5", budgeted, same))
    torch._dynamo.reset()
    planned = slackswap.compile(model, batch, loss_fn, hardware=args.hardware, budget=0.5, policy="slackswap")
    rows.append(("slackswap.compile (slackswap, 0.5)", planned, same_as_plain(model, batch, None, planned,
                                                                              exact=False)))
    return rows


def usable_cpus() -> int:
    """What `nproc` prints: the CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=15, help="timed steps per row")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps before them")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--ffn", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--hardware", default=DEFAULT_HARDWARE,
                        help="hardware the mixed plans are made for (roofline op times)")
    parser.add_argument("--compiled", action="store_true", help="also time the torch.compile rows (inductor)")
    parser.add_argument("--kinds", default=",".join(KINDS), help="example models, comma-separated")
    parser.add_argument("--compiled-kinds", default="gpt2",
                        help="models that get the --compiled rows (inductor compiles take minutes on 2 cores)")
    parser.add_argument("--results", help="also write the markdown table to this file")
    args = parser.parse_args(argv)
    config = ExampleConfig(vocab=512, seq_len=args.seq_len, hidden=args.hidden, heads=4, layers=args.layers,
                           ffn=args.ffn, micro_batch=args.micro_batch)
    torch._inductor.config.fallback_random = True  # compiled dropout draws the eager masks: comparable
    load_before = os.getloadavg()
    rows = []
    for kind in args.kinds.split(","):
        model = make_example(kind, config)
        batch = make_batch(config, seed=1)
        workload = profile_model(model, batch, loss_fn, repeats=1, hardware=args.hardware)
        ops = len(workload.ops)
        first = len(rows)

        def add(name, samples, same):
            rows.append((kind, ops, name, statistics.median(samples), min(samples), same))

        add(PLAIN, time_steps(model, batch, None, args.warmup, args.steps), None)
        with checkpoint_blocks(model):
            same = same_as_plain(model, batch, None)
            add("torch.utils.checkpoint per block", time_steps(model, batch, None, args.warmup, args.steps), same)
        offload = torch.autograd.graph.save_on_cpu(pin_memory=False)
        add("save_on_cpu", time_steps(model, batch, offload, args.warmup, args.steps),
            same_as_plain(model, batch, torch.autograd.graph.save_on_cpu(pin_memory=False)))
        plans = {f"slackswap.apply all-{name}": plan_for(workload, Action(name)) for name in PLANS}
        plans[MIXED] = slackswap.plan(workload, args.hardware, 0.5, "slackswap")
        full = slackswap.plan(workload, args.hardware, 1.0, "full-recompute")
        runs = [(name, plan, "replay") for name, plan in plans.items()]
        runs += [(f"slackswap.apply full-recompute policy ({backend})", full, backend)
                 for backend in ("replay", "checkpoint")]
        for name, plan, backend in runs:
            # One runtime object per plan, entered once per step, as a training loop would.
            runtime = slackswap.apply(model, plan, workload=workload, backend=backend)
            same = same_as_plain(model, batch, runtime)
            add(name, time_steps(model, batch, runtime, args.warmup, args.steps), same)
        if args.compiled and kind in args.compiled_kinds.split(","):
            for name, runner, same in compiled_rows(model, batch, args):
                add(name, time_steps(model, batch, None, args.warmup, args.steps, runner), same)
        for row in rows[first:]:
            print(f"{row[0]:6s} {row[2]:45s} median {row[3] * 1e3:8.2f} ms  best {row[4] * 1e3:8.2f} ms  "
                  f"same as plain: {'-' if row[5] is None else row[5]}", flush=True)

    command = "`.venv/bin/python benchmarks/runtime_overhead.py " + " ".join(argv if argv is not None else sys.argv[1:]) + "`"
    lines = [
        f"Wall time of one training step (zero_grad, loss_fn forward, backward): median and best of "
        f"{args.steps} timed steps after {args.warmup} warm-up steps, `time.perf_counter`.",
        f"Machine: {os.cpu_count()}-core CPU (`nproc` = {usable_cpus()}), "
        f"{platform.machine()}, torch {torch.__version__} ({torch.get_num_threads()} intra-op threads, the default), "
        f"Python {platform.python_version()}.",
        f"Load average (1 min) {load_before[0]:.1f} before the run and {os.getloadavg()[0]:.1f} after it, on "
        f"{usable_cpus()} usable CPUs: above that count other processes shared the cores and the times spread.",
        f"Models: `ExampleConfig(vocab={config.vocab}, seq_len={config.seq_len}, hidden={config.hidden}, "
        f"heads={config.heads}, layers={config.layers}, ffn={config.ffn}, micro_batch={config.micro_batch})`, "
        "float32, dropout 0.1.",
        f"Command: {command}.",
        "",
        "Rows: plain torch; `torch.utils.checkpoint(block, use_reentrant=False)` around every block;",
        "`torch.autograd.graph.save_on_cpu(pin_memory=False)`; `slackswap.apply` (eager runtime) with every saved",
        "tensor with a producer kept / swapped / recomputed (prefetch steps from `runtime_prefetch_steps`, no",
        f"budget), the `slackswap` policy's plan at 0.5 of the activation peak on `{args.hardware}` (mixed),",
        "and the `full-recompute` policy's plan (every block's saved tensors recomputed from its input, as",
        "checkpointing every block does) under the replay and the checkpoint backend (`backend=\"checkpoint\"`);",
        "one runtime per plan, entered once per step. With `--compiled`: `torch.compile` (inductor) without a",
        "plan, with `torch._functorch.config.activation_memory_budget=0.5`, and `slackswap.compile` (inductor,",
        "`slackswap` policy, 0.5); `torch._inductor.config.fallback_random=True` in all three so dropout draws",
        "the eager masks. Compile time is not in the step times (each compiles before its warm-up).",
        "On CPU a \"swap\" copies to CPU memory (no PCIe, no pinned pool effect): swap rows measure bookkeeping",
        "and copies in host memory, not GPU behaviour; the compiled path's offload is a no-op on a CPU-only build.",
        "Overhead per op = (median all-keep - median plain) / forward aten ops. Same as plain: loss and every",
        "gradient `torch.equal` to the plain step's (compiled rows: `torch.allclose`, rtol 1e-4, atol 1e-6),",
        "`torch.manual_seed(7)` before each.",
        "",
        "| model | forward aten ops | row | median | best | median vs plain | all-keep overhead per op "
        "| same as plain |",
        "|---|---:|---|---:|---:|---:|---:|---|",
    ]
    plain_median = {kind: med for kind, _, row, med, _, same in rows if row == PLAIN}
    for kind, ops, row, med, best, same in rows:
        per_op = f"{(med - plain_median[kind]) / ops * 1e6:.1f}" if row.endswith("all-keep") else ""
        ratio = f"{med / plain_median[kind]:.2f}x"
        lines.append(f"| {kind} | {ops} ops | {row} | {med * 1e3:.2f} ms | {best * 1e3:.2f} ms | {ratio} "
                     f"| {per_op + ' us' if per_op else ''} | {'-' if same is None else 'yes' if same else 'NO'} |")
    table = "\n".join(lines)
    print()
    print(table)
    if args.results:
        with open(args.results, "w", encoding="utf-8") as handle:
            handle.write("# Runtime overhead benchmark\n\n" + table + "\n")
    return 0 if all(same is not False for *_, same in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
