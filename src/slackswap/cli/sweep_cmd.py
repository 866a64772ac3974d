"""`slackswap sweep`: throughput against budget for each policy, written as CSV."""

from __future__ import annotations

import sys

from ..experiments.sweep import parse_budgets, parse_policies, run_sweep, write_csv
from .common import add_hardware_arg, add_workload_args, check_output_paths, load_hardware, load_workload


def register(subparsers) -> None:
    parser = subparsers.add_parser("sweep", help="throughput of each policy across budgets (CSV)")
    add_workload_args(parser)
    add_hardware_arg(parser)
    parser.add_argument("--budgets", default="0.2:1.0:0.05", metavar="START:STOP:STEP|LIST",
                        help="budget fractions of the unconstrained peak (default 0.2:1.0:0.05)")
    parser.add_argument("--policies", default=None, metavar="A,B", help="comma-separated policies (default all)")
    parser.add_argument("--out", required=True, metavar="FILE", help="where to write the CSV")
    parser.add_argument("--plot", metavar="FILE",
                        help="also draw throughput against budget per policy (.png, .svg or .pdf; extra 'plot')")
    parser.add_argument("--quiet", action="store_true", help="print nothing but errors")
    parser.set_defaults(func=run)


def run(args) -> int:
    check_output_paths(args.out, args.plot)
    if args.plot:
        from ..report.plots import check_plot_target

        check_plot_target(args.plot)
    budgets = parse_budgets(args.budgets)
    policies = parse_policies(args.policies)
    hardware = load_hardware(args)
    workload = load_workload(args, hardware)
    progress = terminal_progress(sys.stderr) if not args.quiet and sys.stderr.isatty() else None
    rows = run_sweep(workload, hardware, budgets, policies, progress=progress)
    if progress is not None:
        sys.stderr.write("\n")
    write_csv(args.out, rows)
    if args.plot:
        from ..report.plots import plot_sweep

        plot_sweep(rows, args.plot)
    if not args.quiet:
        print(f"wrote {len(rows)} rows ({len(budgets)} budgets x {len(policies)} policies) to {args.out}")
    return 0


def terminal_progress(stream):
    """A one-line progress indicator redrawn in place: '[####....] 12/40 slackswap at 0.50'."""
    def show(done: int, total: int, label: str) -> None:
        width = 30
        filled = width * done // total if total else width
        stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {label:<32}")
        stream.flush()
    return show
