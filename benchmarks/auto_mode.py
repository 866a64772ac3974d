"""What slackswap.auto costs: a new input shape (profile + plan + the step) and a step at a known one.

On the GPT-2-like example (CPU), for a training loop whose sequence length changes among a few
buckets, this times in one run, side by side:

* a plain step (no slackswap), at each length;
* the same plan under ``slackswap.apply`` (the runtime alone);
* ``AutoRuntime.step`` at a length seen before (signature, cache lookup, the runtime);
* ``AutoRuntime.step`` at a new length, split into the profile, the planning and the step.

It reports medians over ``--steps`` steps per length and checks once that auto training equals
plain training bit for bit.

    .venv/bin/python benchmarks/auto_mode.py [--steps 9] [--results FILE]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import torch

import slackswap
from slackswap.examples import ExampleConfig, loss_fn, make_batch, make_example

CONFIG = ExampleConfig(vocab=512, seq_len=256, hidden=128, heads=4, layers=4, ffn=512, dropout=0.1, micro_batch=4)
LENGTHS = (64, 128, 256)
BUDGET, POLICY = 0.5, "slackswap"


def batch_of(length: int, seed: int):
    tokens, targets = make_batch(CONFIG, seed=seed)
    return tokens[:, :length].contiguous(), targets[:, :length].contiguous()


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def plain_step(model, batch):
    model.zero_grad(set_to_none=True)
    loss_fn(model, batch).backward()


def runtime_step(model, batch, runtime):
    model.zero_grad(set_to_none=True)
    with runtime:
        loss_fn(model, batch).backward()


def auto_step(model, batch, auto):
    model.zero_grad(set_to_none=True)
    auto.step(batch)


def bit_identical() -> bool:
    """Six steps over the lengths, with SGD: auto training equals plain training."""
    results = []
    for use_auto in (False, True):
        model = make_example("gpt2", CONFIG)
        auto = slackswap.auto(model, loss_fn, budget=BUDGET, policy=POLICY, repeats=1) if use_auto else None
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.manual_seed(3)
        for i, length in enumerate(LENGTHS * 2):
            opt.zero_grad(set_to_none=True)
            batch = batch_of(length, i)
            if auto is None:
                loss_fn(model, batch).backward()
            else:
                auto.step(batch)
            opt.step()
        results.append([p.detach().clone() for p in model.parameters()])
    return all(torch.equal(a, b) for a, b in zip(*results))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=9)
    parser.add_argument("--results", default=None, help="write a markdown table here")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model = make_example("gpt2", CONFIG)
    auto = slackswap.auto(model, loss_fn, budget=BUDGET, policy=POLICY)  # profile defaults: warmup 1, repeats 3
    rows = []
    for length in LENGTHS:
        batch = batch_of(length, 0)
        before = (auto.stats.profile_time_s, auto.stats.plan_time_s)
        first_s = timed(lambda: auto_step(model, batch, auto))
        profile_s = auto.stats.profile_time_s - before[0]
        plan_s = auto.stats.plan_time_s - before[1]
        _, (entry,) = auto.entries(batch)
        runtime = slackswap.apply(model, entry.plan, workload=entry.workload)
        plain, applied, cached = [], [], []
        for _ in range(args.steps):  # interleaved, so a busy moment hits all three alike
            plain.append(timed(lambda: plain_step(model, batch)))
            applied.append(timed(lambda: runtime_step(model, batch, runtime)))
            cached.append(timed(lambda: auto_step(model, batch, auto)))
        rows.append((length, len(entry.workload.ops), statistics.median(plain), statistics.median(applied),
                     statistics.median(cached), first_s, profile_s, plan_s))
    same = bit_identical()
    lines = [
        f"# slackswap.auto: cost of a new shape and of a known one (benchmarks/auto_mode.py)",
        "",
        f"GPT-2-like example (L{CONFIG.layers} h{CONFIG.hidden} b{CONFIG.micro_batch}, dropout {CONFIG.dropout}), "
        f"policy {POLICY} at budget {BUDGET}, planned for the default hardware (profile projected by the roofline); "
        f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"load average {os.getloadavg()[0]:.1f} at the end; medians of {args.steps} interleaved steps per length. "
        f"Auto training equals plain training bit for bit over 6 steps: {same}.",
        "",
        "| seq len | forward ops | plain step (ms) | apply, same plan (ms) | auto, known shape (ms) | "
        "auto, new shape (ms) | of which profile (ms) | of which plan (ms) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for length, ops, plain, applied, cached, first, prof, pl in rows:
        lines.append(f"| {length} | {ops} | {plain * 1e3:.1f} | {applied * 1e3:.1f} | {cached * 1e3:.1f} | "
                     f"{first * 1e3:.1f} | {prof * 1e3:.1f} | {pl * 1e3:.1f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.results:
        with open(args.results, "w") as f:
            f.write(text)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
