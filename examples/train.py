"""Profile, plan and train an example model end to end, and check it against plain training.

    python examples/train.py --model gpt2 --steps 5 --budget 0.5 --policy slackswap

Prints the plan's actions, then what the plan (as simulated) predicts against what the runtime
measured: recompute FLOPs (FlopCounterMode, planned step minus unmodified step), bytes copied
each way per step, and the peak of saved bytes held on the device; then the largest difference
between the planned run's losses and an unmodified run's (0 expected).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import sys

import torch
from torch.utils.flop_counter import FlopCounterMode

import slackswap
from slackswap import Action, get_hardware
from slackswap.examples import EXAMPLES, ExampleConfig, loss_fn, make_batch, make_example
from slackswap.profiler import profile_model
from slackswap.runtime import apply_plan, build_execution_map
from slackswap.units import format_bytes


def step_flops(model, batch, runtime=None) -> int:
    """FLOPs of one training step (forward, backward and any recompute), by FlopCounterMode."""
    with FlopCounterMode(display=False) as counter:
        with runtime if runtime is not None else contextlib.nullcontext():
            loss_fn(model, batch).backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def mflop(flops: float) -> str:
    return f"{flops / 1e6:.3f} MFLOP"


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
    plan = slackswap.plan(workload, hardware, budget=args.budget, policy=args.policy)
    emap = build_execution_map(workload, plan)
    simulated = slackswap.simulate(workload, hardware, plan)
    print(f"{workload.name}: {len(workload.ops)} ops, {format_bytes(workload.saved_bytes)} saved per step")
    print(f"plan {plan.policy} at {format_bytes(plan.budget_bytes)}: "
          + ", ".join(f"{plan.count(a)} {a.value}" for a in Action)
          + f"; {len(plan.recompute_groups)} recompute group(s)")
    if not emap.aligned:
        print("runtime differs from the plan: " + "; ".join(emap.notes))

    def train(m, runtime=None):
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        torch.manual_seed(0)
        losses = []
        for batch in batches:
            opt.zero_grad()
            with runtime if runtime is not None else contextlib.nullcontext():
                loss = loss_fn(m, batch)
                loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    unmodified = copy.deepcopy(model)
    reference = train(copy.deepcopy(model))
    runtime = apply_plan(model, plan, workload)
    planned = train(model, runtime)
    s = runtime.stats
    torch.manual_seed(0)
    measured_flops = step_flops(model, batches[0], runtime)
    torch.manual_seed(0)
    measured_flops -= step_flops(unmodified, batches[0])
    predicted_flops = emap.plan_recompute_flops
    swapped = plan.bytes_with(workload, Action.SWAP)
    rows = [
        ("recompute per step", mflop(predicted_flops), mflop(measured_flops)),
        ("copied out per step", format_bytes(swapped), format_bytes(s.step_d2h_bytes)),
        ("copied back per step", format_bytes(swapped), format_bytes(s.step_h2d_bytes)),
        ("peak saved on device", format_bytes(simulated.peak_memory_bytes), format_bytes(s.peak_device_saved_bytes)),
    ]
    print(f"{'':22} {'plan (simulated)':>18} {'runtime (measured)':>19}")
    for label, want, got in rows:
        print(f"{label:22} {want:>18} {got:>19}")
    print(f"budget {format_bytes(plan.budget_bytes)}; host pool {format_bytes(s.host_pool_bytes)} allocated "
          f"{s.host_pool_allocations}x; late prefetches {s.late_prefetches}")
    print(f"losses: {', '.join(f'{x:.5f}' for x in planned)}")
    print(f"max |loss - unmodified loss|: {max(abs(a - b) for a, b in zip(reference, planned)):.3g}")
    exact = (reference == planned and measured_flops == predicted_flops and s.step_d2h_bytes == swapped
             and s.step_h2d_bytes == swapped and s.peak_device_saved_bytes <= plan.budget_bytes)
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
