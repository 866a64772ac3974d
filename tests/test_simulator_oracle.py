"""The simulator against tests/oracle.py on hundreds of random small workloads, plans and budgets.

Every size, bandwidth, latency and time is a small dyadic number (multiples of 1/4, rates
of 25, 50, 100 or 200 B/s, duplex factors 1, 1/2, 1/4), so both implementations compute every
figure exactly and can be compared with ==, in whatever order they add things up.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oracle import oracle_simulate
from slackswap.errors import InfeasiblePlanError
from slackswap.hardware import PRESETS, Hardware
from slackswap.plans import Action
from slackswap.schedule import first_use_step, make_plan
from slackswap.sim import simulate
from slackswap.workload import Op, Tensor, Workload
from slackswap.workloads.models import build_model_workload

SIZES = (25, 50, 100, 150, 200, 300)
TIMES = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0)
RATES = (25.0, 50.0, 100.0, 200.0)
LATENCIES = (0.0, 0.25, 0.5)
FACTORS = (1.0, 0.5, 0.25)
CASES = 600


@st.composite
def workloads(draw) -> Workload:
    """A random DAG in execution order: multi-output ops, ops reading several earlier tensors,
    transient tensors, tensors with several backward readers (including their producer)."""
    tensors: list[dict] = []
    available: list[str] = []
    for j in range(draw(st.integers(1, 2))):
        tensors.append({"name": f"x{j}", "size": draw(st.sampled_from(SIZES)), "producer": None})
        available.append(f"x{j}")
    ops = []
    for i in range(draw(st.integers(1, 7))):
        inputs = draw(st.lists(st.sampled_from(available), max_size=3, unique=True))
        outputs = [f"t{i}_{o}" for o in range(draw(st.sampled_from((0, 1, 1, 1, 2, 2, 3))))]
        for name in outputs:
            tensors.append({"name": name, "size": draw(st.sampled_from(SIZES)), "producer": f"op{i}"})
        ops.append(Op(
            name=f"op{i}", layer=i, kind="gemm", fwd_time_s=draw(st.sampled_from(TIMES)),
            bwd_time_s=draw(st.sampled_from(TIMES)), flops=0.0, bytes_accessed=0.0,
            inputs=tuple(inputs), outputs=tuple(outputs),
        ))
        available.extend(outputs)
    final = []
    for t in tensors:
        touching = [op.name for op in ops if t["name"] in op.inputs or t["name"] in op.outputs]
        readers = draw(st.lists(st.sampled_from(touching), unique=True)) if touching else []
        final.append(Tensor(name=t["name"], size_bytes=t["size"], producer=t["producer"], bwd_readers=tuple(readers)))
    return Workload(name="random", ops=tuple(ops), tensors=tuple(final))


@st.composite
def cases(draw):
    workload = draw(workloads())
    actions, prefetch = {}, {}
    for t in workload.saved_tensors:
        if t.producer is None:
            continue
        action = draw(st.sampled_from((Action.KEEP, Action.SWAP, Action.SWAP, Action.RECOMPUTE)))
        actions[t.name] = action
        if action is Action.SWAP:
            prefetch[t.name] = draw(st.integers(0, first_use_step(workload, t.name)))
    plan = make_plan(workload, actions, policy="random", budget_bytes=None, prefetch_step=prefetch)
    hardware = Hardware(
        name="dyadic", peak_flops_per_s=1.0, gemm_efficiency=1.0, attention_efficiency=1.0,
        hbm_bytes_per_s=1.0, hbm_efficiency=1.0, hbm_capacity_bytes=10**6,
        d2h_bytes_per_s=draw(st.sampled_from(RATES)), h2d_bytes_per_s=draw(st.sampled_from(RATES)),
        copy_latency_s=draw(st.sampled_from(LATENCIES)),
        duplex_h2d_factor=draw(st.sampled_from(FACTORS)), duplex_d2h_factor=draw(st.sampled_from(FACTORS)),
    )
    mode = draw(st.sampled_from(("none", "tight", "tight", "any")))
    if mode == "none":
        budget = None
    elif mode == "tight":
        # Just below the unlimited peak, where memory waits and infeasibility live.
        peak = oracle_simulate(workload, hardware, plan).peak_memory_bytes
        budget = max(1, peak - 25 * draw(st.integers(0, 6)))
    else:
        budget = draw(st.integers(1, workload.saved_bytes + 100))
    return workload, hardware, plan, budget


def _memory_steps(pairs) -> list[tuple[float, int]]:
    """Bytes in use at the end of each instant where it changed."""
    last_per_instant: dict[float, int] = {}
    for time_s, value in pairs:
        last_per_instant[time_s] = value
    steps, previous = [], 0
    for time_s in sorted(last_per_instant):
        if last_per_instant[time_s] != previous:
            steps.append((time_s, last_per_instant[time_s]))
            previous = last_per_instant[time_s]
    return steps


def _overlapping_copies(timeline) -> bool:
    d2h = [e for e in timeline.events if e.stream == "d2h"]
    h2d = [e for e in timeline.events if e.stream == "h2d"]
    return any(a.start_s < b.end_s and b.start_s < a.end_s for a in d2h for b in h2d)


def check_case(workload, hardware, plan, budget, seen: Counter) -> None:
    try:
        expected = oracle_simulate(workload, hardware, plan, budget)
    except InfeasiblePlanError as oracle_error:
        try:
            simulate(workload, hardware, plan, budget)
        except InfeasiblePlanError as error:
            assert (error.needed_bytes, error.budget_bytes) == (oracle_error.needed_bytes, oracle_error.budget_bytes)
            assert error.needed_bytes > error.budget_bytes
            message = str(oracle_error)
            if message.startswith("stuck waiting for ") and not message.endswith("None"):
                # The copy back the compute stream waits for is the one the error names.
                assert f"the copy back of {message.removeprefix('stuck waiting for ')} that" in str(error)
            seen["infeasible"] += 1
            return
        raise AssertionError("the oracle found the plan infeasible, the simulator did not")
    # The recompute groups (schedule.derive_recompute_groups) put back everything each task reads.
    assert expected.missing == []
    timeline = simulate(workload, hardware, plan, budget)
    assert timeline == simulate(workload, hardware, plan, budget), "two runs differ"
    got = (timeline.step_time_s, timeline.peak_memory_bytes, timeline.d2h_bytes, timeline.h2d_bytes,
           timeline.recompute_time_s, timeline.stall_copy_s, timeline.stall_memory_s)
    want = (expected.step_time_s, expected.peak_memory_bytes, expected.d2h_bytes, expected.h2d_bytes,
            expected.recompute_time_s, expected.stall_copy_s, expected.stall_memory_s)
    assert got == want
    tasks = [(e.kind, e.name, e.start_s, e.end_s, e.step) for e in timeline.events
             if e.kind in ("forward", "recompute", "backward")]
    assert tasks == expected.tasks
    stalls = [(e.kind, e.name, e.start_s, e.end_s) for e in timeline.events if e.kind.startswith("stall")]
    assert stalls == expected.stalls
    copies = sorted((e.stream, e.name, e.start_s, e.end_s) for e in timeline.events if e.stream != "compute")
    assert copies == sorted(expected.copies)
    assert _memory_steps(timeline.memory) == _memory_steps(expected.memory_by_instant.items())
    limit = math.inf if budget is None else budget
    assert all(value <= limit for _, value in timeline.memory)
    assert math.isclose(
        timeline.step_time_s,
        timeline.ideal_step_time_s + timeline.recompute_time_s + timeline.stall_copy_s + timeline.stall_memory_s,
        rel_tol=1e-12, abs_tol=1e-12,
    )
    seen["feasible"] += 1
    seen["stall_copy"] += timeline.stall_copy_s > 0
    seen["stall_memory"] += timeline.stall_memory_s > 0
    seen["recompute"] += timeline.recompute_time_s > 0
    seen["duplex overlap"] += _overlapping_copies(timeline) and (
        hardware.duplex_h2d_factor < 1 or hardware.duplex_d2h_factor < 1)
    seen["budget binds"] += budget is not None and timeline.peak_memory_bytes == budget
    # the copy rules of issue 16 (docs/simulator.md)
    copied_back = [e.name for e in timeline.events if e.kind == "copy_in"]
    swapped = [c.tensor for c in plan.schedule.copy_backs]
    seen["skipped copy back"] += len(copied_back) < len(swapped)
    seen["out of order"] += copied_back != [n for n in swapped if n in copied_back]
    for stream in ("d2h", "h2d"):
        ends = {e.end_s for e in timeline.events if e.stream == stream}
        seen["launch overlapped"] += hardware.copy_latency_s > 0 and any(
            e.start_s in ends for e in timeline.events if e.stream == stream)


def test_simulator_agrees_with_the_oracle(summary_lines):
    seen: Counter = Counter()

    @settings(max_examples=CASES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(cases())
    def run(case):
        check_case(*case, seen)

    run()
    total = seen["feasible"] + seen["infeasible"]
    summary_lines.append(
        f"simulator vs oracle: {total} random cases agree ({seen['feasible']} feasible, "
        f"{seen['infeasible']} infeasible; {seen['stall_copy']} with copy stalls, {seen['stall_memory']} with "
        f"memory stalls, {seen['recompute']} with recompute, {seen['duplex overlap']} with duplex overlap, "
        f"{seen['skipped copy back']} with a skipped copy back, {seen['out of order']} out of order, "
        f"{seen['launch overlapped']} stream-cases with an overlapped launch)"
    )
    assert total >= 500
    # The generator must reach every kind of behaviour, or agreement means little.
    for key in ("infeasible", "stall_copy", "stall_memory", "recompute", "duplex overlap", "budget binds",
                "skipped copy back", "launch overlapped"):
        assert seen[key] >= 10, (key, seen)


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)


@pytest.mark.parametrize("model", ["bert-large", "gpt2-xl", "llama-7b"])
def test_two_layer_transformers_agree_with_the_oracle(model, summary_lines):
    """Real op graphs and real (non-dyadic) times: figures agree up to float summation order."""
    hardware = PRESETS["a100-40gb-pcie4"]
    workload = build_model_workload(model, hardware, layers=2)
    movable = [t.name for t in workload.saved_tensors if t.producer is not None]
    cycle = (Action.SWAP, Action.RECOMPUTE, Action.KEEP)
    plans = [{name: cycle[(i + shift) % 3] for i, name in enumerate(movable)} for shift in range(3)]
    plans.append({name: Action.SWAP for name in movable})
    compared = memory_waits = 0
    for actions in plans:
        plan = make_plan(workload, actions, policy="cycle", budget_bytes=None, hardware=hardware)
        peak = simulate(workload, hardware, plan).peak_memory_bytes
        for budget in (None, peak, int(peak * 0.95), int(peak * 0.8), int(peak * 0.6)):
            try:
                expected = oracle_simulate(workload, hardware, plan, budget)
            except InfeasiblePlanError as oracle_error:
                with pytest.raises(InfeasiblePlanError) as info:
                    simulate(workload, hardware, plan, budget)
                assert info.value.needed_bytes == oracle_error.needed_bytes
                continue
            timeline = simulate(workload, hardware, plan, budget)
            assert expected.missing == []
            assert (timeline.peak_memory_bytes, timeline.d2h_bytes, timeline.h2d_bytes) == (
                expected.peak_memory_bytes, expected.d2h_bytes, expected.h2d_bytes)
            for got, want in ((timeline.step_time_s, expected.step_time_s),
                              (timeline.recompute_time_s, expected.recompute_time_s),
                              (timeline.stall_copy_s, expected.stall_copy_s),
                              (timeline.stall_memory_s, expected.stall_memory_s)):
                assert _close(got, want), (got, want)
            tasks = [(e.kind, e.name, e.step) for e in timeline.events if e.kind in ("forward", "recompute", "backward")]
            assert tasks == [(kind, name, step) for kind, name, _, _, step in expected.tasks]
            compared += 1
            memory_waits += timeline.stall_memory_s > 0
    summary_lines.append(f"simulator vs oracle on 2-layer {model}: {compared} plan/budget pairs agree, "
                         f"{memory_waits} with memory stalls")
    assert compared >= 8 and memory_waits >= 1
