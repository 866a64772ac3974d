"""`slackswap sweep`: throughput against budget for each policy, written as CSV."""

from __future__ import annotations

from ..experiments.sweep import parse_budgets, parse_policies, run_sweep, write_csv
from ..report.console import progress_reporter
from .common import (
    add_device_args, add_hardware_arg, add_workload_args, check_output_paths, device_options, gpu_memory_arg,
    load_hardware, load_workload, print_json,
)


def register(subparsers) -> None:
    parser = subparsers.add_parser("sweep", help="throughput of each policy across budgets (CSV)")
    add_workload_args(parser)
    add_hardware_arg(parser)
    parser.add_argument("--budgets", default="0.2:1.0:0.05", metavar="START:STOP:STEP|LIST",
                        help="budget fractions of the unconstrained peak (default 0.2:1.0:0.05)")
    parser.add_argument("--policies", default=None, metavar="A,B", help="comma-separated policies (default all)")
    add_device_args(parser)
    parser.add_argument("--out", required=True, metavar="FILE", help="where to write the CSV")
    parser.add_argument("--plot", metavar="FILE",
                        help="also draw throughput against budget per policy (.png, .svg or .pdf; extra 'plot')")
    parser.add_argument("--json", action="store_true", help="print the rows as one JSON object")
    parser.add_argument("--quiet", action="store_true", help="print nothing but errors")
    parser.set_defaults(func=run)


def run(args) -> int:
    check_output_paths(args.out, args.plot)
    if args.plot:
        from ..report.plots import check_plot_target

        check_plot_target(args.plot)
    budgets = parse_budgets(args.budgets)
    policies = parse_policies(args.policies)
    options = device_options(args)
    gpu = gpu_memory_arg(args)
    hardware = load_hardware(args)
    workload = load_workload(args, hardware)
    with progress_reporter("sweep", quiet=args.quiet) as progress:
        rows = run_sweep(workload, hardware, budgets, policies, progress=progress, gpu_memory_bytes=gpu,
                         options=options)
    write_csv(args.out, rows)
    if args.plot:
        from ..report.plots import plot_sweep

        plot_sweep(rows, args.plot)
    if args.json and not args.quiet:
        print_json({"workload": workload.name, "hardware": hardware.name, "rows": rows})
    elif not args.quiet:
        print(f"wrote {len(rows)} rows ({len(budgets)} budgets x {len(policies)} policies) to {args.out}")
    return 0
