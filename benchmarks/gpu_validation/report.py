"""The results of gpu_validate: one JSON object, rendered as a Markdown page; both rewritten
atomically after every section, so a run cut short still leaves what it measured."""

from __future__ import annotations

import json
import os
from pathlib import Path

from slackswap.units import GB, format_bytes, format_seconds

RESULTS_FORMAT = "slackswap.gpu-validation/1"

# (ratio name, measured key, predicted key): ratio = measured / predicted.
RATIOS = (
    ("step_time", "step_time_s", "step_time_s"),
    ("activation_peak", "step_peak_bytes", "activation_peak_bytes"),
    ("held_peak", "manager_peak_saved_bytes", "activation_peak_bytes"),
    ("allocated_peak", "max_allocated_bytes", "allocated_peak_bytes"),
    ("reserved_peak", "max_reserved_bytes", "reserved_peak_bytes"),
    ("d2h_bytes", "d2h_bytes", "d2h_bytes"),
    ("h2d_bytes", "h2d_bytes", "h2d_bytes"),
)


def ratios(measured: dict | None, predicted: dict | None) -> dict:
    out = {}
    for name, m_key, p_key in RATIOS:
        m = (measured or {}).get(m_key)
        p = (predicted or {}).get(p_key)
        out[name] = m / p if m is not None and p else None
    return out


def summarize(rows: list[dict]) -> dict:
    """Per path (runtime, compiled): over the plan rows that ran, the range of each ratio, and how
    many gave gradients bit-identical to plain training's with deterministic algorithms."""
    out = {}
    for path in ("runtime", "compiled"):
        ran = [r for r in rows if r["group"] == "plan" and r["method"] == path and r["status"] == "ok"]
        entry = {"configurations": len([r for r in rows if r["group"] == "plan" and r["method"] == path]),
                 "ran": len(ran),
                 "bit_identical": sum(bool(r["measured"].get("grads_bit_identical_deterministic")) for r in ran),
                 "late_prefetches_per_step": sum(r["measured"].get("late_prefetches") or 0 for r in ran)}
        for name, _, _ in RATIOS:
            values = [r["ratios"][name] for r in ran if r["ratios"].get(name) is not None]
            entry[name] = {"min": min(values), "max": max(values)} if values else None
        out[path] = entry
    return out


def results_paths(out_dir: Path, slug: str) -> dict[str, Path]:
    return {"markdown": out_dir / f"gpu-{slug}.md", "json": out_dir / f"gpu-{slug}.json",
            "hardware": out_dir / f"{slug}-measured.json"}


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_results(results: dict, out_dir: Path) -> None:
    paths = results_paths(out_dir, results["device"]["slug"])
    write_atomic(paths["json"], json.dumps(results, indent=1) + "\n")
    write_atomic(paths["markdown"], render_markdown(results))


# ---- formatting: every number with its unit, n/a where a figure does not exist -------------------
def b(x) -> str:
    return "n/a" if x is None else format_bytes(x)


def s(x) -> str:
    return "n/a" if x is None else format_seconds(x)


def rate(x) -> str:
    return "n/a" if x is None else f"{x / GB:.2f} GB/s"


def flops(x) -> str:
    if x is None:
        return "n/a"
    return f"{x / 1e12:.1f} TFLOP/s" if x >= 1e11 else f"{x / 1e9:.2f} GFLOP/s"


def ratio(x) -> str:
    return "n/a" if x is None else f"{x:.3f}x"


def pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f} %"


def count(x) -> str:
    return "n/a" if x is None else f"{x:g} per step"


def diff(x) -> str:
    return "n/a" if x is None else f"{x:.3g} (abs)"


def yes_no(x) -> str:
    return "n/a" if x is None else ("yes" if x else "no")


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


