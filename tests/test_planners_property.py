"""Property: every plan any policy returns runs within its budget in the simulator."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings, strategies as st

from slackswap.errors import BudgetError
from slackswap.hardware import Hardware
from slackswap.planners import PLANNERS, minimum_budget_bytes, plan_workload
from slackswap.sim import simulate, simulate_ideal
from slackswap.workload import Op, Tensor, Workload


@st.composite
def workloads(draw):
    """Chains of 3-8 ops where an op may also read an earlier op's output (a skip connection),
    with random sizes and times, and a random link speed."""
    n = draw(st.integers(3, 8))
    ops, tensors, readers = [], [Tensor(name="x", size_bytes=draw(st.integers(1, 50)), producer=None)], {"x": []}
    for i in range(n):
        inputs = ["x" if i == 0 else f"t{i - 1}"]
        if i >= 2 and draw(st.booleans()):
            inputs.append(f"t{draw(st.integers(0, i - 2))}")
        for name in inputs:
            readers[name].append(f"op{i}")
        ops.append(Op(name=f"op{i}", layer=i, kind=draw(st.sampled_from(["gemm", "elementwise", "attention"])),
                      fwd_time_s=draw(st.floats(0.1, 5.0)), bwd_time_s=draw(st.floats(0.1, 10.0)), flops=0.0,
                      bytes_accessed=0.0, inputs=tuple(inputs), outputs=(f"t{i}",)))
        readers[f"t{i}"] = []
    sizes = {f"t{i}": draw(st.integers(1, 400)) for i in range(n)}
    tensors[0] = Tensor(name="x", size_bytes=tensors[0].size_bytes, producer=None, bwd_readers=tuple(readers["x"]))
    for i in range(n):
        name = f"t{i}"
        tensors.append(Tensor(name=name, size_bytes=sizes[name], producer=f"op{i}", bwd_readers=tuple(readers[name])))
    workload = Workload(name="random", ops=tuple(ops), tensors=tuple(tensors))
    rate = draw(st.sampled_from([1.0, 50.0, 1e4]))
    hardware = Hardware(name="random-link", peak_flops_per_s=1e12, gemm_efficiency=0.5, attention_efficiency=0.5,
                        hbm_bytes_per_s=1e12, hbm_efficiency=0.8, hbm_capacity_bytes=10**12, d2h_bytes_per_s=rate,
                        h2d_bytes_per_s=rate, copy_latency_s=draw(st.sampled_from([0.0, 0.01])),
                        duplex_h2d_factor=draw(st.sampled_from([0.5, 1.0])))
    return workload, hardware, draw(st.floats(0.0, 1.0))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=workloads())
def test_every_policy_plan_fits_its_budget(case):
    workload, hardware, where = case
    minimum = minimum_budget_bytes(workload)
    peak = simulate_ideal(workload, hardware).peak_memory_bytes
    budget = minimum + int(where * (peak - minimum))
    for policy in PLANNERS:
        try:
            plan = plan_workload(workload, hardware, budget, policy)
        except BudgetError:
            # Only a policy that cannot reach the budget may refuse; swap-only and slackswap reach
            # every budget down to the minimum.
            assert policy not in ("swap-only", "slackswap", "ideal")
            continue
        if policy == "ideal":
            assert plan.budget_bytes is None
            continue
        timeline = simulate(workload, hardware, plan, budget)  # raises InfeasiblePlanError if it cannot fit
        assert timeline.peak_memory_bytes <= budget
