"""Chrome / Perfetto trace: structure checked against the trace-event format's rules,
and content checked event by event against the Timeline it came from."""

from __future__ import annotations

import json
import math
import numbers

import pytest

from slackswap.hardware import Hardware
from slackswap.plans import Action
from slackswap.report.chrome_trace import (
    BUDGET_COUNTER, MEMORY_COUNTER, TRACKS, build_chrome_trace, event_label, write_chrome_trace,
)
from slackswap.schedule import make_plan
from slackswap.sim import simulate, simulate_ideal
from slackswap.workloads.synthetic import chain

STREAM_TRACK = {"compute": "compute", "d2h": "device-to-host copies (D2H)", "h2d": "host-to-device copies (H2D)"}


def link(bytes_per_s: float, *, latency_s: float = 0.0, duplex: float = 1.0) -> Hardware:
    return Hardware(
        name="test-link", peak_flops_per_s=1e12, gemm_efficiency=1.0, attention_efficiency=1.0,
        hbm_bytes_per_s=1e12, hbm_efficiency=1.0, hbm_capacity_bytes=10**12,
        d2h_bytes_per_s=bytes_per_s, h2d_bytes_per_s=bytes_per_s, copy_latency_s=latency_s,
        duplex_h2d_factor=duplex,
    )


def hand_case():
    """chain(4), 1 s forward / 2 s backward, 100-byte tensors on a 100 B/s link: a0 swapped,
    a1 recomputed. The copy back of a0 is issued at step 1 (t = 6 s; set by hand, the default
    schedule would issue it a step earlier) and takes 1 s, so the recompute of op1 stalls 1 s
    waiting for it: step time 14 s."""
    w = chain(4)
    hw = link(100.0)
    plan = make_plan(w, {"a0": Action.SWAP, "a1": Action.RECOMPUTE}, policy="hand", budget_bytes=250, hardware=hw,
                     prefetch_step={"a0": 1})
    return w, plan, simulate(w, hw, plan)


def awkward_case():
    """Non-round times, a copy latency and a duplex slowdown: copies re-timed mid-flight."""
    n = 24
    w = chain(n, fwd_time_s=[1.3e-5 * (1 + i % 5) for i in range(n)], bwd_time_s=[2.7e-5 * (1 + i % 3) for i in range(n)],
              size_bytes=[1000 + 37 * i for i in range(n)])
    hw = link(7.3e7, latency_s=3e-6, duplex=0.5)
    actions = {f"a{i}": (Action.SWAP if i % 3 == 0 else Action.RECOMPUTE if i % 3 == 1 else Action.KEEP)
               for i in range(n - 1)}
    plan = make_plan(w, actions, policy="mixed", budget_bytes=None, hardware=hw)
    return w, plan, simulate(w, hw, plan, budget_bytes=simulate_ideal(w, hw).peak_memory_bytes)


