"""`slackswap simulate`: simulate one training step under a policy or a plan file."""

from __future__ import annotations

from .. import api
from ..errors import BudgetError
from ..plans import Plan
from ..timeline import Timeline
from ..units import format_bytes, format_seconds
from .common import (
    add_device_args, add_hardware_arg, add_workload_args, budget_share, check_output_paths, device_lines,
    device_options, gpu_memory_arg, load_hardware, load_workload, print_json,
)


def register(subparsers) -> None:
    parser = subparsers.add_parser("simulate", help="simulate one training step")
    add_workload_args(parser)
    add_hardware_arg(parser)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--policy", default=None, metavar="P", help="plan on the fly with policy P (default ideal)")
    source.add_argument("--plan", metavar="FILE", help="plan JSON from 'slackswap plan'")
    parser.add_argument("--budget", default=None, metavar="F|SIZE",
                        help="activation budget: a fraction of the unconstrained peak (0.5) or a size (12GiB); "
                        "default: the plan's own budget, or 0.5 with --policy")
    add_device_args(parser)
    parser.add_argument("--node-skew", dest="node_skew", type=float, default=None, metavar="SECONDS",
                        help="with a node preset as --hardware, also run every rank of the node with their copies "
                        "sharing its links, rank r starting r x SECONDS late (0: lockstep)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quiet", action="store_true", help="print nothing but errors (files are still written)")
    parser.add_argument("--timeline", metavar="FILE", help="also write the full Timeline as JSON")
    parser.add_argument("--trace", metavar="FILE", help="also write a Chrome/Perfetto trace JSON (ui.perfetto.dev)")
    parser.add_argument("--plot", metavar="FILE",
                        help="also draw memory and the three streams over the step (.png, .svg or .pdf; extra 'plot')")
    parser.set_defaults(func=run)


def run(args) -> int:
    check_output_paths(args.timeline, args.trace, args.plot)
    if args.node_skew is not None:
        from ..errors import ValidationError
        from ..nodes import NODES

        if args.hardware not in NODES:
            raise ValidationError(
                f"--node-skew needs a node preset as --hardware ({', '.join(NODES)}), got {args.hardware!r}")
    if args.plot:
        from ..report.plots import check_plot_target

        check_plot_target(args.plot)
    options = device_options(args).to_dict()
    gpu = gpu_memory_arg(args)
    hardware = load_hardware(args)
    workload = load_workload(args, hardware)
    ideal = api.simulate(workload, hardware)
    if gpu is not None and not args.plan:
        plan = api.plan(workload, hardware, args.budget, args.policy or "ideal", gpu_memory=gpu, **options)
        timeline = api.simulate(workload, hardware, plan)
    elif args.plan:
        plan = Plan.load(args.plan)
        timeline = api.simulate(workload, hardware, plan, args.budget)
    elif args.policy in (None, "ideal"):
        if args.budget is not None:
            # The ideal step keeps everything: a budget would be accepted here and refused by 'plan'.
            raise BudgetError(
                f"--budget {args.budget!r} needs --policy or --plan: without them simulate runs the ideal step, which "
                "keeps everything; add --policy slackswap (or another policy), or drop --budget"
            )
        plan, timeline = None, ideal
    else:
        budget = "0.5" if args.budget is None else args.budget
        plan = api.plan(workload, hardware, budget, args.policy)
        timeline = api.simulate(workload, hardware, plan, budget)
    memory = api.device_memory(workload, hardware, plan, **options)
    node = _node_run(args, workload, timeline, plan)
    if args.timeline:
        timeline.save(args.timeline)
    if args.trace:
        from ..report.chrome_trace import write_chrome_trace

        write_chrome_trace(timeline, args.trace, workload=workload, plan=plan)
    if args.plot:
        from ..report.plots import plot_step

        plot_step(timeline, args.plot)
    if args.quiet:
        return 0
    if args.json:
        summary = timeline.summary()
        summary["unconstrained_peak_bytes"] = ideal.peak_memory_bytes
        summary.update(memory.summary())
        summary["device"] = options
        if gpu is not None:
            summary["gpu_memory_bytes"] = gpu
            summary["fits_gpu_memory"] = memory.reserved_peak_bytes <= gpu
        if node is not None:
            summary["node"] = node
        print_json(summary)
    else:
        print("\n".join(summary_lines(timeline, ideal.peak_memory_bytes) + device_lines(memory, gpu)
                        + node_lines(node)))
    return 0


def _node_run(args, workload, timeline, plan) -> dict | None:
    """--node-skew: every rank of the node named by --hardware, with the plan the single rank ran."""
    if args.node_skew is None:
        return None
    from ..nodes import NODES
    from ..schedule import make_plan
    from ..sim.node import simulate_node

    node = NODES[args.hardware]
    if plan is None:
        plan = make_plan(workload, {}, policy="ideal", budget_bytes=None)
    result = simulate_node(workload, node, plan, timeline.budget_bytes, skew_s=args.node_skew)
    return {"node": node.name, "skew_s": args.node_skew, "step_time_s": result.step_time_s,
            "rank_step_times_s": [t.step_time_s for t in result.timelines],
            "rank_stall_times_s": [t.stall_time_s for t in result.timelines],
            "pinned_host_bytes_per_socket": result.pinned_host_bytes_per_socket}


def node_lines(node: dict | None) -> list[str]:
    if node is None:
        return []
    slowest = max(node["rank_step_times_s"])
    return [
        f"node                {node['node']}, {len(node['rank_step_times_s'])} ranks, rank r starting "
        f"r x {format_seconds(node['skew_s'])} late",
        f"node step time      {format_seconds(node['step_time_s'])} (slowest rank {format_seconds(slowest)}, "
        f"stalls up to {format_seconds(max(node['rank_stall_times_s']))})",
        f"pinned per socket   {format_bytes(node['pinned_host_bytes_per_socket'])}",
    ]


def summary_lines(t: Timeline, unconstrained_peak_bytes: int) -> list[str]:
    budget = "none (everything kept)" if t.budget_bytes is None else (
        f"{format_bytes(t.budget_bytes)} ({budget_share(t.budget_bytes, unconstrained_peak_bytes)})"
    )
    return [
        f"workload            {t.workload_name} on {t.hardware_name}, policy {t.policy}",
        f"step time           {format_seconds(t.step_time_s)} (ideal {format_seconds(t.ideal_step_time_s)})",
        f"throughput          {t.throughput_pct:.2f}% of ideal",
        f"peak activations    {format_bytes(t.peak_memory_bytes)} (unconstrained {format_bytes(unconstrained_peak_bytes)})",
        f"budget              {budget}",
        f"copied out / back   {format_bytes(t.d2h_bytes)} / {format_bytes(t.h2d_bytes)}",
        f"recompute time      {format_seconds(t.recompute_time_s)}",
        f"stalls              {format_seconds(t.stall_time_s)} (waiting for copies {format_seconds(t.stall_copy_s)}, "
        f"for memory {format_seconds(t.stall_memory_s)})",
    ]
