"""One self-contained HTML page for a reproduction: tables, sensitivity, figures, parametrization.

Everything the page shows is inside ``index.html``: CSS in a <style> element and figures
as base64 PNG data URIs, so it opens from a file, offline, and can be mailed as one
attachment. The Chrome traces of the simulated steps are written beside it and linked
by relative file name.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

from .._outputs import make_output_directory, output_target, write_text_atomic
from ..errors import MissingExtraError, OutputPathError, ValidationError
from ..plans import Plan
from ..timeline import Timeline
from ..units import format_bytes, format_seconds
from ..workload import Workload
from .chrome_trace import write_chrome_trace

CSS = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 72em;
       padding: 0 1.5em; color: #1d1d1f; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { margin-top: 2em; border-bottom: 1px solid #ddd; }
h3 { margin-top: 1.4em; } .note { color: #555; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em; font-variant-numeric: tabular-nums; }
th, td { padding: 0.3em 0.8em; border-bottom: 1px solid #e4e4e4; text-align: left; vertical-align: top; }
th { background: #f4f4f6; } td.num { text-align: right; }
figure { margin: 1em 0 2em; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9em; } code { font-size: 0.9em; }
"""
_NUMBER = re.compile(r"^[-+]?\d")


def write_report(
    directory,
    reproduce_result: Mapping[str, Any],
    *,
    timelines: Mapping[str, Timeline] | None = None,
    workloads: Mapping[str, Workload] | None = None,
    plans: Mapping[str, Plan] | None = None,
    sweep_rows: Sequence[Mapping[str, Any]] | None = None,
    title: str = "slackswap: reproduction of the SlackSwap results",
) -> Path:
    """Write ``directory/index.html`` and one ``trace-<label>.json`` per timeline; return the page's path.

    ``timelines`` maps a label (such as 'gpt2-xl slackswap 50%') to a simulated step;
    ``workloads`` and ``plans``, keyed the same way, enrich the traces. Without matplotlib
    the page is still written, with a note where the figures would be.
    """
    out = Path(directory)
    check_report_dir(out)
    make_output_directory(out)
    timelines = dict(timelines or {})
    workloads, plans = dict(workloads or {}), dict(plans or {})
    trace_files = {}
    for label, timeline in timelines.items():
        name = f"trace-{slug(label)}.json"
        if name in trace_files.values():
            raise ValidationError(f"two timelines map to the trace file {name!r}: give them distinct labels")
        write_chrome_trace(timeline, out / name, workload=workloads.get(label), plan=plans.get(label))
        trace_files[label] = name
    page = render_page(reproduce_result, timelines, trace_files, sweep_rows, title)
    path = out / "index.html"
    write_text_atomic(path, page)
    return path


