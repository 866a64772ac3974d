"""The plan's typed execution schedule (format slackswap.plan/2): derived once, part of the plan's
identity, saved in its JSON, and what both the simulator and the runtime follow."""

from __future__ import annotations

import dataclasses
import json

import pytest

import slackswap
from slackswap.errors import ValidationError
from slackswap.hardware import Hardware
from slackswap.plans import Action, CopyBack, ExecutionSchedule, Plan, RecomputeGroup
from slackswap.schedule import backward_step_of, check_plan, make_plan, op_of_backward_step, rescheduled
from slackswap.sim import copy_in_start_steps, simulate
from slackswap.workloads.synthetic import chain

K, S, R = Action.KEEP, Action.SWAP, Action.RECOMPUTE


def slow_link() -> Hardware:
    """Copies back at 20 B/s (a 100-byte copy takes 5 s, against ops of 1 s forward and 2 s backward);
    copies out at 1 MB/s (done long before backward)."""
    return Hardware(name="slow-link", peak_flops_per_s=1.0, gemm_efficiency=1.0, attention_efficiency=1.0,
                    hbm_efficiency=1.0, hbm_bytes_per_s=1e12, hbm_capacity_bytes=10**9,
                    d2h_bytes_per_s=1e6, h2d_bytes_per_s=20.0, copy_latency_s=0.0)


def test_schedule_by_hand_on_a_chain():
    # chain(5): op i makes a_i (100 B), read by op i+1's backward; step k is op 4-k's backward.
    w = chain(5)
    plan = make_plan(w, {"a0": S, "a1": R, "a2": R, "a3": S}, policy="hand", budget_bytes=250,
                     prefetch_step={"a0": 2, "a3": 0})
    # a3 is read at step 0 (op4), a0 at step 3 (op1); op3's backward (step 1) needs a2, rebuilt from
    # a1, rebuilt from a0, which is not back until step 2: the group re-runs op0 too.
    assert plan.schedule == ExecutionSchedule(
        recompute_groups=(RecomputeGroup(step=1, before="op3", ops=("op0", "op1", "op2")),),
        copy_backs=(CopyBack("a3", issue_step=0, start_step=0), CopyBack("a0", issue_step=2, start_step=2)),
    )
    assert [backward_step_of(5, i) for i in range(5)] == [4, 3, 2, 1, 0]
    assert [op_of_backward_step(5, backward_step_of(5, i)) for i in range(5)] == list(range(5))


def test_start_steps_are_part_of_the_plan_and_its_json(tmp_path):
    """Two copies queue on the slow link: the second starts a step after it is issued. The start
    steps are in the plan's identity and survive a save and a load."""
    w = chain(5)
    hw = slow_link()
    plan = make_plan(w, {"a0": S, "a1": S}, policy="hand", budget_bytes=None, prefetch_step={"a0": 0, "a1": 0})
    # Backward starts at 5 s; a1 (read at step 2) goes first, from 5 s to 10 s; steps 0, 1 and 2 are
    # triggered at 5, 7 and 9 s, step 3 at 12 s (step 2 waits for a1); a0's copy starts at 10 s: in step 2.
    assert [c.tensor for c in plan.schedule.copy_backs] == ["a1", "a0"]
    assert copy_in_start_steps(w, hw, plan) == {"a1": 0, "a0": 2}
    starts = copy_in_start_steps(w, hw, plan)
    timed = rescheduled(w, plan, start_step=starts)
    assert timed != plan and timed.schedule.start_steps() == starts
    check_plan(w, timed)
    path = tmp_path / "plan.json"
    timed.save(path, w)
    loaded = Plan.load(path)
    assert loaded == timed and json.loads(path.read_text())["format"] == "slackswap.plan/2"
    # The simulator follows the issue steps: the start steps do not change the simulated step.
    assert simulate(w, hw, loaded).step_time_s == simulate(w, hw, plan).step_time_s


def test_the_api_puts_start_steps_in_every_plan():
    w = chain(5)
    plan = slackswap.plan(w, slow_link(), budget=0.6, policy="swap-only")
    assert plan.count(S) >= 1
    assert plan.schedule.start_steps() == copy_in_start_steps(w, slow_link(), plan)


@pytest.mark.parametrize("edit, message", [
    (lambda s: dataclasses.replace(s, copy_backs=s.copy_backs[::-1]), "plan.schedule does not match"),
    (lambda s: dataclasses.replace(s, recompute_groups=()), "plan.schedule does not match"),
    (lambda s: dataclasses.replace(s, copy_backs=(dataclasses.replace(s.copy_backs[0], start_step=4),)
                                   + s.copy_backs[1:]), "the copy back of 'a3' starts at step 4"),
])
def test_check_plan_catches_an_edited_schedule(edit, message):
    w = chain(5)
    plan = make_plan(w, {"a0": S, "a1": R, "a2": R, "a3": S}, policy="hand", budget_bytes=250,
                     prefetch_step={"a0": 2, "a3": 0})
    bad = dataclasses.replace(plan, schedule=edit(plan.schedule))
    assert bad != plan
    with pytest.raises(ValidationError) as info:
        check_plan(w, bad)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_version_1_plan_file_is_refused_with_the_fix(tmp_path):
    w = chain(3)
    data = make_plan(w, {"a0": S}, policy="hand", budget_bytes=None).to_dict(w)
    data["format"] = "slackswap.plan/1"
    del data["schedule"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValidationError) as info:
        Plan.load(path)
    assert "'slackswap.plan/1'" in str(info.value) and "make the plan again" in str(info.value)


def test_the_simulator_runs_the_schedule_groups():
    """A schedule group is what the simulator re-runs: the recompute time is its ops' forward time."""
    w = chain(5)
    plan = make_plan(w, {"a1": R, "a2": R}, policy="hand", budget_bytes=None)
    (group,) = plan.schedule.recompute_groups
    expected = sum(w.ops[w.op_index[op]].fwd_time_s for op in group.ops)
    assert simulate(w, slow_link(), plan).recompute_time_s == expected > 0
