"""`slackswap plan`: plan keep / swap / recompute for a workload and write the Plan as JSON."""

from __future__ import annotations

from .. import api
from ..report.console import progress_reporter
from ..planners import DEFAULT_POLICY, PLANNERS
from ..units import format_bytes, format_seconds
from .common import (
    add_budget_arg, add_device_args, add_hardware_arg, add_workload_args, budget_share, check_output_paths,
    device_lines, device_options, gpu_memory_arg, load_hardware, load_workload, print_json,
)


def register(subparsers) -> None:
    parser = subparsers.add_parser("plan", help="plan keep / swap / recompute of saved activations")
    add_workload_args(parser)
    add_hardware_arg(parser)
    add_budget_arg(parser, default=None)
    add_device_args(parser)
    parser.add_argument("--policy", default=DEFAULT_POLICY, choices=list(PLANNERS), metavar="P",
                        help=f"planning policy: {', '.join(PLANNERS)} (default {DEFAULT_POLICY})")
    parser.add_argument("--out", required=True, metavar="FILE", help="where to write the plan JSON")
    parser.add_argument("--json", action="store_true", help="print a JSON summary of the plan and its simulation")
    parser.add_argument("--quiet", action="store_true", help="print nothing but errors")
    parser.set_defaults(func=run)


def run(args) -> int:
    check_output_paths(args.out)
    options = device_options(args).to_dict()
    gpu = gpu_memory_arg(args)
    hardware = load_hardware(args)
    workload = load_workload(args, hardware)
    with progress_reporter("plan", quiet=args.quiet) as report:
        report(0, None, f"{args.policy} for {workload.name}")
        device = {"gpu_memory": gpu, **options} if gpu is not None else {}
        plan = api.plan(workload, hardware, args.budget, args.policy, **device)
    plan.save(args.out, workload)
    if args.quiet:
        return 0
    ideal = api.simulate(workload, hardware)
    timeline = api.simulate(workload, hardware, plan)
    memory = api.device_memory(workload, hardware, plan, **options)
    if args.json:
        from ..plans import Action

        print_json({
            "plan_file": args.out, "policy": plan.policy, "workload": workload.name, "hardware": hardware.name,
            "budget_bytes": plan.budget_bytes, "unconstrained_peak_bytes": ideal.peak_memory_bytes,
            "keep_count": plan.count(Action.KEEP), "swap_count": plan.count(Action.SWAP),
            "recompute_count": plan.count(Action.RECOMPUTE),
            "swap_bytes": plan.bytes_with(workload, Action.SWAP),
            "recompute_bytes": plan.bytes_with(workload, Action.RECOMPUTE),
            "simulated": timeline.summary(), "info": dict(plan.info),
            "device_memory": {**memory.summary(), "device": options, "gpu_memory_bytes": gpu},
        })
    else:
        print("\n".join(summary_lines(plan, timeline, workload, ideal.peak_memory_bytes, args.out)
                        + device_lines(memory, gpu)))
    return 0


def summary_lines(plan, timeline, workload, unconstrained_peak_bytes: int, path: str) -> list[str]:
    from ..plans import Action

    budget = "none" if plan.budget_bytes is None else (
        f"{format_bytes(plan.budget_bytes)} ({budget_share(plan.budget_bytes, unconstrained_peak_bytes)})")
    return [
        f"plan                {plan.policy} for {workload.name}, written to {path}",
        f"budget              {budget}",
        f"tensors             {plan.count(Action.KEEP)} keep, {plan.count(Action.SWAP)} swap "
        f"({format_bytes(plan.bytes_with(workload, Action.SWAP))}), {plan.count(Action.RECOMPUTE)} recompute "
        f"({format_bytes(plan.bytes_with(workload, Action.RECOMPUTE))})",
        f"simulated step      {format_seconds(timeline.step_time_s)}, {timeline.throughput_pct:.2f}% of ideal, "
        f"peak {format_bytes(timeline.peak_memory_bytes)}",
    ]