def _link_section(r: dict) -> list[str]:
    link, hw = r["link"], r["hardware"]
    pinned = "pinned" if r["device"]["pinned_host_memory"] else "pageable (no pinned memory on this device)"
    out = ["## 1. The host link and the device", "",
           f"Host buffers: {pinned}. Each figure is the median of the timed repeats; small sizes are timed as "
           "back-to-back batches of copies, divided by the batch.", ""]
    out += table(["copy size", "H2D per copy", "H2D rate", "D2H per copy", "D2H rate"],
                 [[b(x["size_bytes"]), s(x["h2d_s_per_copy"]), rate(x["h2d_bytes_per_s"]), s(x["d2h_s_per_copy"]),
                   rate(x["d2h_bytes_per_s"])] for x in link["sizes"]])
    d = link["duplex"]
    out += ["", f"Both directions at once ({b(d['size_bytes'])} copies; each direction timed while the other "
            "runs three times as many copies on another stream):", ""]
    out += table(["direction", "alone", "while the other direction copies", "duplex factor"],
                 [[name, rate(d[f"{key}_alone_bytes_per_s"]), rate(d[f"{key}_with_{other}_bytes_per_s"]),
                   ratio(d[f"{key}_factor"])] for name, key, other in (("H2D", "h2d", "d2h"), ("D2H", "d2h", "h2d"))])
    out += ["", f"Per-copy latency (smallest copy's time minus its bytes at the largest copy's rate, mean of "
            f"both directions): {s(link['copy_latency_s'])}.", ""]
    c = r["compute"]
    out += [f"Compute (peaks: {c['peak_source']}):", ""]
    out += table(["bf16 GEMM (batch x m x k x n)", "time", "achieved", "of peak"],
                 [[f"{g['label']} ({g['batch']}x{g['m']}x{g['k']}x{g['n']})", s(g["time_s"]),
                   flops(g["flops_per_s"]), pct(g["flops_per_s"] / c["peak_flops_per_s"])]
                  for g in c["gemms"]])
    a = c["attention"]
    out += ["", f"GEMMs together (FLOP-weighted): {flops(c['gemm_flops_per_s'])}, "
            f"{pct(c['gemm_efficiency'])} of {flops(c['peak_flops_per_s'])}. "
            f"Causal SDPA ({a['batch']}x{a['heads']} heads, {a['seq_len']} tokens, head dim {a['head_dim']}): "
            f"forward {s(a['fwd_time_s'])}, backward {s(a['bwd_time_s'])}, {flops(a['flops_per_s'])}, "
            f"{pct(a['efficiency'])} of peak. Device copy: {rate(c['hbm_bytes_per_s'])} read+write, "
            f"{pct(c['hbm_efficiency'])} of {rate(c['peak_hbm_bytes_per_s'])}.", ""]
    out += [f"Written as `{hw['file']}` (slackswap.hardware/1; `slackswap simulate --hardware {hw['file']} ...`):", ""]
    out += table(["field", "value"], [
        ["peak_flops_per_s", flops(hw["peak_flops_per_s"])],
        ["gemm_efficiency", pct(hw["gemm_efficiency"])], ["attention_efficiency", pct(hw["attention_efficiency"])],
        ["hbm_bytes_per_s", rate(hw["hbm_bytes_per_s"])], ["hbm_efficiency", pct(hw["hbm_efficiency"])],
        ["hbm_capacity_bytes", b(hw["hbm_capacity_bytes"])],
        ["h2d_bytes_per_s", rate(hw["h2d_bytes_per_s"])], ["d2h_bytes_per_s", rate(hw["d2h_bytes_per_s"])],
        ["copy_latency_s", s(hw["copy_latency_s"])],
        ["duplex_h2d_factor", ratio(hw["duplex_h2d_factor"])], ["duplex_d2h_factor", ratio(hw["duplex_d2h_factor"])],
    ])
    return out + [""]


def _row_status(row: dict) -> str:
    return row["status"] + (f": {row['note']}" if row.get("note") else "")


def _step_section(r: dict) -> list[str]:
    m, p = r["model"], r.get("profile") or {}
    rows = r["rows"]
    out = ["## 2. Training steps against the simulator's prediction", "",
           f"Model: {m['description']}, {m['parameters']:,} parameters, {m['dtype']}, micro-batch {m['micro_batch']} "
           f"({m['micro_batch_rule']}). A step is forward, loss and backward (no optimizer step); "
           f"median of {r['config']['steps']} timed step(s) after {r['config']['warmup']} warm-up step(s); every "
           "step starts from the same parameters and RNG seed.", ""]
    if p:
        out += [f"Profile: {p['ops']} forward ops, {p['saved_tensors']} saved tensors, {b(p['saved_bytes'])} saved, "
                f"measured in {s(p['profile_time_s'])}; op times as planned: {p.get('times', 'measured')}. Simulated with "
                f"`{r['hardware']['file']}`: ideal step "
                f"{s(p['simulated_ideal_step_time_s'])}, activation peak {b(p['simulated_ideal_peak_bytes'])}.", ""]
    out += ["Step time (measured: device time from the step's first to its last kernel, CUDA events on a GPU; "
            "host: Python time to issue the step):", ""]
    out += table(["configuration", "status", "measured", "simulated", "measured / simulated", "host time",
                  "host / device", "planning time"],
                 [[x["name"], _row_status(x), s(_get(x, "measured", "step_time_s")),
                   s(_get(x, "predicted", "step_time_s")), ratio(x["ratios"].get("step_time")),
                   s(_get(x, "measured", "host_time_s")), ratio(_get(x, "measured", "host_per_device")),
                   s(x.get("planning_time_s"))] for x in rows])
    out += ["", "Memory (step peak: torch.cuda.max_memory_allocated during the step minus what was allocated before "
            "it, against the simulated activation peak; held by the runtime: the saved bytes the runtime's swap "
            "manager held on the device at most, by its own count; allocated and reserved: absolute peaks against the "
            "simulator's allocated/reserved predictions where it makes them):", ""]
    out += table(["configuration", "budget", "activation peak predicted", "held by the runtime", "ratio",
                  "step peak", "ratio", "max allocated", "allocated predicted", "ratio", "max reserved",
                  "reserved predicted",
                  "ratio"],
                 [[x["name"], b(x.get("budget_bytes")), b(_get(x, "predicted", "activation_peak_bytes")),
                   b(_get(x, "measured", "manager_peak_saved_bytes")), ratio(x["ratios"].get("held_peak")),
                   b(_get(x, "measured", "step_peak_bytes")), ratio(x["ratios"].get("activation_peak")),
                   b(_get(x, "measured", "max_allocated_bytes")),
                   b(_get(x, "predicted", "allocated_peak_bytes")), ratio(x["ratios"].get("allocated_peak")),
                   b(_get(x, "measured", "max_reserved_bytes")), b(_get(x, "predicted", "reserved_peak_bytes")),
                   ratio(x["ratios"].get("reserved_peak"))] for x in rows])
    out += ["", "Copies and gradients (per step; gradients against plain training's with the same seed and batch):",
            ""]
    out += table(["configuration", "D2H measured", "D2H simulated", "H2D measured", "H2D simulated",
                  "late prefetches", "max abs grad difference", "bit-identical (deterministic)"],
                 [[x["name"], b(_get(x, "measured", "d2h_bytes")), b(_get(x, "predicted", "d2h_bytes")),
                   b(_get(x, "measured", "h2d_bytes")), b(_get(x, "predicted", "h2d_bytes")),
                   count(_get(x, "measured", "late_prefetches")), diff(_get(x, "measured", "grad_max_abs_diff")),
                   yes_no(_get(x, "measured", "grads_bit_identical_deterministic"))] for x in rows])
    return out + [""]


