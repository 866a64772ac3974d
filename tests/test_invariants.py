"""Invariants of planning and simulation over random workloads, hardware and budgets.

Workloads are random DAG-ish steps: ops with one or two outputs, inputs from any earlier
tensor, transient (unsaved) tensors, tensors read by several backward ops, and saved
tensors read only by their producer's backward (an activation's output). Hardware varies
the link bandwidths (from a link far slower than compute to one far faster), both duplex
factors and the copy latency. For every policy (`optimal`, a MILP, on tiny instances only):

- the simulated memory never exceeds the budget, and ends at the step inputs;
- every saved tensor its backward reads is on the device when the backward op runs, shown
  by the Timeline events: kept, copied back (after its copy out) before the op starts, or
  re-created by a recompute of its producer earlier in the backward pass;
- the step time is at least the ideal step time, at least the compute stream's busy time,
  and at least the summed copy time on each link, whose copies never overlap;
- more bandwidth or more budget never makes the `slackswap` plan slower;
- the same input gives the same bytes out, also across processes with other hash seeds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from brute_force import best_step_time_s

from slackswap.errors import BudgetError
from slackswap.hardware import Hardware
from slackswap.planners import PLANNERS, minimum_budget_bytes, plan_workload
from slackswap.plans import Action, Plan
from slackswap.sim import simulate, simulate_ideal
from slackswap.timeline import Timeline
from slackswap.workload import Op, Tensor, Workload

# SLACKSWAP_FUZZ=explore draws new random cases on every run; by default the cases are the
# same on every run (CI must not flake) and the counts appear in the terminal summary.
DERANDOMIZE = os.environ.get("SLACKSWAP_FUZZ") != "explore"
# SLACKSWAP_FUZZ_EXAMPLES raises the example count for a local hunt (e.g. 500); CI keeps 120.
EXAMPLES = int(os.environ.get("SLACKSWAP_FUZZ_EXAMPLES", "120"))
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, derandomize=DERANDOMIZE, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# A failing monotonicity case is reported as drawn: shrinking re-plans hundreds of times (minutes).
NO_SHRINK = settings(PROPERTY, phases=(Phase.explicit, Phase.reuse, Phase.generate))
TINY = settings(max_examples=8, deadline=None, derandomize=DERANDOMIZE, database=None,
                suppress_health_check=[HealthCheck.too_slow])
EXACT_POLICIES = ("optimal",)  # MILPs: tiny instances only
REL = 1e-9  # float slack for sums taken in a different order


# ---- random cases ------------------------------------------------------------------------------

@st.composite
def workloads(draw, max_ops: int = 7) -> Workload:
    n = draw(st.integers(2, max_ops))
    tensors: dict[str, dict] = {"x": {"size": draw(st.integers(1, 60)), "producer": None, "readers": []}}
    available = ["x"]
    consumers: dict[str, list[str]] = {"x": []}
    ops = []
    for i in range(n):
        name = f"op{i}"
        k = draw(st.integers(1, min(2, len(available))))
        # mostly the latest tensors, sometimes an old one (a skip connection)
        inputs = list(dict.fromkeys(draw(st.lists(st.sampled_from(available[-3:] + available[:1]),
                                                  min_size=k, max_size=k))))
        outputs = [f"t{i}"] + ([f"u{i}"] if draw(st.integers(0, 3)) == 0 else [])
        for t in inputs:
            consumers[t].append(name)
        for t in outputs:
            tensors[t] = {"size": draw(st.integers(1, 500)), "producer": name, "readers": []}
            consumers[t] = []
        available.extend(outputs)
        ops.append(Op(name=name, layer=i, kind=draw(st.sampled_from(["gemm", "elementwise", "attention", "norm"])),
                      fwd_time_s=draw(st.sampled_from([0.0, 0.05, 0.5, 1.0, 3.0])),
                      bwd_time_s=draw(st.sampled_from([0.0, 0.1, 1.0, 2.0, 6.0])),
                      flops=0.0, bytes_accessed=0.0, inputs=tuple(inputs), outputs=tuple(outputs)))
    for t, info in tensors.items():
        # backward readers: ops that read it in forward, and its producer (an activation saves its output)
        could = consumers[t] + ([info["producer"]] if info["producer"] else [])
        if could and draw(st.integers(0, 4)) > 0:  # about one tensor in five is transient
            info["readers"] = sorted(set(draw(st.lists(st.sampled_from(could), min_size=1, max_size=3))),
                                     key=lambda o: int(o[2:]))
    return Workload(
        name="random", ops=tuple(ops),
        tensors=tuple(Tensor(name=t, size_bytes=i["size"], producer=i["producer"], bwd_readers=tuple(i["readers"]))
                      for t, i in tensors.items()),
    )


@st.composite
def hardware(draw) -> Hardware:
    # Sizes are 1-500 B and ops 0-6 s: 20 B/s makes a copy cost several ops, 1e5 B/s next to nothing.
    return Hardware(
        name="random", peak_flops_per_s=1e12, gemm_efficiency=0.6, attention_efficiency=0.5,
        hbm_bytes_per_s=1e12, hbm_efficiency=0.8, hbm_capacity_bytes=10**12,
        d2h_bytes_per_s=draw(st.sampled_from([20.0, 100.0, 400.0, 1e5])),
        h2d_bytes_per_s=draw(st.sampled_from([20.0, 100.0, 400.0, 1e5])),
        copy_latency_s=draw(st.sampled_from([0.0, 0.01, 0.3])),
        duplex_h2d_factor=draw(st.sampled_from([0.3, 0.5, 1.0])),
        duplex_d2h_factor=draw(st.sampled_from([0.5, 1.0])),
    )


def budget_between(workload: Workload, hw: Hardware, where: float) -> tuple[int, int, int]:
    """(budget, minimum, unconstrained peak) with the budget ``where`` of the way from minimum to peak."""
    minimum = minimum_budget_bytes(workload)
    peak = simulate_ideal(workload, hw).peak_memory_bytes
    # a workload may save nothing (minimum 0); budgets are positive
    return max(1, minimum + int(where * (peak - minimum))), minimum, peak


budget_points = st.sampled_from([0.0, 0.1, 0.3, 0.5, 0.8, 1.0]) | st.floats(0, 1)


# ---- what must hold of any plan and its timeline -----------------------------------------------

def check_timeline(workload: Workload, hw: Hardware, plan: Plan, t: Timeline, budget: int | None) -> None:
    saved_inputs = sum(x.size_bytes for x in workload.saved_tensors if x.producer is None)
    # memory: never over the budget, the peak is the trace's maximum, everything but inputs freed
    values = [b for _, b in t.memory]
    assert t.peak_memory_bytes == max(values)
    if budget is not None:
        assert t.peak_memory_bytes <= budget, (t.peak_memory_bytes, budget)
    assert min(values) >= 0 and values[-1] == saved_inputs
    assert all(a[0] <= b[0] for a, b in zip(t.memory, t.memory[1:])), "memory trace goes back in time"

    by_stream: dict[str, list] = {"compute": [], "d2h": [], "h2d": []}
    copied_back = {e.name for e in t.events if e.kind == "copy_in"}
    for e in t.events:
        assert 0 <= e.start_s <= e.end_s, e
        # the step ends with its last compute task; only the copy out of a cancelled swap (never
        # copied back, docs/simulator.md) may still be running then
        if not (e.kind == "copy_out" and e.name not in copied_back):
            assert e.end_s <= t.step_time_s * (1 + REL) + 1e-12, e
        by_stream[e.stream].append(e)
    # one thing at a time on each stream
    for stream, events in by_stream.items():
        events = sorted(events, key=lambda e: (e.start_s, e.end_s))
        for a, b in zip(events, events[1:]):
            assert a.end_s <= b.start_s * (1 + REL) + 1e-12, (stream, a, b)
    # step time bounds
    compute_busy = sum(e.duration_s for e in by_stream["compute"] if e.kind in ("forward", "backward", "recompute"))
    assert t.step_time_s >= t.ideal_step_time_s * (1 - REL)
    assert t.step_time_s >= compute_busy * (1 - REL)
    for stream in ("d2h", "h2d"):
        ended = [e for e in by_stream[stream] if e.end_s <= t.step_time_s * (1 + REL) + 1e-12]
        assert t.step_time_s >= sum(e.duration_s for e in ended) * (1 - REL)
    # each copy takes at least its bytes at the full (never faster) rate, plus its latency unless
    # it started as the previous copy of its direction ended (its launch overlapped that copy)
    for stream, rate in (("d2h", hw.d2h_bytes_per_s), ("h2d", hw.h2d_bytes_per_s)):
        ends = {e.end_s for e in by_stream[stream]}
        for e in by_stream[stream]:
            latency = 0.0 if e.start_s in ends else hw.copy_latency_s
            assert e.duration_s >= (latency + e.size_bytes / rate) * (1 - 1e-6)
    # Each swapped tensor is copied out at most once and back at most once; a copy back moves
    # what its copy out moved. The bytes are those of the copies: a swap cancelled before its
    # copy out began moves nothing, and a skipped copy back (tensor still on the device) neither.
    swapped = {n for n, a in plan.actions.items() if a is Action.SWAP}
    outs = [e.name for e in by_stream["d2h"]]
    ins = [e.name for e in by_stream["h2d"]]
    assert len(outs) == len(set(outs)) and len(ins) == len(set(ins)) and set(ins) <= set(outs) <= swapped
    assert t.d2h_bytes == sum(e.size_bytes for e in by_stream["d2h"])
    assert t.h2d_bytes == sum(e.size_bytes for e in by_stream["h2d"]) <= t.d2h_bytes
    assert all(e.size_bytes == workload.tensor_by_name[e.name].size_bytes for e in t.events if e.stream != "compute")
    recomputes = [e for e in by_stream["compute"] if e.kind == "recompute"]
    assert abs(t.recompute_time_s - sum(e.duration_s for e in recomputes)) <= 1e-9 * (1 + t.step_time_s)
    # every op runs forward once and backward once, in order
    fwd = [e.name for e in sorted(by_stream["compute"], key=lambda e: e.start_s) if e.kind == "forward"]
    bwd = [e.name for e in sorted(by_stream["compute"], key=lambda e: e.start_s) if e.kind == "backward"]
    names = [op.name for op in workload.ops]
    assert fwd == names and bwd == names[::-1]
    check_presence(workload, plan, t)


def check_presence(workload: Workload, plan: Plan, t: Timeline) -> None:
    """Every saved tensor a backward op reads is on the device when that op starts."""
    copy_out = {e.name: e for e in t.events if e.kind == "copy_out"}
    copy_in = {e.name: e for e in t.events if e.kind == "copy_in"}
    recomputed_at: dict[str, list] = {}
    for e in t.events:
        if e.kind == "recompute":
            recomputed_at.setdefault(e.name, []).append(e)
    forward_end = max(e.end_s for e in t.events if e.kind == "forward")
    for e in t.events:
        if e.kind != "backward":
            continue
        for name in workload.bwd_reads[e.name]:
            tensor = workload.tensor_by_name[name]
            action = plan.actions[name]
            if tensor.producer is None or action is Action.KEEP:
                assert action is Action.KEEP
                continue
            if action is Action.SWAP:
                back, out = copy_in.get(name), copy_out.get(name)
                if back is None:
                    # the copy back was skipped: either a group rebuilt the tensor before this
                    # step, or its copy out had not ended when backward began (cancelled swap)
                    rebuilt = [r for r in recomputed_at.get(tensor.producer, ()) if r.step <= e.step]
                    cancelled = out is None or out.end_s > forward_end * (1 - REL)
                    assert rebuilt or cancelled, f"{name}: copy back skipped, yet neither rebuilt nor cancelled"
                    continue
                assert out is not None, f"{name} copied back but never out"
                assert out.end_s <= back.start_s, f"{name} copied back before its copy out ended"
                assert back.end_s <= e.start_s, f"backward of {e.name} started before {name} was back"
                assert back.start_s >= forward_end * (1 - REL) - 1e-12 or back.step >= 0
                continue
            rebuilt = [r for r in recomputed_at.get(tensor.producer, ()) if r.end_s <= e.start_s and r.step <= e.step]
            assert rebuilt, f"backward of {e.name} reads {name} (recompute) but {tensor.producer} was not re-run before"


def plan_or_refusal(workload, hw, budget, policy) -> Plan | None:
    try:
        return plan_workload(workload, hw, budget, policy)
    except BudgetError as exc:
        # only policies with a fixed shape may refuse a budget at or above the minimum
        assert policy not in ("ideal", "swap-only", "slackswap"), f"{policy} refused {budget} B: {exc}"
        assert "\n" not in str(exc)
        return None


# ---- the properties ------------------------------------------------------------------------------

@PROPERTY
@given(workload=workloads(), hw=hardware(), where=budget_points)
def test_every_policy_keeps_every_invariant(generated_cases, workload, hw, where):
    budget, minimum, peak = budget_between(workload, hw, where)
    generated_cases["invariants: random workload x hardware x budget"] += 1
    for policy in PLANNERS:
        if policy in EXACT_POLICIES:
            continue
        plan = plan_or_refusal(workload, hw, budget, policy)
        if plan is None:
            continue
        generated_cases[f"invariants: plans checked ({policy})"] += 1
        limit = None if policy == "ideal" else budget
        timeline = simulate(workload, hw, plan, limit)
        check_timeline(workload, hw, plan, timeline, limit)


@TINY
@given(workload=workloads(max_ops=4), hw=hardware(), where=budget_points)
def test_exact_policies_on_tiny_instances(generated_cases, workload, hw, where):
    pytest.importorskip("scipy")  # the 'milp' extra; the test extra installs it
    budget, _, _ = budget_between(workload, hw, where)
    for policy in EXACT_POLICIES:
        plan = plan_or_refusal(workload, hw, budget, policy)
        generated_cases[f"invariants: tiny instances ({policy})"] += 1
        if plan is not None:
            check_timeline(workload, hw, plan, simulate(workload, hw, plan, budget), budget)


def slackswap_step_s(workload, hw, budget) -> float:
    plan = plan_workload(workload, hw, budget, "slackswap")
    return simulate(workload, hw, plan, budget).step_time_s


@NO_SHRINK
@given(workload=workloads(), hw=hardware(), where=budget_points, factor=st.sampled_from([1.5, 2.0, 10.0]),
       which=st.sampled_from(["d2h", "h2d", "both"]))
def test_more_bandwidth_never_slows_slackswap(generated_cases, workload, hw, where, factor, which):
    budget, _, _ = budget_between(workload, hw, where)
    faster = hw.replace(
        d2h_bytes_per_s=hw.d2h_bytes_per_s * (factor if which in ("d2h", "both") else 1),
        h2d_bytes_per_s=hw.h2d_bytes_per_s * (factor if which in ("h2d", "both") else 1),
    )
    generated_cases["monotone: slackswap with more bandwidth"] += 1
    slow, fast = slackswap_step_s(workload, hw, budget), slackswap_step_s(workload, faster, budget)
    assert fast <= slow * (1 + REL), f"{which} x{factor}: {fast} s > {slow} s at budget {budget} B"


@NO_SHRINK
@given(workload=workloads(), hw=hardware(), where=budget_points, more=st.floats(0.01, 1.0))
def test_more_budget_never_slows_slackswap(generated_cases, workload, hw, where, more):
    budget, _, peak = budget_between(workload, hw, where)
    larger = budget + max(1, int(more * (peak - budget)))
    generated_cases["monotone: slackswap with more budget"] += 1
    tight, loose = slackswap_step_s(workload, hw, budget), slackswap_step_s(workload, hw, larger)
    assert loose <= tight * (1 + REL), f"{larger} B: {loose} s > {budget} B: {tight} s"


@PROPERTY
@given(workload=workloads(), hw=hardware(), where=budget_points)
def test_same_input_same_bytes(generated_cases, workload, hw, where):
    """Plans and timelines serialized twice, from two separate planning runs, are identical."""
    budget, _, _ = budget_between(workload, hw, where)
    generated_cases["determinism: in one process"] += 1
    copy = Workload.from_dict(json.loads(workload.to_json()))  # fresh object, no cached state shared
    for policy in PLANNERS:
        if policy in EXACT_POLICIES:
            continue
        try:
            a = plan_workload(workload, hw, budget, policy)
        except BudgetError:
            continue
        b = plan_workload(copy, hw, budget, policy)
        assert a.to_json(workload) == b.to_json(copy)
        limit = None if policy == "ideal" else budget
        ta, tb = simulate(workload, hw, a, limit), simulate(copy, hw, b, limit)
        assert json.dumps(ta.to_dict()) == json.dumps(tb.to_dict())


DIGEST_SCRIPT = textwrap.dedent("""
    import hashlib, json, random
    from slackswap.hardware import PRESETS
    from slackswap.planners import PLANNERS, minimum_budget_bytes, plan_workload
    from slackswap.sim import simulate, simulate_ideal
    from slackswap.workloads.models import build_model_workload
    from slackswap.errors import BudgetError

    out = hashlib.sha256()
    hw = PRESETS["a100-80gb-pcie4"]
    for name in ("bert-large", "gpt2-xl", "llama-7b"):
        w = build_model_workload(name, hw, layers=2)
        peak = simulate_ideal(w, hw).peak_memory_bytes
        low = minimum_budget_bytes(w)
        for where in (0.1, 0.5, 0.9):
            budget = low + int(where * (peak - low))
            for policy in PLANNERS:
                if policy == "optimal":
                    continue
                try:
                    plan = plan_workload(w, hw, budget, policy)
                except BudgetError as exc:
                    out.update(str(exc).encode())
                    continue
                out.update(plan.to_json(w).encode())
                limit = None if policy == "ideal" else budget
                out.update(json.dumps(simulate(w, hw, plan, limit).to_dict()).encode())
    print(out.hexdigest())
