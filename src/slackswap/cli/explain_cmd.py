"""`slackswap explain`: per layer, which saved tensors a policy keeps, swaps or recomputes, and why."""

from __future__ import annotations

from ..report.explain import explain, explanation_lines
from .common import (
    add_budget_arg, add_hardware_arg, add_workload_args, load_hardware, load_workload, print_json,
)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "explain", help="explain a plan per layer: kept, swapped, recomputed, and why",
        description="Plan the workload, simulate it, and print for every layer which saved tensors are kept, "
                    "swapped or recomputed, the link slack left, and the recompute and copy costs (us/MiB).",
    )
    add_workload_args(parser)
    add_hardware_arg(parser)
    add_budget_arg(parser)
    parser.add_argument("--policy", default=None, metavar="P", help="planning policy (default: slackswap)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quiet", action="store_true", help="print nothing but errors")
    parser.set_defaults(func=run)


def run(args) -> int:
    from .. import api
    from ..planners import DEFAULT_POLICY

    hardware = load_hardware(args)
    workload = load_workload(args, hardware)
    plan = api.plan(workload, hardware, args.budget, DEFAULT_POLICY if args.policy is None else args.policy)
    timeline = api.simulate(workload, hardware, plan, args.budget)
    result = explain(workload, hardware, plan, timeline)
    if args.quiet:
        return 0
    if args.json:
        print_json(result.to_dict())
    else:
        print("\n".join(explanation_lines(result)))
    return 0
