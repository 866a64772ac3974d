"""Timeline -> Chrome / Perfetto JSON trace (the "JSON Trace Event Format").

One process holds five tracks: compute, stalls, device-to-host copies, host-to-device
copies (one ``tid`` each, named by ``thread_name`` metadata), and two counter tracks
for the activation memory in use and the budget. Times are microseconds, as the
format requires; they are rounded to whole nanoseconds so that spans which touch in
the Timeline still touch (and never overlap) in the trace.
"""

from __future__ import annotations

import json
from typing import Any

from .._fields import write_text_atomic
from ..plans import Plan
from ..schedule import op_of_backward_step
from ..timeline import Timeline
from ..units import format_bytes
from ..workload import Workload

PID = 1
TRACKS = {  # tid: (name, events of these kinds)
    1: ("compute", ("forward", "backward", "recompute")),
    2: ("stalls (compute waiting)", ("stall_copy", "stall_memory")),
    3: ("device-to-host copies (D2H)", ("copy_out",)),
    4: ("host-to-device copies (H2D)", ("copy_in",)),
}
TID_OF_KIND = {kind: tid for tid, (_, kinds) in TRACKS.items() for kind in kinds}
MEMORY_COUNTER = "activation memory in use"
BUDGET_COUNTER = "activation budget"

# Reserved colour names of the Catapult trace viewer (chrome://tracing); Perfetto ignores
# them and colours by name, which is why recompute and stalls also get their own names.
COLOR = {
    "forward": "good",                        # green
    "backward": "rail_response",              # blue
    "recompute": "detailed_memory_dump",      # magenta
    "stall_copy": "terrible",                 # red
    "stall_memory": "bad",                    # dark orange
    "copy_out": "background_memory_dump",     # teal
    "copy_in": "olive",
}
_LABEL = {
    "forward": "{} forward",
    "backward": "{} backward",
    "recompute": "recompute {}",
    "stall_copy": "stall: {} waits for a copy back",
    "stall_memory": "stall: {} waits for memory",
    "copy_out": "{} to host",
    "copy_in": "{} back to device",
}


def to_ns(time_s: float) -> int:
    return round(time_s * 1e9)


def to_us(time_s: float) -> float:
    """Seconds to microseconds, rounded to the nanosecond (at most three decimals in JSON)."""
    return to_ns(time_s) / 1000


def event_label(kind: str, name: str) -> str:
    """The span name shown in the viewer for an event of ``kind`` on op or tensor ``name``."""
    return _LABEL[kind].format(name)


def build_chrome_trace(
    timeline: Timeline, *, workload: Workload | None = None, plan: Plan | None = None
) -> dict[str, Any]:
    """The trace as a JSON-ready dict. ``workload`` adds layers and op kinds to the spans'
    args; ``plan`` adds each tensor's action and the backward step a recompute serves."""
    title = f"slackswap: {timeline.workload_name} on {timeline.hardware_name}, policy {timeline.policy}"
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": PID, "tid": 0, "args": {"name": title}},
    ]
    for tid, (track, _) in TRACKS.items():
        events.append({"ph": "M", "name": "thread_name", "pid": PID, "tid": tid, "args": {"name": track}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": PID, "tid": tid, "args": {"sort_index": tid}})
    spans = [_span(e, workload, plan) for e in timeline.events]
    # Sorted by start, then longest first, so a viewer reading in order sees parents before children.
    spans.sort(key=lambda s: (s["tid"], s["ts"], -s["dur"]))
    events.extend(spans)
    for time_s, in_use in timeline.memory:
        events.append({"ph": "C", "name": MEMORY_COUNTER, "pid": PID, "tid": 0, "ts": to_us(time_s),
                       "args": {"bytes": in_use}})
    if timeline.budget_bytes is not None:
        for time_s in (0.0, timeline.step_time_s):
            events.append({"ph": "C", "name": BUDGET_COUNTER, "pid": PID, "tid": 0, "ts": to_us(time_s),
                           "args": {"bytes": timeline.budget_bytes}})
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {**{k: _jsonable(v) for k, v in timeline.summary().items()}, "time_unit": "us"},
    }


def write_chrome_trace(
    timeline: Timeline, path, *, workload: Workload | None = None, plan: Plan | None = None
) -> None:
    """Write the trace to ``path``; open it at ui.perfetto.dev or chrome://tracing."""
    trace = build_chrome_trace(timeline, workload=workload, plan=plan)
    write_text_atomic(path, json.dumps(trace, separators=(",", ":"), allow_nan=False) + "\n")


def _span(e, workload: Workload | None, plan: Plan | None) -> dict[str, Any]:
    start_ns, end_ns = to_ns(e.start_s), to_ns(e.end_s)
    is_copy = e.stream != "compute"
    args: dict[str, Any] = {"tensor" if is_copy else "op": e.name, "kind": e.kind,
                            "bytes": e.size_bytes, "size": format_bytes(e.size_bytes)}
    if e.step >= 0:
        args["backward_step"] = e.step
    if is_copy:
        args["action"] = "swap"
    elif e.kind.startswith("stall"):
        args["action"] = "wait"
    else:
        args["action"] = e.kind
    if workload is not None and not is_copy and e.name in workload.op_index:
        op = workload.ops[workload.op_index[e.name]]
        args["layer"] = op.layer
        args["op_kind"] = op.kind
        if e.kind == "recompute" and 0 <= e.step < len(workload.ops):
            args["for_backward_of"] = workload.ops[op_of_backward_step(len(workload.ops), e.step)].name
    if plan is not None and not is_copy and workload is not None and e.name in workload.op_index:
        op = workload.ops[workload.op_index[e.name]]
        saved = {t: plan.actions[t].value for t in op.outputs if t in plan.actions}
        if saved:
            args["saved_outputs"] = saved
    if plan is not None and is_copy and e.name in plan.prefetch_step:
        args["prefetch_step"] = plan.prefetch_step[e.name]
    return {
        "ph": "X", "name": event_label(e.kind, e.name), "cat": e.kind, "cname": COLOR[e.kind],
        "pid": PID, "tid": TID_OF_KIND[e.kind], "ts": start_ns / 1000, "dur": (end_ns - start_ns) / 1000,
        "args": args,
    }


def _jsonable(value: Any) -> Any:
    return None if isinstance(value, float) and value != value else value