""")


def test_same_bytes_across_processes_and_hash_seeds(generated_cases):
    """Set iteration order changes with PYTHONHASHSEED; plans and timelines must not."""
    digests = set()
    for seed in ("1", "2", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        result = subprocess.run([sys.executable, "-c", DIGEST_SCRIPT], capture_output=True, text=True, env=env,
                                timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        digests.add(result.stdout.strip())
        generated_cases["determinism: processes with other hash seeds"] += 1
    assert len(digests) == 1, digests


# ---- counterexamples found by the properties above, pinned (reported to the lead) ---------------

def _workload(ops, tensors) -> Workload:
    return Workload(
        name="counterexample",
        ops=tuple(Op(name=n, layer=i, kind="gemm", fwd_time_s=f, bwd_time_s=b, flops=0.0, bytes_accessed=0.0,
                     inputs=tuple(a), outputs=tuple(o)) for i, (n, a, o, f, b) in enumerate(ops)),
        tensors=tuple(Tensor(name=n, size_bytes=s, producer=p, bwd_readers=tuple(r)) for n, s, p, r in tensors),
    )


def _slow_link(rate: float) -> Hardware:
    return Hardware(name="slow-link", peak_flops_per_s=1e12, gemm_efficiency=0.6, attention_efficiency=0.5,
                    hbm_bytes_per_s=1e12, hbm_efficiency=0.8, hbm_capacity_bytes=10**12, d2h_bytes_per_s=rate,
                    h2d_bytes_per_s=rate, copy_latency_s=0.0, duplex_h2d_factor=1.0, duplex_d2h_factor=0.5)


def test_slackswap_counterexample_more_bandwidth_is_slower():
    """Found by test_more_bandwidth_never_slows_slackswap (ideal step 19.8 s, minimum 607 B, peak 1628 B).

    At 200 B/s the value family swaps t0 (its copy fits its window) and stalls 0.825 s for memory
    while the copy runs; recomputing t1 (0.05 s) instead is what 20 B/s finds. Fixed by rule 1: the
    recompute-only start, the same plan on every link, bounds the result."""
    w = _workload(
        [("op0", ["x"], ["t0", "u0"], 3.0, 2.0), ("op1", ["x"], ["t1"], 0.05, 0.0), ("op2", ["x"], ["t2"], 0.0, 6.0),
         ("op3", ["t2"], ["t3", "u3"], 0.05, 1.0), ("op4", ["t2"], ["t4"], 1.0, 0.1),
         ("op5", ["t4", "x"], ["t5"], 0.0, 6.0), ("op6", ["t5"], ["t6"], 0.5, 0.1)],
        [("x", 43, None, ["op2"]), ("t0", 185, "op0", ["op0"]), ("u0", 1, "op0", ["op0"]),
         ("t1", 204, "op1", ["op1"]), ("t2", 376, "op2", ["op2", "op3"]), ("t3", 188, "op3", ["op3"]),
         ("u3", 482, "op3", []), ("t4", 125, "op4", ["op4", "op5"]), ("t5", 361, "op5", ["op5"]),
         ("t6", 145, "op6", ["op6"])],
    )
    assert (minimum_budget_bytes(w), w.ideal_step_time_s) == (607, pytest.approx(19.8))
    slow = slackswap_step_s(w, _slow_link(20.0), 1117)
    fast = slackswap_step_s(w, _slow_link(200.0), 1117)
    assert fast <= slow, f"{fast} s at 200 B/s > {slow} s at 20 B/s"


def test_slackswap_second_counterexample_at_the_minimum_budget():
    """Found by test_more_bandwidth_never_slows_slackswap with 500 examples (h2d x10, ideal 26 s).

    At the minimum budget (705 B) the only recompute-only plan that fits, {t0, t2, u2}, is not a
    set the knapsack family grows into, and recomputing everything does not fit (744 B). At 20 B/s
    no family fits, so the planner starts from everything swapped and its repair reaches {t0, t2,
    u2} (27.0 s); at 200 B/s the early family fits with a swap plan that waits 1.03 s for copies
    (27.027 s), and no single repair move leads to {t0, t2, u2}. Fixed by rule 1's peak descent:
    from recomputing everything, keeping t1 brings the peak to 705 B, and the no-swap repair keeps
    t3 (27.0 s), the same on both links."""
    ops = [("op0", ["x"], ["t0"], 0.0, 6.0), ("op1", ["t0"], ["t1"], 0.5, 6.0), ("op2", ["t0"], ["t2", "u2"], 1.0, 2.0),
           ("op3", ["x", "t1"], ["t3"], 3.0, 6.0), ("op4", ["x"], ["t4"], 0.5, 1.0)]
    w = _workload(ops, [("x", 48, None, []), ("t0", 100, "op0", ["op0", "op1"]), ("t1", 342, "op1", ["op1", "op3"]),
                        ("t2", 205, "op2", ["op2"]), ("u2", 58, "op2", ["op2"]), ("t3", 302, "op3", ["op3"]),
                        ("t4", 367, "op4", [])])

    def link(h2d: float) -> Hardware:
        return _slow_link(h2d).replace(d2h_bytes_per_s=1e5, duplex_h2d_factor=0.3)

    assert (minimum_budget_bytes(w), w.ideal_step_time_s) == (705, pytest.approx(26.0))
    slow = slackswap_step_s(w, link(20.0), 705)
    assert slow == pytest.approx(27.0)
    assert slackswap_step_s(w, link(200.0), 705) <= slow


def test_slackswap_counterexample_more_budget_is_slower():
    """Found by test_more_budget_never_slows_slackswap with 500 examples (ideal 2.05 s, minimum 177 B).

    At both budgets no family fits and the planner starts from everything swapped; at 177 B the
    repair turned t2 and t1 into recomputes and back into keeps (16.95 s), at 221 B it stopped after
    the first two moves (17.0 s), though the 177 B plan also runs in 16.95 s at 221 B. Rule 7's
    tie-break fixed the order (16.95 s at both). The wide search (rules 2, 7's polish, 8) now
    finds the exhaustive best at both budgets: swap t0 and recompute u0 (12.3 s) at 177 B,
    recompute u0 and t1 (2.6 s) at 221 B."""
    w = _workload([("op0", ["x"], ["t0", "u0"], 0.5, 0.0), ("op1", ["x", "t0"], ["t1"], 0.05, 1.0),
                   ("op2", ["x"], ["t2"], 0.5, 0.0)],
                  [("x", 15, None, ["op0", "op1"]), ("t0", 98, "op0", ["op0", "op1"]), ("u0", 51, "op0", ["op0"]),
                   ("t1", 64, "op1", ["op1"]), ("t2", 98, "op2", ["op2"])])
    hw = _slow_link(20.0)
    assert minimum_budget_bytes(w) == 177
    tight = slackswap_step_s(w, hw, 177)
    assert tight == pytest.approx(12.3) == best_step_time_s(w, hw, 177)[0]
    loose = slackswap_step_s(w, hw, 221)
    assert loose == pytest.approx(2.6) == best_step_time_s(w, hw, 221)[0]


def test_slackswap_third_counterexample_more_bandwidth_is_slower():
    """Found by test_more_bandwidth_never_slows_slackswap with 3000 examples (ideal 5.9 s, minimum 1219 B).

    At 400 B/s D2H every link order starts slower than the floor (recompute t0, t2, u2, t4, t6), and the
    repair from the floor swaps t1 (5.95 s). At 600 B/s the value order starts at 6.23 s, below the
    floor, so only it was repaired, and no single change improved it (6.23 s). Fixed by the wide search: on a
    workload this small the other starts are repaired too, and the floor's repair swaps t1 on both
    links. 5.95 s is the exhaustive best on both links (tests/brute_force.py, 3**9 plans, 3.5 s each,
    so not rerun here)."""
    ops = [("op0", ["x"], ["t0"], 0.0, 1.0), ("op1", ["x"], ["t1"], 0.5, 0.1), ("op2", ["x"], ["t2", "u2"], 0.0, 1.0),
           ("op3", ["t2"], ["t3", "u3"], 0.05, 0.0), ("op4", ["t3", "x"], ["t4"], 0.05, 2.0),
           ("op5", ["u3"], ["t5"], 1.0, 0.1), ("op6", ["u3"], ["t6"], 0.0, 0.1)]
    w = _workload(ops, [("x", 39, None, ["op2"]), ("t0", 274, "op0", ["op0"]), ("t1", 258, "op1", ["op1"]),
                        ("t2", 367, "op2", ["op3"]), ("u2", 214, "op2", ["op2"]), ("t3", 460, "op3", ["op4"]),
                        ("u3", 353, "op3", ["op3"]), ("t4", 319, "op4", ["op4"]), ("t5", 415, "op5", ["op5"]),
                        ("t6", 207, "op6", ["op6"])])

    def link(d2h: float) -> Hardware:
        return _slow_link(d2h).replace(h2d_bytes_per_s=1e5, duplex_h2d_factor=0.3)

    assert (minimum_budget_bytes(w), w.ideal_step_time_s) == (1219, pytest.approx(5.9))
    slow = slackswap_step_s(w, link(400.0), 1725)
    assert slow == pytest.approx(5.95)
    assert slackswap_step_s(w, link(600.0), 1725) == pytest.approx(5.95)


def test_slackswap_second_counterexample_more_budget_is_slower():
    """Found by test_more_budget_never_slows_slackswap with 3000 examples (ideal 11.55 s, minimum 636 B).

    At 977 B the value family's bisection reaches a need where the knapsack recomputes t0, t2 and
    t5 beside swapping u0 and t1 (12.1 s; the repair then keeps t5, 12.05 s). At 1006 B the
    initial need is smaller; growing it by the overshoot reached a need whose plan peaks higher
    than the one before (1133 B after 1131 B: more rebuilt in backward), and fit_need kept growing
    from there, never back to the needs in between, one of which runs under 1006 B with short
    waits for memory (12.1 s): the family was lost and the floor (14.55 s) won. fit_need now goes back halfway when
    taking more off raised the peak (tests/test_planners.py), and 1006 B gives 12.05 s, the
    exhaustive best at both budgets (recompute t0 and t2, swap u0 and t1)."""
    ops = [("op0", ["x"], ["t0", "u0"], 0.0, 2.0), ("op1", ["t0"], ["t1", "u1"], 3.0, 0.0),
           ("op2", ["u0", "u1"], ["t2"], 0.5, 0.0), ("op3", ["u1", "t2"], ["t3"], 0.0, 0.0),
           ("op4", ["t3", "t2"], ["t4"], 3.0, 1.0), ("op5", ["t3"], ["t5"], 0.05, 2.0)]
    w = _workload(ops, [("x", 43, None, []), ("t0", 130, "op0", ["op0"]), ("u0", 57, "op0", ["op0"]),
                        ("t1", 55, "op1", ["op1"]), ("u1", 140, "op1", ["op2"]), ("t2", 120, "op2", ["op3"]),
                        ("t3", 31, "op3", ["op5"]), ("t4", 485, "op4", ["op4"]), ("t5", 300, "op5", ["op5"])])
    hw = _slow_link(20.0).replace(h2d_bytes_per_s=1e5, copy_latency_s=0.01, duplex_h2d_factor=0.5)
    assert minimum_budget_bytes(w) == 636
    tight = slackswap_step_s(w, hw, 977)
    assert tight == pytest.approx(12.05)
    assert slackswap_step_s(w, hw, 1006) == pytest.approx(12.05) == best_step_time_s(w, hw, 1006)[0]


def test_slackswap_fourth_counterexample_more_bandwidth_is_slower():
    """Found by benchmarks/hunt_monotone.py (20000 draws, seed 42) after the wide search; 7 candidates.

    It was: 24.54 s at 100 B/s D2H (the exhaustive best) and 24.95 s at 200 B/s (best 23.88 s,
    three changes away). After copies back were made to land before the recompute that reads
    them (schedule.first_need_step), rules 1-9 gave 26.68 s and 24.95 s: the property held, but on
    either side of a search miss. Rule 10 (the exact search on few candidates) gives the
    exhaustive best on both links."""
    ops = [("op0", ["x"], ["t0"], 0.5, 6.0), ("op1", ["x"], ["t1"], 0.0, 6.0), ("op2", ["t1", "x"], ["t2"], 1.0, 6.0),
           ("op3", ["t2", "x"], ["t3", "u3"], 3.0, 0.1), ("op4", ["x"], ["t4", "u4"], 0.5, 0.1)]
    w = _workload(ops, [("x", 30, None, ["op4"]), ("t0", 46, "op0", ["op0"]), ("t1", 134, "op1", ["op2"]),
                        ("t2", 100, "op2", []), ("t3", 346, "op3", ["op3"]), ("u3", 132, "op3", ["op3"]),
                        ("t4", 496, "op4", ["op4"]), ("u4", 257, "op4", ["op4"])])

    def link(d2h: float) -> Hardware:
        return _slow_link(d2h).replace(h2d_bytes_per_s=1e5, copy_latency_s=0.01, duplex_h2d_factor=0.5,
                                       duplex_d2h_factor=1.0)

    slow = slackswap_step_s(w, link(100.0), 1237)
    fast = slackswap_step_s(w, link(200.0), 1237)
    assert slow == pytest.approx(24.54132) == best_step_time_s(w, link(100.0), 1237)[0]
    assert fast == pytest.approx(23.88132) == best_step_time_s(w, link(200.0), 1237)[0]


def test_a_fixed_plan_can_stop_fitting_on_a_faster_link():
    """Why `slackswap`'s bandwidth guarantee cannot rest on the simulator (docs/planners.md).

    Worked by hand (the instance of issue 15 no longer applies: under issue 16's rules its slow
    link cancelled two swaps whose copies out were still queued). Forward takes 4 s; a (10 B)
    and b (10 B) are copied out in it at 100 B/s; both copies back are issued at step 0 (t = 4 s),
    b first (first used at step 2). Budget 21 B = x + a + b. At 1 B/s H2D b's copy back runs
    4-14 s, so when step 1 rebuilds r (1 B) at 10 s only x and b are held (12 B): it fits, then
    a's copy back runs 14-24 s and the step ends at 25 s. At 2 B/s b lands at 9 s and a's copy
    back takes the last 10 B at 9 s: the rebuild at 10 s needs 22 B, and nothing frees memory
    before it, so the same plan cannot run at all."""
    from slackswap.errors import InfeasiblePlanError
    from slackswap.schedule import make_plan

    w = _workload([("op0", ["x"], ["a"], 1.0, 1.0), ("op1", ["x"], ["b"], 1.0, 1.0),
                   ("op2", ["x"], ["r"], 1.0, 1.0), ("op3", ["x"], ["y"], 1.0, 6.0)],
                  [("x", 1, None, ["op0"]), ("a", 10, "op0", ["op0"]), ("b", 10, "op1", ["op1"]),
                   ("r", 1, "op2", ["op2"]), ("y", 1, "op3", [])])
    actions = {"a": Action.SWAP, "b": Action.SWAP, "r": Action.RECOMPUTE}
    plan = make_plan(w, actions, policy="fixed", budget_bytes=21, prefetch_step={"a": 0, "b": 0})
    link = _slow_link(100.0)
    slow = simulate(w, link.replace(h2d_bytes_per_s=1.0), plan, 21)
    # ideal 4 + 9 s, one 1 s rebuild, stalls for b (12-14 s) and a (15-24 s)
    assert slow.step_time_s == pytest.approx(25.0) and slow.stall_copy_s == pytest.approx(11.0)
    assert slow.peak_memory_bytes == 21 and slow.d2h_bytes == slow.h2d_bytes == 20
    with pytest.raises(InfeasiblePlanError, match="recompute of 'op2' needs 22 B"):
        simulate(w, link.replace(h2d_bytes_per_s=2.0), plan, 21)


def test_optimal_on_a_workload_that_saves_nothing():
    w = _workload([("a", ["x"], ["y"], 1.0, 2.0), ("b", ["x"], ["z"], 1.0, 2.0)],
                  [("x", 1, None, []), ("y", 1, "a", []), ("z", 1, "b", [])])
    plan = plan_workload(w, _slow_link(100.0), 1, "optimal")
    assert plan.actions == {} and plan.info["milp_units"] == 0
    assert simulate(w, _slow_link(100.0), plan, 1).step_time_s == w.ideal_step_time_s
