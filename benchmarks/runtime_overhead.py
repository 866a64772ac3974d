"""What running under slackswap.apply costs per training step, on the CPU example models.

The replay runtime's forward recorder is a Python TorchDispatchMode (one Python call per
aten op in forward) plus saved-tensor hooks, so a planned step pays Python bookkeeping
that an unplanned one does not. For each example model (gpt2, bert, llama) this times one
training step (zero_grad, loss_fn forward, backward) without slackswap and inside
``slackswap.apply`` for three hand-made plans: every movable saved tensor kept, swapped,
or recomputed. It reports the median and best wall time, the forward aten ops per step and
the all-keep overhead per op, and checks once per model and plan that the loss and every
gradient equal the unplanned step's bit for bit.

On CPU a swap copies to CPU memory (no PCIe, no pinned pool), so the swap and recompute
rows measure bookkeeping plus recompute compute, not GPU behaviour.

    .venv/bin/python benchmarks/runtime_overhead.py [--steps 15] [--warmup 3] [--results FILE]
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
from slackswap.profiler import profile_model
from slackswap.runtime import runtime_prefetch_steps

KINDS = ("gpt2", "bert", "llama")
PLANS = ("keep", "swap", "recompute")


def plan_for(workload, action: Action):
    """Every saved tensor that has a producer gets ``action`` (as tests/test_runtime_safety.py)."""
    actions = {t.name: action for t in workload.saved_tensors if t.producer is not None}
    return make_plan(workload, actions, policy=f"all-{action.value}", budget_bytes=None,
                     prefetch_step=runtime_prefetch_steps(workload, actions))


def step(model, batch, runtime=None):
    torch.manual_seed(7)  # the examples' dropout draws from the global generator
    model.zero_grad(set_to_none=True)
    with runtime if runtime is not None else contextlib.nullcontext():
        loss = loss_fn(model, batch)
        loss.backward()
    return loss


def bit_identical(model, batch, runtime) -> bool:
    def loss_and_grads(rt):
        loss = step(model, batch, rt).detach()
        return loss, {n: p.grad.clone() for n, p in model.named_parameters()}

    (loss_a, grads_a), (loss_b, grads_b) = loss_and_grads(None), loss_and_grads(runtime)
    return torch.equal(loss_a, loss_b) and grads_a.keys() == grads_b.keys() and all(
        torch.equal(grads_a[n], grads_b[n]) for n in grads_a)


def time_steps(model, batch, runtime, warmup: int, steps: int) -> list[float]:
    for _ in range(warmup):
        step(model, batch, runtime)
    samples = []
    for _ in range(steps):
        start = time.perf_counter()
        step(model, batch, runtime)
        samples.append(time.perf_counter() - start)
    return samples


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
    parser.add_argument("--results", help="also write the markdown table to this file")
    args = parser.parse_args(argv)
    config = ExampleConfig(vocab=512, seq_len=args.seq_len, hidden=args.hidden, heads=4, layers=args.layers,
                           ffn=args.ffn, micro_batch=args.micro_batch)
    rows = []
    for kind in KINDS:
        model = make_example(kind, config)
        batch = make_batch(config, seed=1)
        workload = profile_model(model, batch, loss_fn, repeats=1)
        ops = len(workload.ops)
        plain = time_steps(model, batch, None, args.warmup, args.steps)
        rows.append((kind, ops, "none (plain torch)", statistics.median(plain), min(plain), None))
        for name in PLANS:
            # One runtime object per plan, entered once per step, as a training loop would.
            runtime = slackswap.apply(model, plan_for(workload, Action(name)), workload=workload)
            same = bit_identical(model, batch, runtime)
            samples = time_steps(model, batch, runtime, args.warmup, args.steps)
            rows.append((kind, ops, f"all-{name}", statistics.median(samples), min(samples), same))
        for row in rows[-4:]:
            print(f"{row[0]:6s} {row[2]:20s} median {row[3] * 1e3:8.2f} ms  best {row[4] * 1e3:8.2f} ms  "
                  f"bit-identical: {'-' if row[5] is None else row[5]}", flush=True)

    command = "`.venv/bin/python benchmarks/runtime_overhead.py" + (
        f" --results {args.results}`" if args.results else "`")
    lines = [
        f"Wall time of one training step (zero_grad, loss_fn forward, backward): median and best of "
        f"{args.steps} timed steps after {args.warmup} warm-up steps, `time.perf_counter`.",
        f"Machine: {os.cpu_count()}-core CPU (`nproc` = {usable_cpus()}), "
        f"{platform.machine()}, torch {torch.__version__} ({torch.get_num_threads()} intra-op threads, the default), "
        f"Python {platform.python_version()}.",
        f"Models: `ExampleConfig(vocab={config.vocab}, seq_len={config.seq_len}, hidden={config.hidden}, "
        f"heads={config.heads}, layers={config.layers}, ffn={config.ffn}, micro_batch={config.micro_batch})`, "
        "float32, dropout 0.1.",
        f"Command: {command}.",
        "",
        "Plans: every saved tensor with a producer kept / swapped / recomputed, prefetch steps from",
        "`runtime_prefetch_steps`, no budget; one `slackswap.apply` runtime per plan, entered once per step.",
        "On CPU a \"swap\" copies to CPU memory (no PCIe, no pinned pool effect): the all-swap and all-recompute",
        "rows measure Python bookkeeping plus recompute compute, not GPU behaviour.",
        "Overhead per op = (median all-keep - median plain) / forward aten ops. Bit-identical: loss and every",
        "gradient `torch.equal` to the unplanned step's (`torch.manual_seed(7)` before each).",
        "",
        "| model | forward aten ops | plan | median | best | median vs plain | all-keep overhead per op "
        "| bit-identical |",
        "|---|---:|---|---:|---:|---:|---:|---|",
    ]
    plain_median = {kind: med for kind, _, plan, med, _, same in rows if same is None}
    for kind, ops, plan, med, best, same in rows:
        per_op = f"{(med - plain_median[kind]) / ops * 1e6:.1f}" if plan == "all-keep" else ""
        ratio = f"{med / plain_median[kind]:.2f}x"
        lines.append(f"| {kind} | {ops} ops | {plan} | {med * 1e3:.2f} ms | {best * 1e3:.2f} ms | {ratio} "
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
