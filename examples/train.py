"""Profile, plan and train an example model end to end, and check it against plain training.

    python examples/train.py --model gpt2 --steps 5 --budget 0.5 --policy slackswap

Prints the plan's actions, what the runtime realizes, the swap manager's counters, and the
largest difference between the planned run's losses and an unmodified run's (0 expected).
"""

from __future__ import annotations

import argparse
import copy
import sys

import torch

from slackswap import Action, get_hardware
from slackswap.examples import EXAMPLES, ExampleConfig, loss_fn, make_batch, make_example
from slackswap.profiler import profile_model
from slackswap.runtime import apply_plan, build_execution_map
from slackswap.units import format_bytes


def make_plan_for(workload, hardware, budget: float, policy: str):
    """Plan with the planners when they are installed; the runtime's prefetch steps are applied
    so every swapped tensor is back when the runtime reads it."""
    import dataclasses

    from slackswap.planners import plan_workload
    from slackswap.runtime import runtime_prefetch_steps
    from slackswap.schedule import make_plan
    from slackswap.sim import simulate_ideal

    peak = simulate_ideal(workload, hardware).peak_memory_bytes
    plan = plan_workload(workload, hardware, max(1, int(budget * peak)), policy)
    steps = runtime_prefetch_steps(workload, plan)
    merged = {n: min(s, plan.prefetch_step.get(n, s)) for n, s in steps.items()}
    runnable = make_plan(workload, plan.actions, policy=plan.policy, budget_bytes=plan.budget_bytes, prefetch_step=merged)
    return dataclasses.replace(runnable, info=plan.info)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(EXAMPLES), default="gpt2")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--budget", type=float, default=0.5, help="fraction of the unconstrained peak")
    parser.add_argument("--policy", default="slackswap")
    parser.add_argument("--hardware", default="a100-80gb-pcie4")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=32)
    args = parser.parse_args(argv)

    config = ExampleConfig(layers=args.layers, hidden=args.hidden, heads=4, ffn=4 * args.hidden, seq_len=args.seq_len)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = make_example(args.model, config, device=device)
    batches = [make_batch(config, seed=s, device=device) for s in range(args.steps)]
    hardware = get_hardware(args.hardware)
    workload = profile_model(model, batches[0], loss_fn, hardware=hardware)
    plan = make_plan_for(workload, hardware, args.budget, args.policy)
    emap = build_execution_map(workload, plan)
    print(f"{workload.name}: {len(workload.ops)} ops, {format_bytes(workload.saved_bytes)} saved per step")
    print(f"plan {plan.policy} at {format_bytes(plan.budget_bytes)}: "
          + ", ".join(f"{plan.count(a)} {a.value}" for a in Action))
    print(f"runtime: {len(emap.regions)} checkpoint region(s); "
          + ("runs the plan exactly" if emap.aligned else "differs from the plan: " + "; ".join(emap.notes)))

    def train(m, runtime=None):
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        torch.manual_seed(0)
        losses = []
        for batch in batches:
            opt.zero_grad()
            if runtime is None:
                loss = loss_fn(m, batch)
                loss.backward()
            else:
                with runtime:
                    loss = loss_fn(m, batch)
                    loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    reference = train(copy.deepcopy(model))
    runtime = apply_plan(model, plan, workload)
    planned = train(model, runtime)
    s = runtime.stats
    print(f"losses: {', '.join(f'{x:.5f}' for x in planned)}")
    print(f"max |loss - unmodified loss|: {max(abs(a - b) for a, b in zip(reference, planned)):.3g}")
    print(f"per step: {format_bytes(s.step_d2h_bytes)} copied out, {format_bytes(s.step_h2d_bytes)} back; "
          f"peak saved on device {format_bytes(s.peak_device_saved_bytes)} (budget {format_bytes(plan.budget_bytes)}); "
          f"host pool {format_bytes(s.host_pool_bytes)} allocated {s.host_pool_allocations}x; late prefetches {s.late_prefetches}")
    return 0 if reference == planned else 1


if __name__ == "__main__":
    sys.exit(main())