# ---- the format's rules ---------------------------------------------------------------------
def check_trace_format(trace: dict) -> None:
    """Rules of the JSON Trace Event Format (object form) that Perfetto's importer relies on."""
    assert isinstance(trace, dict) and isinstance(trace["traceEvents"], list)
    assert trace.get("displayTimeUnit", "ms") in ("ms", "ns")
    named_threads = set()
    spans_by_track: dict[tuple, list] = {}
    for ev in trace["traceEvents"]:
        ph = ev["ph"]
        assert ph in ("X", "C", "M"), ev
        assert isinstance(ev["name"], str) and ev["name"]
        assert isinstance(ev["pid"], int) and isinstance(ev["tid"], int)
        if ph == "M":
            assert ev["name"] in ("process_name", "thread_name", "thread_sort_index", "process_sort_index")
            key = "sort_index" if ev["name"].endswith("sort_index") else "name"
            assert key in ev["args"]
            if ev["name"] == "thread_name":
                named_threads.add((ev["pid"], ev["tid"]))
            continue
        ts = ev["ts"]
        assert isinstance(ts, numbers.Real) and not isinstance(ts, bool) and math.isfinite(ts) and ts >= 0
        if ph == "X":
            dur = ev["dur"]
            assert isinstance(dur, numbers.Real) and not isinstance(dur, bool) and math.isfinite(dur) and dur >= 0
            assert isinstance(ev.get("cat", ""), str) and isinstance(ev.get("args", {}), dict)
            spans_by_track.setdefault((ev["pid"], ev["tid"]), []).append(ev)
        else:  # counter: every series value is a number
            assert ev["args"] and all(
                isinstance(v, numbers.Real) and not isinstance(v, bool) for v in ev["args"].values()
            )
    for track, spans in spans_by_track.items():
        assert track in named_threads, f"track {track} has no thread_name"
        # On one track, complete events must not partly overlap: each either ends before the
        # next starts or contains it entirely. Compare in integer nanoseconds.
        open_ends: list[int] = []
        for ev in sorted(spans, key=lambda e: (e["ts"], -e["dur"])):
            start, end = round(ev["ts"] * 1000), round((ev["ts"] + ev["dur"]) * 1000)
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1], f"{ev['name']} overlaps its neighbour on {track}"
            open_ends.append(end)


def test_format_checker_rejects_partly_overlapping_spans():
    trace = {"traceEvents": [
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "t"}},
        {"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0, "dur": 2},
        {"ph": "X", "name": "b", "pid": 1, "tid": 1, "ts": 1, "dur": 2},
    ]}
    with pytest.raises(AssertionError, match="overlaps"):
        check_trace_format(trace)
    trace["traceEvents"][2]["dur"] = 1  # now nested inside a: allowed
    check_trace_format(trace)


# ---- content ----------------------------------------------------------------------------------
def track_names(trace) -> dict[int, str]:
    return {ev["tid"]: ev["args"]["name"] for ev in trace["traceEvents"] if ev["ph"] == "M" and ev["name"] == "thread_name"}


def spans(trace) -> list[dict]:
    return [ev for ev in trace["traceEvents"] if ev["ph"] == "X"]


def counter(trace, name) -> list[tuple[float, int]]:
    return [(ev["ts"], ev["args"]["bytes"]) for ev in trace["traceEvents"] if ev["ph"] == "C" and ev["name"] == name]


@pytest.mark.parametrize("case", [hand_case, awkward_case])
def test_trace_matches_timeline_event_by_event(case):
    workload, plan, timeline = case()
    trace = json.loads(json.dumps(build_chrome_trace(timeline, workload=workload, plan=plan)))
    check_trace_format(trace)
    names = track_names(trace)
    assert set(names.values()) >= set(STREAM_TRACK.values())
    remaining = spans(trace)
    assert len(remaining) == len(timeline.events)
    for e in timeline.events:
        match = [s for s in remaining if s["name"] == event_label(e.kind, e.name)
                 and abs(s["ts"] - e.start_s * 1e6) <= 1e-3 and abs(s["dur"] - e.duration_s * 1e6) <= 2e-3]
        assert len(match) == 1, e
        span = match[0]
        remaining.remove(span)
        expected_track = "stalls (compute waiting)" if e.kind.startswith("stall") else STREAM_TRACK[e.stream]
        assert names[span["tid"]] == expected_track
        assert e.name in span["name"] and span["cat"] == e.kind
        assert span["args"]["bytes"] == e.size_bytes
        assert span["args"]["tensor" if e.stream != "compute" else "op"] == e.name
        assert span["args"]["action"] == {"d2h": "swap", "h2d": "swap"}.get(e.stream, "wait" if "stall" in e.kind else e.kind)
    # spans are emitted in time order within each track
    for tid in names:
        starts = [s["ts"] for s in spans(trace) if s["tid"] == tid]
        assert starts == sorted(starts)
    # the memory counter is the Timeline's memory samples, in order, in microseconds
    memory = counter(trace, MEMORY_COUNTER)
    assert [b for _, b in memory] == [b for _, b in timeline.memory]
    assert all(abs(ts - t * 1e6) <= 1e-3 for (ts, _), (t, _) in zip(memory, timeline.memory))


