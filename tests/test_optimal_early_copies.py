"""`optimal`'s MILP follows a swapped tensor copied back early for a rebuild (issue 17).

A rebuild that reads a tensor first used later in backward needs it on the device. The model used
to forbid that tensor being swapped (r_u + s_v <= 1), so where keeping it did not fit it could only
recompute it too, a chain that re-runs its producer. The default schedule instead copies a swapped
tensor back before the first recompute group that reads it (schedule.first_need_step), so the group
re-runs only its own ops; the model now has that plan (q >= r_u + s_v - 1: the copy lands by the
group's step, and the tensor is held from there to its own first use).

The workload, by hand (a100-80gb-pcie4: 6 us per copy, bytes at 24 GB/s, so each copy here is
6 us; bytes in B; backward steps by op, from op4 down):

    op0  x -> v   5 ms   v: 100 B, read by op1's backward
    op1  v -> u   1 ms   u:  10 B, read by op2's backward
    op2  u, x     0.1 us
    op3  x        0.1 us (its backward, 1 ms, is where v's early copy is issued)
    op4  x -> e   0.1 us e: 105 B, read by op4's backward;  x: 1 B

Every backward step takes 1 ms. With a budget of 111 B:
- e is held at op4's step whatever the plan (it cannot be swapped: made by the last op, read by the
  first backward step; recomputing it rebuilds it there), so x + e = 106 B leaves room for neither u
  (10 B) nor v (100 B): both are off at the end of forward;
- u cannot be swapped: its copy takes 6 us and only 0.3 us of forward follow it;
- so u is recomputed at op2's step: op1 re-runs and reads v, which must be there: x + u + v = 111 B;
- v recomputed too (the old model's only plan) re-runs op0 as well: 5 + 1 = 6 ms added;
  v swapped is copied out during op1 (1 ms) and back during op3's backward: 1 ms added.
"""

from __future__ import annotations

import pytest

from slackswap.hardware import PRESETS
from slackswap.planners import plan_workload
from slackswap.planners.common import build, facts_for
from slackswap.plans import Action
from slackswap.sim import simulate
from slackswap.workloads.synthetic import dag

pytest.importorskip("scipy")  # the 'milp' extra; the test extra installs it

HW = PRESETS["a100-80gb-pcie4"]
MS, BRIEF = 1e-3, 1e-7
BUDGET = 111


def _workload():
    return dag(
        [("op0", ["x"], ["v"]), ("op1", ["v"], ["u"]), ("op2", ["u", "x"], ["c"]), ("op3", ["x"], ["z"]),
         ("op4", ["x"], ["e"])],
        {"x": 1, "v": 100, "u": 10, "c": 1, "z": 1, "e": 105},
        {"x": ["op0", "op2", "op3", "op4"], "v": ["op1"], "u": ["op2"], "e": ["op4"]},
        fwd_time_s={"op0": 5 * MS, "op1": MS, "op2": BRIEF, "op3": BRIEF, "op4": BRIEF}, bwd_time_s=MS,
        name="early-copy",
    )


def test_the_milp_swaps_the_tensor_a_rebuild_reads_and_pays_only_the_rebuild():
    from slackswap.planners import optimal

    w = _workload()
    facts = facts_for(w)
    units, _ = optimal.choose_units(facts)
    solved = optimal._solve(facts, HW, units, BUDGET)
    assert solved["actions"] == {"v": Action.SWAP, "u": Action.RECOMPUTE}
    assert solved["proven"]
    assert solved["objective_s"] == pytest.approx(MS, rel=1e-9)  # op1 re-run; the old model's plan: 6 ms
    assert solved["dual_bound_s"] == pytest.approx(MS, rel=1e-9)


def test_the_chain_the_old_model_needed_costs_the_producer_too():
    # The same model, with v's swap taken away, has only the chain left: op0 and op1 re-run.
    from slackswap.planners import optimal

    w = _workload()
    facts = facts_for(w)
    units, _ = optimal.choose_units(facts)
    swapped = optimal._assess(facts, HW, units, BUDGET, {"v": Action.SWAP, "u": Action.RECOMPUTE})
    chained = optimal._assess(facts, HW, units, BUDGET, {"v": Action.RECOMPUTE, "u": Action.RECOMPUTE})
    assert swapped["objective_s"] == pytest.approx(MS, rel=1e-9)
    assert chained["objective_s"] == pytest.approx(6 * MS, rel=1e-9)
    # One byte less and v's early copy no longer fits beside u at op2's step (111 B).
    assert optimal._assess(facts, HW, units, BUDGET - 1, {"v": Action.SWAP, "u": Action.RECOMPUTE})[
        "objective_s"] is None


def test_the_simulator_runs_that_plan_as_the_model_says():
    w = _workload()
    plan = build(w, HW, {"v": Action.SWAP, "u": Action.RECOMPUTE}, "optimal", BUDGET)
    timeline = simulate(w, HW, plan, BUDGET)
    assert plan.schedule.recompute_groups and [g.ops for g in plan.schedule.recompute_groups] == [("op1",)]
    assert timeline.peak_memory_bytes == 1 + 10 + 100
    assert timeline.step_time_s == pytest.approx(w.ideal_step_time_s + MS, rel=1e-9)
    optimal_plan = plan_workload(w, HW, BUDGET, "optimal")
    milp_steps = [r["simulated_step_time_s"] for r in optimal_plan.info["milp_rounds"]]
    assert milp_steps[0] == pytest.approx(w.ideal_step_time_s + MS, rel=1e-9)
