"""`slackswap export-workload`: write a built-in workload as JSON."""

from __future__ import annotations

from ..units import format_bytes, format_seconds
from .common import add_hardware_arg, add_workload_args, check_output_paths, load_hardware, load_workload, print_json


def register(subparsers) -> None:
    parser = subparsers.add_parser("export-workload", help="write a built-in workload as JSON")
    add_workload_args(parser)
    add_hardware_arg(parser)
    parser.add_argument("--out", required=True, metavar="FILE", help="output JSON file")
    parser.add_argument("--json", action="store_true", help="print a JSON summary of what was written")
    parser.add_argument("--quiet", action="store_true", help="print nothing but errors")
    parser.set_defaults(func=run)


def run(args) -> int:
    check_output_paths(args.out)
    hardware = load_hardware(args)
    workload = load_workload(args, hardware)
    workload.save(args.out)
    if args.quiet:
        return 0
    if args.json:
        print_json({"out": args.out, "workload": workload.name, "ops": len(workload.ops),
                    "saved_tensors": len(workload.saved_tensors), "saved_bytes": workload.saved_bytes,
                    "ideal_step_time_s": workload.ideal_step_time_s})
        return 0
    print(f"wrote {args.out}: {len(workload.ops)} ops, {len(workload.saved_tensors)} saved tensors, "
          f"{format_bytes(workload.saved_bytes)} saved, ideal step {format_seconds(workload.ideal_step_time_s)}")
    return 0
