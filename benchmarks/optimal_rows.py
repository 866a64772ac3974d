"""Re-measure only `optimal`'s rows of benchmarks/results/planners.md: its table against `slackswap`
and its column in the per-model tables (0.3, 0.5, 0.7), leaving every other figure as it was.

Run: .venv/bin/python benchmarks/optimal_rows.py [--out benchmarks/results/planners.md] [--models M ...]
The full benchmark (bench_planners.py) takes far longer; this is for a change to `optimal` alone.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import bench_planners
from slackswap._fields import write_text_atomic
from slackswap.workloads.models import MODELS


def replace_rows(text: str, details: list[dict], note: str) -> str:
    lines = text.split("\n")
    start = lines.index(bench_planners.OPTIMAL_HEADING)
    end = lines.index("## optimal repeats exactly")
    lines[start:end] = [*bench_planners.optimal_section(details), "", note, ""]
    by_cell = {(d["model"], f"{d['fraction']:.2f}"): d for d in details}
    model = None
    for i, line in enumerate(lines):
        if line.startswith("## ") and line.endswith(": throughput (% of ideal) by budget fraction"):
            model = line[3:].split(":")[0]
        elif model and line.startswith("| 0."):
            cells = line.split(" | ")
            d = by_cell.get((model, cells[0][2:]))
            if d is not None:
                cells[-1] = f"{d['simulated_pct']:.2f} |"
                lines[i] = " | ".join(cells)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/planners.md")
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--note", default="", help="appended to the note under the table (say how loaded the machine was)")
    args = parser.parse_args()
    bench_planners.MODELS = args.models
    details = bench_planners.optimal_details()
    note = ("These rows were re-measured alone by `benchmarks/optimal_rows.py` after `optimal` began returning "
            "`slackswap`'s plan where it simulates faster" + (f" ({args.note})" if args.note else "")
            + "; the rest of this file is from the run above.")
    out = Path(args.out)
    write_text_atomic(out, replace_rows(out.read_text(), details, note))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
