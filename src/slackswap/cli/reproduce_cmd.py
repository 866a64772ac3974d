"""`slackswap reproduce`: the SlackSwap paper's table, ours beside it and every baseline."""

from __future__ import annotations


from ..experiments.reproduce import run_reproduce
from ..report.console import progress_reporter
from ..units import format_bytes, format_seconds
from .common import check_output_paths, print_json


def register(subparsers) -> None:
    parser = subparsers.add_parser("reproduce", help="the SlackSwap paper's table on the built-in models")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quiet", action="store_true", help="print nothing but errors")
    parser.add_argument("--no-sensitivity", dest="sensitivity", action="store_false",
                        help="skip the sensitivity runs (attention kernel, GEMM efficiency, duplex)")
    parser.add_argument("--node", metavar="NAME",
                        help="also run the paper's policies on one rank of this node preset (see docs/hardware.md), "
                        "one model per GPU and under t=8 with sequence parallelism")
    parser.add_argument("--plot", metavar="FILE",
                        help="also draw the paper's figures against ours as grouped bars (.png, .svg or .pdf; extra 'plot')")
    parser.add_argument("--report", metavar="DIR",
                        help="also write DIR/index.html (self-contained: tables, figures, parametrization) "
                        "and a Chrome trace per model beside it")
    parser.set_defaults(func=run)


def run(args) -> int:
    check_output_paths(args.plot)
    if args.node is not None:
        from ..nodes import get_node

        get_node(args.node)
    if args.plot:
        from ..report.plots import check_plot_target

        check_plot_target(args.plot)
    if args.report:
        from ..report.html_report import check_report_dir

        check_report_dir(args.report)
    with progress_reporter("reproduce", quiet=args.quiet) as report:
        stages = iter(range(1_000_000))
        progress = lambda text: report(next(stages), None, text)  # noqa: E731 - a counter with a label
        result = run_reproduce(sensitivity=args.sensitivity, node=args.node, progress=progress)
    if args.plot:
        from ..report.plots import plot_reproduce

        plot_reproduce(result, args.plot)
    if args.report:
        from ..report.html_report import write_report
        from ..report.steps import reproduce_steps

        with progress_reporter("report", quiet=args.quiet) as report:
            stages = iter(range(1_000_000))
            timelines, workloads, plans = reproduce_steps(
                result, progress=lambda text: report(next(stages), None, text))
        write_report(args.report, result, timelines=timelines, workloads=workloads, plans=plans)
    if args.quiet:
        return 0
    if args.json:
        print_json(result)
    else:
        print_tables(result)
    return 0


def _pct(value) -> str:
    return "   n/a" if value is None else f"{value:6.2f}%"


def row_header_lines(row: dict) -> list[str]:
    c = row["config"]
    return [
        f"{row['model']}: L={c['layers']} h={c['hidden']} heads={c['heads']} ffn={c['ffn']} seq={c['seq_len']} "
        f"micro-batch={c['micro_batch']} attention={c['attention']} mlp={c['mlp']} on {row['hardware']}",
        f"  budget {format_bytes(row['budget_bytes'])} = {100 * row['budget_fraction']:.0f}% of the unconstrained "
        f"peak {format_bytes(row['unconstrained_peak_bytes'])} (minimum reachable "
        f"{format_bytes(row['minimum_budget_bytes'])}); ideal step {format_seconds(row['ideal_step_time_s'])}",
    ]


POLICY_HEADERS = ("policy", "throughput (% of ideal)", "peak memory", "step time", "note")


def policy_rows(row: dict) -> list[tuple[str, str, str, str, str]]:
    rows = []
    for name, r in row["policies"].items():
        if not r["fits"]:
            rows.append((name, "n/a", "n/a", "n/a", "cannot reach this budget"))
            continue
        note = ""
        if "milp_objective_s" in r:
            note = (f"MILP objective {format_seconds(r['milp_objective_s'])} over ideal (dual bound "
                    f"{format_seconds(r.get('milp_dual_bound_s', r['milp_objective_s']))}), predicted step "
                    f"{format_seconds(r['milp_predicted_step_time_s'])}, simulated {format_seconds(r['step_time_s'])}, "
                    f"solved in {format_seconds(r['milp_solve_time_s'])}")
            if r.get("source") == "slackswap":
                note += "; the plan is slackswap's, which simulates faster than the MILP's"
        rows.append((name, f"{r['throughput_pct']:.2f}%", format_bytes(r["peak_memory_bytes"]),
                     format_seconds(r["step_time_s"]), note))
    return rows


def policy_lines(row: dict) -> list[str]:
    from ..report.console import plain_table

    table = policy_rows(row)
    text = plain_table(POLICY_HEADERS, table, [False, True, True, True, False], None)
    return ["  " + line for line in text.rstrip("\n").split("\n")]


def comparison_line(row: dict) -> str:
    ours = row["policies"].get("slackswap", {}).get("throughput_pct")
    diff = row.get("difference_pts")
    diff_text = "n/a" if diff is None else f"{diff:+.2f} points"
    return f"  paper {_pct(row['paper_pct'])}  ours (slackswap) {_pct(ours)}  difference {diff_text}"


def sensitivity_lines(entries: list[dict]) -> list[str]:
    if not entries:
        return []
    lines = ["", "sensitivity of slackswap (throughput, % of ideal, at the same budget fraction):"]
    for e in entries:
        lines.append(f"  {e['model']:<11} {e['variant']:<40} {_pct(e['throughput_pct'])}  "
                     f"(paper {_pct(e['paper_pct'])})")
    return lines


def print_tables(result: dict) -> None:
    """Like table_lines, with each model's policy table through render_table (rich on a terminal)."""
    from ..report.console import render_table

    for row in result["rows"]:
        print("\n".join(row_header_lines(row)))
        render_table(POLICY_HEADERS, policy_rows(row))
        print(comparison_line(row))
        if row.get("explanation"):
            print(f"  why: {row['explanation']}")
        print()
    print("\n".join(sensitivity_lines(result.get("sensitivity", [])) + node_lines(result.get("node", []))
                    + ["", f"parametrization: {result['parametrization']['why']}"]))


def node_lines(entries: list[dict]) -> list[str]:
    if not entries:
        return []
    first = entries[0]
    lines = ["", f"on one rank of {first['node']} (copies at {first['copy_bytes_per_s'] / 1e9:.1f} GB/s each way, "
             "all ranks in lockstep), throughput % of ideal at the same budget fraction:"]
    for e in entries:
        if "skipped" in e:
            lines.append(f"  {e['model']:<11} {e['layout']:<30} skipped: {e['skipped']}")
            continue
        cells = ", ".join(f"{name} {_pct(r['throughput_pct']).strip()}" for name, r in e["policies"].items())
        lines.append(f"  {e['model']:<11} {e['layout']:<30} {cells}")
    return lines


def table_lines(result: dict) -> list[str]:
    lines: list[str] = []
    for row in result["rows"]:
        lines += row_header_lines(row) + policy_lines(row) + [comparison_line(row)]
        if row.get("explanation"):
            lines.append(f"  why: {row['explanation']}")
        lines.append("")
    lines += sensitivity_lines(result.get("sensitivity", [])) + node_lines(result.get("node", []))
    lines += ["", f"parametrization: {result['parametrization']['why']}"]
    return lines