def test_hand_case_spans_and_colours():
    workload, plan, timeline = hand_case()
    assert timeline.step_time_s == 14.0
    trace = build_chrome_trace(timeline, workload=workload, plan=plan)
    by_name = {s["name"]: s for s in spans(trace)}
    names = track_names(trace)
    stall = by_name["stall: op1 waits for a copy back"]
    assert (stall["ts"], stall["dur"], names[stall["tid"]]) == (6e6, 1e6, "stalls (compute waiting)")
    recompute = by_name["recompute op1"]
    assert (recompute["ts"], recompute["dur"], recompute["cat"]) == (7e6, 1e6, "recompute")
    assert recompute["args"]["for_backward_of"] == "op2" and recompute["args"]["saved_outputs"] == {"a1": "recompute"}
    forward = by_name["op1 forward"]
    assert recompute["cname"] != forward["cname"] and recompute["cat"] != forward["cat"]
    assert by_name["op0 forward"]["args"]["saved_outputs"] == {"a0": "swap"}
    copy_out, copy_in = by_name["a0 to host"], by_name["a0 back to device"]
    assert names[copy_out["tid"]] == "device-to-host copies (D2H)" and (copy_out["ts"], copy_out["dur"]) == (1e6, 1e6)
    assert names[copy_in["tid"]] == "host-to-device copies (H2D)" and copy_in["args"]["prefetch_step"] == 1
    assert counter(trace, BUDGET_COUNTER) == [(0.0, 250), (14e6, 250)]


def test_unlimited_budget_has_no_budget_counter_and_plain_args_without_workload():
    w = chain(3)
    timeline = simulate_ideal(w, link(100.0))
    trace = build_chrome_trace(timeline)
    check_trace_format(trace)
    assert counter(trace, BUDGET_COUNTER) == []
    assert len(counter(trace, MEMORY_COUNTER)) == len(timeline.memory)
    assert all("layer" not in s["args"] and "saved_outputs" not in s["args"] for s in spans(trace))


def test_write_chrome_trace_is_strict_json_and_deterministic(tmp_path):
    workload, plan, timeline = awkward_case()
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    write_chrome_trace(timeline, first, workload=workload, plan=plan)
    write_chrome_trace(timeline, second, workload=workload, plan=plan)
    assert first.read_bytes() == second.read_bytes()
    data = json.loads(first.read_text(), parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    check_trace_format(data)
    assert data["otherData"]["step_time_s"] == timeline.step_time_s
    kinds = {s["cat"] for s in spans(data)}
    assert kinds == {"forward", "backward", "recompute", "copy_out", "copy_in", "stall_copy"}
    assert len({s["tid"] for s in spans(data)}) == len(TRACKS)


# ---- the CLI ------------------------------------------------------------------------------------
def test_simulate_trace_flag_writes_the_plan_trace(tmp_path, capsys):
    from slackswap.cli import main
    from slackswap.timeline import Timeline

    workload, plan, _ = hand_case()
    workload.save(tmp_path / "w.json")
    plan.save(tmp_path / "p.json", workload)
    link(100.0).save(tmp_path / "hw.json")
    code = main(["simulate", "--workload", str(tmp_path / "w.json"), "--hardware", str(tmp_path / "hw.json"),
                 "--plan", str(tmp_path / "p.json"), "--trace", str(tmp_path / "t.json"),
                 "--timeline", str(tmp_path / "timeline.json"), "--quiet"])
    assert code == 0 and capsys.readouterr() == ("", "")
    trace = json.loads((tmp_path / "t.json").read_text())
    check_trace_format(trace)
    timeline = Timeline.load(tmp_path / "timeline.json")
    assert [b for _, b in counter(trace, MEMORY_COUNTER)] == [b for _, b in timeline.memory]
    assert {s["name"] for s in spans(trace)} >= {"recompute op1", "a0 to host", "stall: op1 waits for a copy back"}
