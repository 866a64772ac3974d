"""Why each saved tensor is kept, swapped or recomputed: a per-layer account of a simulated plan.

For every layer it gives the link slack left in that layer's share of the step and,
for every saved tensor, the two prices a planner weighs: re-running its producers
(recompute cost, microseconds per MiB) against moving it over the host link (copy
cost, microseconds per MiB one way). Slack is measured on the simulated Timeline:
the time the D2H link sat idle while the layer's forward ops ran, and the time the
H2D link sat idle while its backward (and recompute) ops ran.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ..hardware import Hardware
from ..plans import Action, Plan
from ..timeline import Event, Timeline
from ..units import MiB, format_bytes, format_seconds
from ..workload import Workload


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorExplanation:
    name: str
    layer: int
    producer: str | None
    size_bytes: int
    action: str
    recompute_us_per_mib: float | None
    """Forward time to rebuild the tensor (its producer and any transient inputs' producers) per MiB."""
    copy_us_per_mib: float
    """Host-to-device copy time per MiB (bandwidth plus one copy's fixed latency, spread over the tensor)."""
    arrival_margin_s: float | None
    """Swapped tensors: time between the copy back landing and the first op that reads it (its
    backward, or a recompute that takes it as input) starting; 0 when compute waited for it."""
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerExplanation:
    layer: int
    forward_time_s: float
    """Simulated time of the layer's forward ops."""
    backward_time_s: float
    """Simulated time of the layer's backward and recompute ops."""
    d2h_slack_s: float
    """Idle D2H link time while the layer's forward ops ran."""
    h2d_slack_s: float
    """Idle H2D link time while the layer's backward and recompute ops ran."""
    kept_bytes: int
    swapped_bytes: int
    recomputed_bytes: int
    tensors: tuple[TensorExplanation, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Explanation:
    workload: str
    hardware: str
    policy: str
    budget_bytes: int | None
    layers: tuple[LayerExplanation, ...]
    totals: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def explain(workload: Workload, hardware: Hardware, plan: Plan, timeline: Timeline) -> Explanation:
    """Explain ``plan`` on ``workload`` using the Timeline the simulator produced for it."""
    rebuild_s = rebuild_time_s(workload)
    ops_by_layer: dict[int, set[str]] = {}
    for op in workload.ops:
        ops_by_layer.setdefault(op.layer, set()).add(op.name)
    copy_in = {e.name: e for e in timeline.events if e.kind == "copy_in"}
    first_use = _first_use_after(workload, timeline, copy_in)
    slack = _layer_slack(timeline, ops_by_layer)
    tensors_by_layer: dict[int, list[TensorExplanation]] = {layer: [] for layer in ops_by_layer}
    for t in workload.saved_tensors:
        # A step input belongs to the layer of the first op that reads it.
        owner = t.producer or min(t.bwd_readers, key=workload.op_index.__getitem__)
        layer = workload.ops[workload.op_index[owner]].layer
        action = plan.actions[t.name]
        copy_us = copy_us_per_mib(hardware, t.size_bytes)
        recompute_us = None if t.producer is None else rebuild_s[t.name] * 1e6 * MiB / t.size_bytes
        margin = None
        if action is Action.SWAP and t.name in first_use:
            margin = max(0.0, first_use[t.name] - copy_in[t.name].end_s)
        reason = _reason(t.producer is None, action, recompute_us, copy_us, margin, slack[layer][0])
        tensors_by_layer[layer].append(TensorExplanation(
            name=t.name, layer=layer, producer=t.producer, size_bytes=t.size_bytes, action=action.value,
            recompute_us_per_mib=recompute_us, copy_us_per_mib=copy_us, arrival_margin_s=margin, reason=reason,
        ))
    layers = []
    for layer in sorted(ops_by_layer):
        tensors = tuple(tensors_by_layer[layer])
        d2h_idle, fwd_s, h2d_idle, bwd_s = slack[layer]
        layers.append(LayerExplanation(
            layer=layer, forward_time_s=fwd_s, backward_time_s=bwd_s, d2h_slack_s=d2h_idle, h2d_slack_s=h2d_idle,
            kept_bytes=sum(x.size_bytes for x in tensors if x.action == "keep"),
            swapped_bytes=sum(x.size_bytes for x in tensors if x.action == "swap"),
            recomputed_bytes=sum(x.size_bytes for x in tensors if x.action == "recompute"),
            tensors=tensors,
        ))
    return Explanation(
        workload=workload.name, hardware=hardware.name, policy=plan.policy, budget_bytes=timeline.budget_bytes,
        layers=tuple(layers), totals=_totals(workload, plan, timeline),
    )


def rebuild_time_s(workload: Workload) -> dict[str, float]:
    """Forward time to rebuild each saved tensor that has a producer."""
    from ..planners.common import facts_for  # the planners' own definition of what a rebuild re-runs

    return dict(facts_for(workload).rebuild_time_s)


def copy_us_per_mib(hardware: Hardware, size_bytes: int) -> float:
    """Microseconds per MiB to copy a tensor of ``size_bytes`` back to the device."""
    seconds = hardware.copy_latency_s + size_bytes / hardware.h2d_bytes_per_s
    return seconds * 1e6 * MiB / size_bytes


def _first_use_after(workload: Workload, timeline: Timeline, copy_in: dict[str, Event]) -> dict[str, float]:
    """Start of the first compute op that reads each copied-back tensor after it lands: a
    backward op that saved it, or a recompute op that takes it as input."""
    readers: dict[str, set[tuple[str, str]]] = {}
    for t in workload.saved_tensors:
        readers[t.name] = {("backward", r) for r in t.bwd_readers}
    for op in workload.ops:
        for name in op.inputs:
            if name in readers:
                readers[name].add(("recompute", op.name))
    result = {}
    for name, landed in copy_in.items():
        starts = [e.start_s for e in timeline.events
                  if (e.kind, e.name) in readers[name] and e.start_s >= landed.start_s]
        if starts:
            result[name] = min(starts)
    return result


def _layer_slack(timeline: Timeline, ops_by_layer: dict[int, set[str]]) -> dict[int, tuple[float, float, float, float]]:
    """(D2H idle, forward window, H2D idle, backward window) for each layer: the link's idle time
    while the layer's forward ops ran, and while its backward and recompute ops ran."""
    d2h = [e for e in timeline.events if e.stream == "d2h"]
    h2d = [e for e in timeline.events if e.stream == "h2d"]
    result = {}
    for layer, names in ops_by_layer.items():
        fwd = [e for e in timeline.events if e.kind == "forward" and e.name in names]
        bwd = [e for e in timeline.events if e.kind in ("backward", "recompute") and e.name in names]
        result[layer] = (_idle(fwd, d2h), math.fsum(e.duration_s for e in fwd),
                         _idle(bwd, h2d), math.fsum(e.duration_s for e in bwd))
    return result


def _idle(windows: list[Event], busy: list[Event]) -> float:
    total = 0.0
    for w in windows:
        used = math.fsum(max(0.0, min(w.end_s, b.end_s) - max(w.start_s, b.start_s)) for b in busy)
        total += max(0.0, w.duration_s - used)
    return total


def _reason(is_input: bool, action: Action, recompute_us: float | None, copy_us: float,
            margin_s: float | None, d2h_slack_s: float) -> str:
    if is_input:
        return "step input: on the device for the whole step"
    prices = f"re-run {recompute_us:.1f} us/MiB vs copy {copy_us:.1f} us/MiB"
    if action is Action.KEEP:
        return f"kept within the budget ({prices})"
    if action is Action.SWAP:
        if margin_s is None:
            return f"swapped ({prices})"
        if margin_s > 0:
            return f"swapped: back {format_seconds(margin_s)} before use ({prices})"
        return f"swapped: compute waited for its copy back ({prices})"
    if recompute_us < copy_us:
        return f"recomputed: cheaper to re-run than to copy ({prices})"
    return f"recomputed: the link had {format_seconds(d2h_slack_s)} slack left in this layer ({prices})"


def _totals(workload: Workload, plan: Plan, timeline: Timeline) -> dict[str, Any]:
    totals: dict[str, Any] = {}
    for action in Action:
        totals[f"{action.value}_count"] = plan.count(action)
        totals[f"{action.value}_bytes"] = plan.bytes_with(workload, action)
    totals.update(
        saved_bytes=workload.saved_bytes, peak_memory_bytes=timeline.peak_memory_bytes,
        step_time_s=timeline.step_time_s, ideal_step_time_s=timeline.ideal_step_time_s,
        throughput_pct=timeline.throughput_pct, recompute_time_s=timeline.recompute_time_s,
        d2h_bytes=timeline.d2h_bytes, h2d_bytes=timeline.h2d_bytes,
        stall_copy_s=timeline.stall_copy_s, stall_memory_s=timeline.stall_memory_s,
    )
    return totals


def explanation_lines(ex: Explanation) -> list[str]:
    """The explanation as text: a header, one block per layer, then the totals."""
    budget = "no budget" if ex.budget_bytes is None else f"budget {format_bytes(ex.budget_bytes)}"
    lines = [f"{ex.workload} on {ex.hardware}, policy {ex.policy}, {budget}", ""]
    for layer in ex.layers:
        if not layer.tensors:
            continue
        where = "layer -1 (before the first layer)" if layer.layer == -1 else f"layer {layer.layer}"
        lines.append(
            f"{where}: keep {format_bytes(layer.kept_bytes)}, swap {format_bytes(layer.swapped_bytes)}, "
            f"recompute {format_bytes(layer.recomputed_bytes)}; link slack left: D2H {format_seconds(layer.d2h_slack_s)} "
            f"of {format_seconds(layer.forward_time_s)} forward, H2D {format_seconds(layer.h2d_slack_s)} "
            f"of {format_seconds(layer.backward_time_s)} backward and recompute"
        )
        width = max(len(t.name) for t in layer.tensors)
        for t in layer.tensors:
            lines.append(f"  {t.name.ljust(width)}  {t.action:<9}  {format_bytes(t.size_bytes):>10}  {t.reason}")
    tot = ex.totals
    lines += [
        "",
        "totals: " + ", ".join(
            f"{a} {_tensors(tot[f'{a}_count'])} ({format_bytes(tot[f'{a}_bytes'])})" for a in ("keep", "swap", "recompute")
        ),
        f"step {format_seconds(tot['step_time_s'])} ({tot['throughput_pct']:.2f}% of ideal "
        f"{format_seconds(tot['ideal_step_time_s'])}); peak {format_bytes(tot['peak_memory_bytes'])}; "
        f"recompute {format_seconds(tot['recompute_time_s'])}; copied out {format_bytes(tot['d2h_bytes'])}; "
        f"stalls {format_seconds(tot['stall_copy_s'] + tot['stall_memory_s'])}",
    ]
    return lines


def _tensors(count: int) -> str:
    return f"{count} tensor" if count == 1 else f"{count} tensors"
