"""Long-run soak of the runtime: does memory stay flat over many training steps?

For the CPU GPT-2 example model this runs ``--steps`` SGD steps (zero_grad, loss_fn forward,
backward, optimizer step) in each configuration:

- ``plain``: no slackswap (the baseline for process memory);
- each runtime backend (replay, checkpoint) with a plan that both swaps and recomputes, in two
  patterns: a new ``with slackswap.apply(model, plan):`` per step (the README's pattern) and one
  runtime object entered every step;
- the automatic mode (``slackswap.auto(...).step(batch)``) with batches of three sequence lengths
  in turn, each profiled and planned once.

Every ``--every`` steps (and after the first) it samples, after ``gc.collect()``: the process's
resident memory (RSS, from /proc/self/statm), the host-pool bytes of every live swap manager, and
how many swap managers and runtime objects are alive. Flat lines mean no leak: an older runtime
that stays alive keeps its host pool (pinned memory on a GPU) with it.

    .venv/bin/python benchmarks/soak.py [--steps 1000] [--every 50] [--threads 1] [--layers N] [--results FILE]

The committed table (benchmarks/results/soak.md) uses the smallest example model (``--layers 1``),
so that 1,000 steps of all six configurations fit in about a quarter of an hour on a loaded 2-core CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import os
import platform
import sys
import time
import warnings

import torch

import slackswap
from slackswap import Action, make_plan
from slackswap.errors import ProfileNoiseWarning
from slackswap.examples import TINY, loss_fn, make_batch, make_example
from slackswap.profiler import profile_model
from slackswap.runtime import runtime_prefetch_steps
from slackswap.runtime.apply import PlanRuntime
from slackswap.runtime.checkpoint_backend import CheckpointRuntime
from slackswap.runtime.swap import SwapManager

HARDWARE = slackswap.get_hardware("a100-80gb-pcie4")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
AUTO_SEQ_LENS = (8, 12, 16)
MiB = 2**20


def rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * PAGE_BYTES


def live_objects() -> tuple[int, int, int]:
    """(swap managers alive, runtime objects alive, host-pool bytes they hold), after gc.collect()."""
    gc.collect()
    managers = runtimes = pool = 0
    for obj in gc.get_objects():
        if isinstance(obj, SwapManager):
            managers += 1
            pool += obj.pool.numel() if obj.pool is not None else 0
        elif isinstance(obj, (PlanRuntime, CheckpointRuntime)):
            runtimes += 1
    return managers, runtimes, pool


def mixed_plan(workload):
    """Swap and recompute alternately, keep every third tensor: the host pool and the recompute
    groups are both in use (as tests/test_runtime_safety.py's mixed plan, with recompute)."""
    cycle = (Action.SWAP, Action.RECOMPUTE, Action.KEEP)
    movable = [t.name for t in workload.saved_tensors if t.producer is not None]
    actions = {name: cycle[i % 3] for i, name in enumerate(movable)}
    return make_plan(workload, actions, policy="mixed", budget_bytes=None,
                     prefetch_step=runtime_prefetch_steps(workload, actions))


def block_plan(workload):
    """A plan the checkpoint backend runs as planned: recompute what a transformer block makes and
    only it reads back, swap what crosses a block boundary before the last layers, keep the rest
    (the shape of tests/test_runtime_checkpoint.py's mixed plan); budgeted at its simulated peak."""
    calls = workload.meta["op_calls"]

    def block(op_index: int) -> str | None:
        parts = calls[op_index].split("@")[0].split(".")
        return ".".join(parts[:2]) if len(parts) >= 2 and parts[1].isdigit() else None

    last_layer = workload.ops[-1].layer
    actions = {}
    for t in workload.saved_tensors:
        if t.producer is None:
            continue
        made_in = block(workload.op_index[t.producer])
        if made_in is not None and {block(workload.op_index[r]) for r in t.bwd_readers} == {made_in}:
            actions[t.name] = Action.RECOMPUTE
        elif workload.ops[workload.op_index[t.producer]].layer < last_layer - 1:
            actions[t.name] = Action.SWAP
    plan = make_plan(workload, actions, policy="blocks", budget_bytes=None,
                     prefetch_step=runtime_prefetch_steps(workload, actions))
    peak = slackswap.simulate(workload, HARDWARE, plan).peak_memory_bytes
    return dataclasses.replace(plan, budget_bytes=peak)


def soak(model, steps: int, every: int, run_step) -> list[tuple[int, int, int, int, int]]:
    """Run ``steps`` SGD steps; ``run_step(k)`` runs step k's forward and backward. Returns samples
    (step, rss bytes, managers, runtimes, pool bytes)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    samples = []
    for k in range(1, steps + 1):
        opt.zero_grad(set_to_none=True)
        run_step(k)
        opt.step()
        if k == 1 or k % every == 0:
            managers, runtimes, pool = live_objects()
            samples.append((k, rss_bytes(), managers, runtimes, pool))
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--layers", type=int, default=TINY.layers, help="example model layers (default %(default)s)")
    parser.add_argument("--results", help="also write the markdown tables to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore", ProfileNoiseWarning)  # the shared machine is busy; times do not matter here
    torch.manual_seed(0)
    load_at_start = os.getloadavg()[0]

    config = dataclasses.replace(TINY, layers=args.layers)
    model, batch = make_example("gpt2", config), make_batch(config)
    workload = profile_model(model, batch, loss_fn, repeats=1, hardware=HARDWARE)
    plans = {"replay": mixed_plan(workload), "checkpoint": block_plan(workload)}

    def under(context_for):
        def run_step(k):
            with context_for(k):
                loss_fn(model, batch).backward()
        return run_step

    def new_apply_per_step(backend):
        return lambda: under(lambda k: slackswap.apply(model, plans[backend], workload=workload, backend=backend))

    def one_runtime(backend):
        def start():
            runtime = slackswap.apply(model, plans[backend], workload=workload, backend=backend)
            return under(lambda k: runtime)
        return start

    def automatic():
        # Three sequence lengths in turn: each is profiled and planned once, then runs under a new
        # runtime per step (slackswap.auto's pattern).
        auto = slackswap.auto(model, loss_fn, hardware=HARDWARE, budget=0.5, policy="slackswap")
        shapes = [make_batch(dataclasses.replace(config, seq_len=n)) for n in AUTO_SEQ_LENS]
        return lambda k: auto.step(shapes[k % len(shapes)])

    # Each configuration's runtimes are made when it starts and dropped when it ends.
    configs = {"plain": lambda: under(lambda k: contextlib.nullcontext())}
    for backend in plans:
        configs[f"{backend}, new apply per step"] = new_apply_per_step(backend)
        configs[f"{backend}, one runtime reused"] = one_runtime(backend)
    configs[f"auto, {len(AUTO_SEQ_LENS)} batch shapes"] = automatic
    results, seconds = {}, {}
    for name, start in configs.items():
        began = time.perf_counter()
        results[name] = soak(model, args.steps, args.every, start())
        seconds[name] = time.perf_counter() - began
        print(f"{name}: {args.steps} steps in {seconds[name]:.1f} s", file=sys.stderr)

    text = render(args, workload, plans, results, seconds, (load_at_start, os.getloadavg()[0]))
    print(text)
    if args.results:
        with open(args.results, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
    return 0


def count(plan, action) -> str:
    return f"{plan.count(action)} {action.value}"


def render(args, workload, plans, results, seconds, load) -> str:
    names = list(results)
    steps = [s[0] for s in results[names[0]]]
    lines = [
        "# Runtime soak benchmark",
        "",
        f"{args.steps} SGD steps of the CPU GPT-2 example model (`make_example('gpt2', config)` with the default "
        f"`ExampleConfig` but {args.layers} layer{'s' if args.layers != 1 else ''}: hidden 32, 4 heads, sequence 16, "
        f"micro-batch 2, float32, dropout 0.1) per configuration, sampled after the first step and every "
        f"{args.every} steps, after `gc.collect()`.",
        f"Machine: {os.cpu_count()}-core CPU, {platform.machine()}, torch {torch.__version__} "
        f"({args.threads} intra-op thread{'s' if args.threads != 1 else ''}), Python {platform.python_version()}; "
        f"other jobs shared the machine (1-minute load average {load[0]:.1f} at the start, {load[1]:.1f} at the end).",
        f"Command: `.venv/bin/python benchmarks/soak.py --steps {args.steps} --every {args.every} "
        f"--threads {args.threads} --layers {args.layers}" + (f" --results {args.results}`." if args.results else "`."),
        "",
        "Plans: replay backend: every movable saved tensor swapped, recomputed or kept in turn "
        f"({', '.join(count(plans['replay'], a) for a in Action)}); checkpoint backend: what a block makes and "
        "only it reads recomputed, what crosses blocks swapped, the rest kept "
        f"({', '.join(count(plans['checkpoint'], a) for a in Action)}).",
        f"Automatic mode: `slackswap.auto(model, loss_fn, budget=0.5, policy='slackswap')`, batches of sequence "
        f"lengths {', '.join(map(str, AUTO_SEQ_LENS))} in turn.",
        "On CPU the host pool is ordinary CPU memory (on a GPU it would be pinned); it is allocated on the first",
        "swap of a runtime and kept by it, so a runtime that stays alive keeps its pool.",
        "",
        "Wall time per configuration: " + "; ".join(f"{n}: {seconds[n]:.0f} s" for n in names) + ".",
        "",
        "## Resident process memory (MiB)",
        "",
        "| step | " + " | ".join(names) + " |",
        "|---:|" + "---:|" * len(names),
    ]
    for i, step in enumerate(steps):
        lines.append(f"| {step} | " + " | ".join(f"{results[n][i][1] / MiB:.1f}" for n in names) + " |")
    lines += ["", "## Live swap managers / runtime objects / host-pool bytes held by live managers", "",
              "| step | " + " | ".join(names[1:]) + " |", "|---:|" + "---|" * (len(names) - 1)]
    for i, step in enumerate(steps):
        cells = [f"{results[n][i][2]} / {results[n][i][3]} / {results[n][i][4]} B" for n in names[1:]]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    settle = steps[1] if len(steps) > 1 else steps[0]
    lines += ["", "## Summary", "",
              f"Slope: least-squares fit of RSS against the step over the samples from step {settle} on (the first "
              "step allocates what every later step reuses), scaled to 1,000 steps. A leak grows in both slopes; a "
              "single rise followed by a flat line (the allocator growing its heap once) shows in the first slope "
              "and is 0 over the second half.",
              "",
              "| configuration | RSS at first sample | RSS at last sample | change after the first "
              f"{settle} steps | RSS slope from step {settle} (MiB per 1,000 steps) | RSS slope over the second half "
              "(MiB per 1,000 steps) | live managers / runtimes (min-max) | host-pool bytes (min-max) |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for n in names:
        first, last = results[n][0][1], results[n][-1][1]
        settled = [s for s in results[n] if s[0] >= settle]
        managers, runtimes, pools = ([s[k] for s in results[n]] for k in (2, 3, 4))
        lines.append(f"| {n} | {first / MiB:.1f} MiB | {last / MiB:.1f} MiB | {(last - settled[0][1]) / MiB:+.1f} MiB | "
                     f"{slope_bytes_per_step(settled) * 1000 / MiB:+.2f} | "
                     f"{slope_bytes_per_step([s for s in results[n] if s[0] >= args.steps // 2]) * 1000 / MiB:+.2f} | "
                     f"{min(managers)}-{max(managers)} / "
                     f"{min(runtimes)}-{max(runtimes)} | {min(pools)}-{max(pools)} B |")
    return "\n".join(lines)


def slope_bytes_per_step(samples) -> float:
    """Least-squares slope of RSS (bytes) against the step number."""
    if len(samples) < 2:
        return 0.0
    xs, ys = [s[0] for s in samples], [s[1] for s in samples]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


if __name__ == "__main__":
    sys.exit(main())
