"""Figures (matplotlib, the optional ``plot`` extra): one step, a budget sweep, the reproduction.

Each ``build_*_figure`` returns a matplotlib Figure made without pyplot, so no global
backend or figure registry is touched; ``plot_*`` saves it (PNG, SVG or PDF by the
file's extension) and returns it. Figures are drawn by the Agg renderer.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from .._outputs import write_bytes_atomic
from ..errors import OutputPathError, ValidationError, require
from ..timeline import Timeline
from ..units import GiB, KiB, MiB, format_bytes, format_seconds

# One colour per event kind, shared by the Gantt chart and its legend (colour-blind-safe Okabe-Ito hues).
KIND_COLOR = {
    "forward": "#009E73", "backward": "#0072B2", "recompute": "#CC79A7",
    "stall_copy": "#D55E00", "stall_memory": "#E69F00",
    "copy_out": "#56B4E9", "copy_in": "#F0E442",
}
KIND_LABEL = {
    "forward": "forward", "backward": "backward", "recompute": "recompute",
    "stall_copy": "stall: waiting for a copy back", "stall_memory": "stall: waiting for memory",
    "copy_out": "copy to host (D2H)", "copy_in": "copy back (H2D)",
}
GANTT_ROWS = (("compute", "compute"), ("d2h", "D2H (to host)"), ("h2d", "H2D (to device)"))
POLICY_STYLE = ("o-", "s-", "^-", "D-", "v-", "P-", "X-", "*-")


def _figure_class():
    require("matplotlib", "plot", "drawing plots")
    from matplotlib.figure import Figure

    return Figure


def check_plot_target(path) -> None:
    """Fail early, before any long computation, if ``path`` cannot receive a plot."""
    _check_suffix(path)
    _figure_class()


def _check_suffix(path) -> None:
    if Path(path).suffix.lower() not in (".png", ".svg", ".pdf"):
        raise ValidationError(f"plot file {str(path)!r} must end in .png, .svg or .pdf: pick one of those")


def save_figure(figure, path) -> None:
    """Render in memory, then write through a temporary file: a failed write never leaves part of a plot."""
    _check_suffix(path)
    buffer = io.BytesIO()
    figure.savefig(buffer, format=Path(path).suffix.lower()[1:], dpi=150)
    try:
        write_bytes_atomic(path, buffer.getvalue())
    except OutputPathError as exc:
        raise OutputPathError(str(exc).replace("cannot write ", "cannot write plot ", 1)) from None


def byte_unit(max_bytes: float) -> tuple[str, float]:
    """The binary unit that keeps the axis numbers readable."""
    for name, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if max_bytes >= scale:
            return name, scale
    return "B", 1


# ---- one step ---------------------------------------------------------------------------------
def build_step_figure(timeline: Timeline, *, title: str | None = None):
    """Memory in use over the step against the budget, above a Gantt chart of the three streams."""
    Figure = _figure_class()
    fig = Figure(figsize=(11, 6.2), layout="constrained")
    ax_mem, ax_gantt = fig.subplots(2, 1, sharex=True, height_ratios=(2.2, 1))
    end_ms = timeline.step_time_s * 1e3
    top = max([b for _, b in timeline.memory] + [timeline.budget_bytes or 0, 1])
    unit, scale = byte_unit(top)

    samples = settled_memory(timeline.memory)
    times = [t * 1e3 for t, _ in samples] + [end_ms]
    values = [b / scale for _, b in samples]
    values.append(values[-1] if values else 0.0)
    ax_mem.step(times, values, where="post", color="#0072B2", linewidth=1.4,
                label=f"activations in use (peak {format_bytes(timeline.peak_memory_bytes)})")
    ax_mem.fill_between(times, values, step="post", color="#0072B2", alpha=0.15, linewidth=0)
    if timeline.budget_bytes is not None:
        ax_mem.axhline(timeline.budget_bytes / scale, color="#D55E00", linestyle="--", linewidth=1.4,
                       label=f"budget {format_bytes(timeline.budget_bytes)}")
    ax_mem.set_ylabel(f"activation memory ({unit})")
    ax_mem.set_ylim(0, top / scale * 1.08)
    ax_mem.legend(loc="upper right", fontsize="small")
    ax_mem.grid(True, alpha=0.3)
    ax_mem.set_title(title or (
        f"{timeline.workload_name} on {timeline.hardware_name}, policy {timeline.policy}: "
        f"step {format_seconds(timeline.step_time_s)}, {timeline.throughput_pct:.1f}% of ideal"
    ), fontsize="medium")

    _draw_gantt(ax_gantt, timeline)
    ax_gantt.set_xlabel("time (ms)")
    ax_gantt.set_xlim(0, end_ms if end_ms > 0 else 1)
    return fig


def settled_memory(samples: Sequence[tuple[float, int]]) -> list[tuple[float, int]]:
    """One sample per instant, the value once everything at that instant is done. The simulator
    frees before it allocates at an instant, so the dropped values are dips, never peaks."""
    settled: list[tuple[float, int]] = []
    for time_s, in_use in samples:
        if settled and settled[-1][0] == time_s:
            settled[-1] = (time_s, in_use)
        else:
            settled.append((time_s, in_use))
    return settled


def _draw_gantt(ax, timeline: Timeline) -> None:
    row_y = {stream: len(GANTT_ROWS) - 1 - i for i, (stream, _) in enumerate(GANTT_ROWS)}
    bars: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for e in timeline.events:
        bars.setdefault((e.stream, e.kind), []).append((e.start_s * 1e3, e.duration_s * 1e3))
    for (stream, kind), spans in sorted(bars.items(), key=lambda item: (row_y[item[0][0]], item[0][1])):
        ax.broken_barh(spans, (row_y[stream] - 0.38, 0.76), facecolors=KIND_COLOR[kind],
                       edgecolor="none", label=KIND_LABEL[kind], hatch="///" if kind.startswith("stall") else None)
    ax.set_yticks([row_y[s] for s, _ in GANTT_ROWS], [label for _, label in GANTT_ROWS])
    ax.set_ylim(-0.6, len(GANTT_ROWS) - 0.4)
    ax.grid(True, axis="x", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: list(KIND_LABEL.values()).index(labels[i]))
    ax.legend([handles[i] for i in order], [labels[i] for i in order], loc="upper left",
              bbox_to_anchor=(1.0, 1.0), fontsize="small", frameon=False)


def plot_step(timeline: Timeline, path, *, title: str | None = None):
    fig = build_step_figure(timeline, title=title)
    save_figure(fig, path)
    return fig


# ---- budget sweep -----------------------------------------------------------------------------
def build_sweep_figure(rows: Sequence[Mapping[str, Any]], *, title: str | None = None):
    """Throughput (% of ideal) against budget (% of the unconstrained peak), one line per policy,
    one panel per model (and hardware, when a sweep spans several). Infeasible points are left out."""
    Figure = _figure_class()
    rows = list(rows)
    if not rows:
        raise ValidationError("sweep has no rows to plot: run it with at least one budget and policy")
    panels = _unique(_panel_key(r) for r in rows)
    policies = _unique(str(r["policy"]) for r in rows)
    cols = min(len(panels), 3)
    n_rows = -(-len(panels) // cols)
    fig = Figure(figsize=(4.6 * cols + 1.8, 3.8 * n_rows), layout="constrained")
    axes = fig.subplots(n_rows, cols, squeeze=False, sharey=True)
    for ax, panel in zip(axes.flat, panels):
        for i, policy in enumerate(policies):
            points = sorted(
                (100 * float(r["budget_fraction"]), float(r["throughput_pct"]))
                for r in rows if _panel_key(r) == panel and str(r["policy"]) == policy
                and r.get("throughput_pct") is not None
            )
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, POLICY_STYLE[i % len(POLICY_STYLE)], color=f"C{i}", label=policy,
                        markersize=4, linewidth=1.3)
        ax.axhline(100, color="grey", linewidth=0.8, linestyle=":")
        ax.set_title(panel, fontsize="medium")
        ax.set_xlabel("activation budget (% of unconstrained peak)")
        ax.set_ylabel("throughput (% of ideal)")
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, title="policy", loc="outside right upper", fontsize="small")
    if title:
        fig.suptitle(title)
    return fig


def _panel_key(row: Mapping[str, Any]) -> str:
    model = str(row.get("model") or row.get("workload") or "workload")
    return f"{model} on {row['hardware']}" if row.get("hardware") else model


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def plot_sweep(rows: Sequence[Mapping[str, Any]], path, *, title: str | None = None):
    fig = build_sweep_figure(rows, title=title)
    save_figure(fig, path)
    return fig


# ---- reproduction -----------------------------------------------------------------------------
def build_reproduce_figure(result: Mapping[str, Any], *, policies: Sequence[str] | None = None,
                           title: str | None = None):
    """The paper's throughput next to ours, as grouped bars per model, the value on each bar.

    ``result`` is slackswap.experiments.reproduce.run_reproduce's dict; ``policies`` picks our
    bars (default: every policy in the rows but 'ideal', which is 100% by definition).
    """
    Figure = _figure_class()
    rows = list(result.get("rows", ()))
    if not rows:
        raise ValidationError("reproduce result has no rows to plot: run 'slackswap reproduce' first")
    models = [str(r["model"]) for r in rows]
    series = reproduce_series(rows, policies)
    fig = Figure(figsize=(max(7.0, 0.42 * len(series) * len(models) + 3.0), 4.8), layout="constrained")
    ax = fig.subplots()
    width = 0.84 / len(series)
    known = [v for _, values in series for v in values if v is not None]
    # Bars start above zero so that differences of a few percent stay visible.
    floor = max(0.0, 10.0 * (((min(known) if known else 100.0) - 5.0) // 10.0))
    for i, (label, values) in enumerate(series):
        xs = [m + (i - (len(series) - 1) / 2) * width for m in range(len(models))]
        heights = [v if v is not None else 0.0 for v in values]
        bars = ax.bar(xs, heights, width * 0.92, label=label, color=_series_color(label, i),
                      edgecolor="black" if label == "slackswap" else "none", linewidth=0.8)
        ax.bar_label(bars, labels=[f"{v:.1f}" if v is not None else "" for v in values],
                     fontsize=6 if len(series) > 4 else "x-small", padding=1.5, rotation=90 if len(series) > 4 else 0)
        for x, v in zip(xs, values):
            if v is None:
                ax.text(x, floor + 0.5, "n/a", ha="center", va="bottom", fontsize=6, rotation=90)
    ax.set_xticks(range(len(models)), models)
    ax.set_ylabel("throughput (% of ideal)")
    ax.set_xlabel("model")
    ax.set_ylim(floor, 106 if len(series) > 4 else 103)
    ax.axhline(100, color="grey", linewidth=0.8, linestyle=":")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small", frameon=False)
    budget = rows[0].get("budget_fraction")
    hardware = rows[0].get("hardware")
    details = ", ".join(x for x in (
        f"budget {100 * float(budget):.0f}% of each model's activation peak" if budget else "", hardware or "") if x)
    ax.set_title(title or ("SlackSwap paper vs this reproduction" + (f"\n{details}" if details else "")),
                 fontsize="medium")
    return fig


PAPER_LABEL = "paper (SlackSwap)"


def reproduce_series(rows: Sequence[Mapping[str, Any]],
                     policies: Sequence[str] | None = None) -> list[tuple[str, list[float | None]]]:
    """(legend label, one throughput per row) for the paper's figure and each of our policies."""
    if policies is None:
        policies = [p for p in _unique(p for r in rows for p in r.get("policies", {})) if p != "ideal"]
    series: list[tuple[str, list[float | None]]] = [(PAPER_LABEL, [_num(r.get("paper_pct")) for r in rows])]
    for policy in policies:
        series.append((policy, [_num(r.get("policies", {}).get(policy, {}).get("throughput_pct")) for r in rows]))
    return series


def _series_color(label: str, index: int) -> str:
    if label == PAPER_LABEL:
        return "#4d4d4d"
    if label == "slackswap":
        return "#D55E00"
    palette = ("#9ecae1", "#6baed6", "#3182bd", "#a1d99b", "#74c476", "#31a354", "#bcbddc", "#9e9ac8", "#fdd0a2")
    return palette[(index - 1) % len(palette)]


def _num(value: Any) -> float | None:
    return None if value is None else float(value)


def plot_reproduce(result: Mapping[str, Any], path, *, policies: Sequence[str] | None = None,
                   title: str | None = None):
    fig = build_reproduce_figure(result, policies=policies, title=title)
    save_figure(fig, path)
    return fig