def check_report_dir(directory) -> None:
    """Fail before any long computation if ``directory`` cannot hold the report."""
    out = Path(directory)
    if out.exists() and not out.is_dir():
        raise OutputPathError(f"report directory {str(out)!r} is a file: give a directory path")
    existing = out
    while not existing.exists():  # the nearest ancestor that exists must be a writable directory
        existing = existing.parent
    if not existing.is_dir():
        raise OutputPathError(f"cannot create report directory {str(out)!r}: {str(existing)!r} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutputPathError(f"cannot create report directory {str(out)!r}: {str(existing)!r} is not writable")
    output_target(out / "index.html")  # a directory or special file there would fail only at the end


def slug(label: str) -> str:
    text = re.sub(r"[^A-Za-z0-9.]+", "-", label).strip("-").lower()
    return text or "step"


def render_page(result, timelines, trace_files, sweep_rows, title) -> str:
    parts = [f"<h1>{_e(title)}</h1>"]
    summary = {k: v for k, v in result.items() if k not in ("rows", "sensitivity", "parametrization")
               and not isinstance(v, (dict, list))}
    if summary:
        parts.append(render_value(summary))
    parts.append("<h2>Results</h2>")
    parts.append(render_results(result.get("rows", [])))
    parts.append(_figure(lambda: _reproduce_png(result), "The paper's throughput and ours, per model."))
    if sweep_rows:
        parts.append("<h2>Budget sweep</h2>")
        parts.append(_figure(lambda: _sweep_png(sweep_rows), "Throughput against the activation budget, per policy."))
    if "sensitivity" in result:
        parts.append("<h2>Sensitivity</h2>")
        parts.append(render_value(result["sensitivity"]))
    if timelines:
        parts.append("<h2>Simulated steps</h2>")
        parts.append('<p class="note">Each trace file opens in the Perfetto UI or in Chrome\'s built-in trace '
                     "viewer: one track per stream, plus stalls and the memory counter.</p>")
        for label, timeline in timelines.items():
            parts.append(f"<h3>{_e(label)}</h3>")
            parts.append(render_value(_step_summary(timeline)))
            parts.append(f'<p>Trace: <a href="{_e(trace_files[label])}" download>{_e(trace_files[label])}</a></p>')
            parts.append(_figure(lambda t=timeline: _step_png(t), "Activation memory against the budget, "
                                 "and what each stream did (time in ms)."))
    if "parametrization" in result:
        parts.append("<h2>Parametrization</h2>")
        parts.append(render_value(result["parametrization"]))
    body = "\n".join(parts)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>{_e(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


def render_results(rows: Sequence[Mapping[str, Any]]) -> str:
    """The reproduce rows: the paper against slackswap, every policy per model, and the explanations.
    Rows without per-policy results are shown as a plain table."""
    if not rows or not all(isinstance(r.get("policies"), Mapping) for r in rows):
        return render_value(list(rows))
    main = [{
        "model": r.get("model"), "paper_pct": r.get("paper_pct"),
        "slackswap_pct": r["policies"].get("slackswap", {}).get("throughput_pct"),
        "difference_pts": r.get("difference_pts"), "budget_bytes": r.get("budget_bytes"),
        "unconstrained_peak_bytes": r.get("unconstrained_peak_bytes"),
        "minimum_budget_bytes": r.get("minimum_budget_bytes"), "ideal_step_time_s": r.get("ideal_step_time_s"),
    } for r in rows]
    parts = [render_value(main)]
    policies = list(dict.fromkeys(p for r in rows for p in r["policies"]))
    head = "".join(f"<th>{_e(p)}</th>" for p in policies)
    body = []
    for r in rows:
        cells = []
        for p in policies:
            res = r["policies"].get(p)
            if res is None:
                cells.append("<td>-</td>")
            elif res.get("throughput_pct") is None:
                cells.append(f'<td title="{_e(str(res.get("note", "")))}">does not fit</td>')
            else:
                cells.append(_td("throughput_pct", res["throughput_pct"]))
        body.append(f"<tr><th>{_e(str(r.get('model')))}</th>{''.join(cells)}</tr>")
    parts.append("<h3>Throughput of every policy (% of ideal)</h3>")
    parts.append(f"<table><thead><tr><th>model</th>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")
    notes = [(r.get("model"), r.get("explanation")) for r in rows if r.get("explanation")]
    if notes:
        parts.append("<h3>Where we differ from the paper</h3>")
        parts.append("<ul>" + "".join(f"<li><b>{_e(str(m))}</b>: {_e(str(text))}</li>" for m, text in notes) + "</ul>")
    return "\n".join(parts)


def _step_summary(t: Timeline) -> dict[str, Any]:
    return {
        "workload": t.workload_name, "hardware": t.hardware_name, "policy": t.policy,
        "budget_bytes": t.budget_bytes, "step_time_s": t.step_time_s, "throughput_pct": t.throughput_pct,
        "peak_memory_bytes": t.peak_memory_bytes, "recompute_time_s": t.recompute_time_s,
        "d2h_bytes": t.d2h_bytes, "stall_time_s": t.stall_time_s,
    }


# ---- values to HTML ---------------------------------------------------------------------------
def format_cell(key: str, value: Any) -> str:
    """A value as text, with the unit its key names (…_bytes, …_s, …_pct, …_pts, …fraction, …_per_s)."""
    if value is None:
        return "-"
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "; ".join(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    if key.endswith("bytes_per_s"):
        return f"{value / 1e9:.1f} GB/s"  # decimal, as vendors quote bandwidth
    if key.endswith("flops_per_s"):
        return f"{value / 1e12:.1f} TFLOP/s"
    if key.endswith("_bytes"):
        return format_bytes(value)
    if key.endswith("_pts"):
        return f"{value:+.2f} pts"
    if key.endswith("_s") and not key.endswith("_per_s"):
        return format_seconds(value)
    if key.endswith("_pct"):
        return f"{value:.2f}%"
    if key.endswith("fraction"):
        return f"{100 * value:.0f}%"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def render_value(value: Any, key: str = "", depth: int = 0) -> str:
    """Lists of records as tables, mappings as key/value tables (nested ones as sections)."""
    if isinstance(value, Mapping):
        if depth < 2 and value and all(isinstance(v, (Mapping, list)) for v in value.values()):
            tag = "h3" if depth == 0 else "h4"
            return "\n".join(f"<{tag}>{_e(str(k))}</{tag}>\n{render_value(v, str(k), depth + 1)}" for k, v in value.items())
        rows = "".join(
            f"<tr><th>{_e(str(k))}</th>{_td(str(k), v)}</tr>" for k, v in value.items()
        )
        return f"<table>{rows}</table>"
    if isinstance(value, list):
        if not value:
            return '<p class="note">(none)</p>'
        if all(isinstance(v, Mapping) for v in value):
            columns = list(dict.fromkeys(k for v in value for k in v))
            head = "".join(f"<th>{_e(str(c))}</th>" for c in columns)
            body = "".join("<tr>" + "".join(_td(str(c), v.get(c)) for c in columns) + "</tr>" for v in value)
            return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        return f"<p>{_e(', '.join(format_cell(key, v) for v in value))}</p>"
    return f"<p>{_e(format_cell(key, value))}</p>"


def _td(key: str, value: Any) -> str:
    if isinstance(value, Mapping) and value:
        return f"<td>{render_value(value, key, depth=2)}</td>"
    text = format_cell(key, value)
    css = ' class="num"' if isinstance(value, (int, float)) and not isinstance(value, bool) and _NUMBER.match(text) else ""
    return f"<td{css}>{_e(text)}</td>"


def _e(text: str) -> str:
    return html.escape(text, quote=True)


# ---- figures ----------------------------------------------------------------------------------
def _figure(make_png, caption: str) -> str:
    try:
        png = make_png()
    except MissingExtraError as exc:
        return f'<p class="note">Figure left out: {_e(str(exc))}.</p>'
    except ValidationError as exc:  # nothing to draw (for example no paper figures in the rows)
        return f'<p class="note">Figure left out: {_e(str(exc))}.</p>'
    data = base64.b64encode(png).decode("ascii")
    return (f'<figure><img alt="{_e(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{_e(caption)}</figcaption></figure>")


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    # No software stamp: the same inputs give the same bytes.
    figure.savefig(buffer, format="png", dpi=110, metadata={"Software": None})
    return buffer.getvalue()


def _reproduce_png(result) -> bytes:
    from .plots import build_reproduce_figure

    return _png(build_reproduce_figure(result))


def _sweep_png(rows) -> bytes:
    from .plots import build_sweep_figure

    return _png(build_sweep_figure(rows))


def _step_png(timeline) -> bytes:
    from .plots import build_step_figure

    return _png(build_step_figure(timeline))