def _peer_section(r: dict) -> list[str]:
    rows = [x for x in r["rows"] if x["group"] in ("reference", "peer")]
    plain = next((_get(x, "measured", "step_time_s") for x in rows if x["group"] == "reference"), None)
    out = ["## 3. Peers in the same run", "",
           "Same model, batch and seed; the figures are also in the tables above.", ""]
    out += table(["method", "status", "step time", "vs plain", "step peak", "max allocated", "max reserved"],
                 [[x["name"], _row_status(x), s(_get(x, "measured", "step_time_s")),
                   ratio(_get(x, "measured", "step_time_s") / plain if plain and _get(x, "measured", "step_time_s")
                         else None),
                   b(_get(x, "measured", "step_peak_bytes")), b(_get(x, "measured", "max_allocated_bytes")),
                   b(_get(x, "measured", "max_reserved_bytes"))] for x in rows])
    return out + [""]


def _summary_section(r: dict) -> list[str]:
    plain = next((x for x in r["rows"] if x["group"] == "reference"), None)
    out = ["## Summary", "",
           "Measured / simulated over the plans that ran (min-max); plain training on its own line.", ""]
    label = {"step_time": "step time", "activation_peak": "step peak / activation peak",
             "held_peak": "held by the runtime / activation peak", "allocated_peak": "max allocated / predicted",
             "reserved_peak": "max reserved / predicted", "d2h_bytes": "D2H bytes", "h2d_bytes": "H2D bytes"}
    rows = []
    for name, _, _ in RATIOS:
        cells = [label[name], ratio((plain or {}).get("ratios", {}).get(name))]
        for path in ("runtime", "compiled"):
            span = r["summary"][path][name]
            cells.append("n/a" if span is None else f"{ratio(span['min'])} - {ratio(span['max'])}")
        rows.append(cells)
    out += table(["quantity", "plain training", "plans, runtime", "plans, compiled"], rows)
    for path in ("runtime", "compiled"):
        e = r["summary"][path]
        out += ["", f"{path}: {e['ran']} of {e['configurations']} configurations ran; {e['bit_identical']} of "
                f"{e['ran']} with gradients bit-identical to plain training's (deterministic algorithms); "
                f"{e['late_prefetches_per_step']:g} late prefetches per step in all."]
    return out + [""]


def _get(row: dict, part: str, key: str):
    return (row.get(part) or {}).get(key)


def render_markdown(r: dict) -> str:
    d = r["device"]
    out = [f"# GPU validation: {d['name']}", ""]
    if r["dry_run"]:
        out += ["**Dry run** on a tiny configuration: these numbers check the script's logic, not the hardware.", ""]
    out += [f"`benchmarks/gpu_validate.py` ({' '.join(r['argv']) or 'defaults'}), started {r['started_utc']}, "
            f"torch {d['torch']}" + (f", CUDA {d['cuda']}" if d.get("cuda") else "")
            + f"; wall time {s(r.get('wall_time_s'))}. Machine-readable: `gpu-{d['slug']}.json`.", ""]
    if r.get("summary"):
        out += _summary_section(r)
    if r.get("link") and r.get("compute") and r.get("hardware"):
        out += _link_section(r)
    if r.get("model"):
        out += _step_section(r) + _peer_section(r)
    if r.get("notes"):
        out += ["## Notes", ""] + [f"- {n}" for n in r["notes"]] + [""]
    return "\n".join(out)
