"""Schedule derivation: first-use steps, recompute groups, prefetch steps and make_plan."""

from __future__ import annotations

import dataclasses

import pytest

from slackswap.errors import PlanMismatchError, ValidationError
from slackswap.hardware import Hardware
from slackswap.plans import Action
from slackswap.schedule import (
    backward_step_starts_s, check_plan, derive_recompute_groups, first_need_step, first_use_step, make_plan, prefetch_alap,
)
from slackswap.sim import simulate
from slackswap.workloads.synthetic import chain, dag

K, S, R = Action.KEEP, Action.SWAP, Action.RECOMPUTE


def link(rate: float) -> Hardware:
    return Hardware(name="toy", peak_flops_per_s=1.0, gemm_efficiency=1.0, attention_efficiency=1.0,
                    hbm_bytes_per_s=1.0, hbm_efficiency=1.0, hbm_capacity_bytes=10**6,
                    d2h_bytes_per_s=rate, h2d_bytes_per_s=rate, copy_latency_s=0.0)


def full(workload, actions):
    return {t.name: actions.get(t.name, K) for t in workload.saved_tensors}


def shared_reader_workload():
    # p is read by the backward of op1 and op2; op2 also reads q, made by op1 from p.
    return dag([("op0", ["x"], ["p"]), ("op1", ["p"], ["q"]), ("op2", ["p", "q"], ["y"])],
               {"x": 1, "p": 100, "q": 100, "y": 1}, {"x": ["op0"], "p": ["op1", "op2"], "q": ["op2"]})


def test_first_use_step_is_the_backward_step_of_the_latest_reader():
    w = chain(4)
    assert [first_use_step(w, f"a{i}") for i in range(3)] == [2, 1, 0]
    assert first_use_step(w, "x") == 3
    assert first_use_step(shared_reader_workload(), "p") == 0


def test_no_recompute_no_groups():
    w = chain(4)
    assert derive_recompute_groups(w, full(w, {"a0": S}), {"a0": 2}) == {}


def test_each_recompute_tensor_rebuilt_before_its_first_reader():
    w = chain(5)
    groups = derive_recompute_groups(w, full(w, {"a0": R, "a2": R}), {})
    assert groups == {"op3": ("op2",), "op1": ("op0",)}


def test_a_recompute_chain_longer_than_the_recursion_limit_is_one_group():
    # Recomputing every tensor of a long chain rebuilds the whole chain before the first
    # backward step that reads it: one group, deeper than Python's default recursion limit.
    import sys

    n = sys.getrecursionlimit() + 500
    w = chain(n)
    groups = derive_recompute_groups(w, full(w, {f"a{i}": R for i in range(n - 1)}), {})
    assert groups[f"op{n - 1}"] == tuple(f"op{i}" for i in range(n - 1))


def test_recompute_chain_and_swapped_input_not_yet_back():
    w = chain(4)
    # a1's producer reads a0: recomputed a0 is rebuilt first.
    assert derive_recompute_groups(w, full(w, {"a0": R, "a1": R}), {}) == {"op2": ("op0", "op1")}
    # a0 swapped but prefetched only at its own first use (step 2): step 1 must rebuild it too.
    assert derive_recompute_groups(w, full(w, {"a0": S, "a1": R}), {"a0": 2}) == {"op2": ("op0", "op1")}
    # prefetched at step 1, it is back in time: only op1 re-runs.
    assert derive_recompute_groups(w, full(w, {"a0": S, "a1": R}), {"a0": 1}) == {"op2": ("op1",)}


def test_resident_inputs_are_reused_and_rebuilt_tensors_stay_for_later_readers():
    # op2 makes r from k; r is first read at step 0 (op3's backward), while k, kept for op1's
    # backward (step 2), is still resident: only op2 re-runs.
    w = dag([("op0", ["x"], ["k"]), ("op1", ["k"], ["m"]), ("op2", ["k"], ["r"]), ("op3", ["r"], ["y"])],
            {"x": 1, "k": 10, "m": 10, "r": 10, "y": 1}, {"x": ["op0"], "k": ["op1"], "r": ["op3"]})
    assert derive_recompute_groups(w, full(w, {"r": R}), {}) == {"op3": ("op2",)}
    # With k recomputed too, it is rebuilt for r at step 0 and stays for op1's backward at step 2.
    assert derive_recompute_groups(w, full(w, {"r": R, "k": R}), {}) == {"op3": ("op0", "op2")}


def test_kept_tensor_past_its_last_reader_is_rebuilt_when_needed_again():
    # k is kept for op2's backward (step 1); r, recomputed for op1's backward (step 2), is made from k,
    # which is gone by then: op0 re-runs to make k again.
    w = dag([("op0", ["x"], ["k"]), ("op1", ["k"], ["r"]), ("op2", ["k"], ["m"]), ("op3", ["m"], ["y"])],
            {"x": 1, "k": 10, "r": 10, "m": 10, "y": 1}, {"x": ["op0"], "k": ["op2"], "r": ["op1"]})
    assert derive_recompute_groups(w, full(w, {"r": R}), {}) == {"op1": ("op0", "op1")}


def test_recomputed_tensor_with_two_readers_is_rebuilt_once():
    w = shared_reader_workload()
    assert derive_recompute_groups(w, full(w, {"p": R}), {}) == {"op2": ("op0",)}


def test_transient_links_are_always_rebuilt():
    w = dag([("op0", ["x"], ["s"]), ("op1", ["s"], ["p"]), ("op2", ["p"], ["y"])],
            {"x": 1, "s": 50, "p": 100, "y": 1}, {"x": ["op0"], "p": ["op2"]})
    assert derive_recompute_groups(w, full(w, {"p": R}), {}) == {"op2": ("op0", "op1")}


def test_swap_needed_before_its_prefetch_is_an_error():
    w = chain(3)
    with pytest.raises(ValidationError, match=r"backward of 'op1' needs 'a0' \(swap\), which is not on the device"):
        derive_recompute_groups(w, full(w, {"a0": S}), {"a0": 2})


def test_backward_step_starts_include_recompute_time():
    w = chain(3, fwd_time_s=(0.5, 1.0, 1.0), bwd_time_s=2.0)
    assert backward_step_starts_s(w, {}) == [0.0, 2.0, 4.0]
    assert backward_step_starts_s(w, {"op1": ("op0",)}) == [0.0, 2.0, 4.5]


def test_prefetch_alap_issues_each_copy_as_late_as_it_can_hide():
    w = chain(4)  # backward steps start at 0, 2, 4, 6 s; a0 is first read at step 2, a1 at step 1
    actions = full(w, {"a0": S})
    assert prefetch_alap(w, actions, link(1000.0)) == {"a0": 1}  # 0.1 s copy: issue at 2 s, done by 4 s
    assert prefetch_alap(w, actions, link(100.0)) == {"a0": 1}   # 1 s copy: must start by 3 s
    assert prefetch_alap(w, actions, link(40.0)) == {"a0": 0}    # 2.5 s copy: must start by 1.5 s
    assert prefetch_alap(w, actions, link(100.0), lead_s=1.5) == {"a0": 0}


def test_prefetch_alap_keeps_the_in_order_stream_free_for_the_next_copy():
    w = chain(4)
    # a0 (step 2) is issued at step 1 (2 s); a1 (step 1) must then land by 2 s: its 1 s copy starts by 1 s.
    steps = prefetch_alap(w, full(w, {"a0": S, "a1": S}), link(100.0))
    assert steps == {"a0": 1, "a1": 0}
    timeline = simulate(w, link(100.0), make_plan(w, {"a0": S, "a1": S}, policy="alap", budget_bytes=None,
                                                   hardware=link(100.0)))
    assert timeline.stall_copy_s == 0.0


def test_a_swapped_input_of_a_recompute_is_needed_at_the_recompute():
    w = chain(4)  # a0 is first read by op1's backward (step 2); op1 re-runs at step 1 to rebuild a1
    assert first_need_step(w, full(w, {"a0": S})) == {"a0": 2}
    assert first_need_step(w, full(w, {"a0": S, "a1": R})) == {"a0": 1}
    # a2's rebuild (step 0) re-runs op2 from a1, which is kept: a0 is still first needed by op1's backward
    assert first_need_step(w, full(w, {"a0": S, "a2": R})) == {"a0": 2}


def test_prefetch_alap_lands_a_recompute_input_before_the_recompute_on_any_link():
    """A copy back timed for the backward read alone arrived after op1's recompute (step 1), which
    then re-ran op0 as well; a faster link issued it later still. Found on bert-large at 20 % of
    the peak: 3x the H2D rate made the `slackswap` plan 2.8x slower (138 ms -> 387 ms)."""
    w = chain(4)  # backward steps start at 0, 2, 4, 6 s; op1 re-runs at the start of step 1 (2 s)
    actions = {"a0": S, "a1": R}
    for rate in (40.0, 100.0, 1000.0, 1e6):
        plan = make_plan(w, actions, policy="alap", budget_bytes=None, hardware=link(rate))
        assert plan.recompute_groups == {"op2": ("op1",)}, rate
        assert plan.prefetch_step["a0"] <= 1
    assert prefetch_alap(w, full(w, actions), link(1e6)) == {"a0": 0}  # must land by 2 s: issued at 0 s
    # without hardware, at the step of first need (the runtime's default for bare actions too)
    bare = make_plan(w, actions, policy="bare", budget_bytes=None)
    assert bare.prefetch_step == {"a0": 1} and bare.recompute_groups == {"op2": ("op1",)}
    timeline = simulate(w, link(100.0), make_plan(w, actions, policy="alap", budget_bytes=None, hardware=link(100.0)))
    assert timeline.stall_copy_s == 0.0


def test_make_plan_defaults_and_checks():
    w = chain(4)
    plan = make_plan(w, {"a1": R, "a2": S}, policy="p", budget_bytes=500)
    assert plan.actions == {"x": K, "a0": K, "a1": R, "a2": S}
    assert plan.prefetch_step == {"a2": 0}  # without hardware: at first use
    assert plan.recompute_groups == {"op2": ("op1",)}
    assert (plan.count(R), plan.bytes_with(w, S)) == (1, 100)
    check_plan(w, plan)
    with_hw = make_plan(w, {"a0": S}, policy="p", budget_bytes=None, hardware=link(100.0))
    assert with_hw.prefetch_step == {"a0": 1}
    with pytest.raises(ValidationError, match="actions name tensors the workload does not save"):
        make_plan(w, {"a3": S}, policy="p", budget_bytes=None)


def test_a_recompute_region_reruns_its_ops_that_nothing_needs_and_the_simulator_charges_them():
    # chain(4), forward 1, 2, 4, 8 s: a1 recomputed is rebuilt by op1 before op2's backward (step 1).
    # With op1 and op2 one region (as a checkpointed function), op2 re-runs too although its output
    # a2 is kept: 2 + 4 s of recompute instead of 2 s.
    w = chain(4, fwd_time_s=[1.0, 2.0, 4.0, 8.0])
    hw = link(1e9)
    plain = make_plan(w, {"a1": R}, policy="hand", budget_bytes=None)
    region = make_plan(w, {"a1": R}, policy="hand", budget_bytes=None, recompute_regions=[("op1", "op2")])
    assert plain.recompute_groups == {"op2": ("op1",)}
    assert region.recompute_groups == {"op2": ("op1", "op2")}
    assert region.recompute_regions == (("op1", "op2"),)
    check_plan(w, region)
    ideal = simulate(w, hw, make_plan(w, {}, policy="ideal", budget_bytes=None)).step_time_s
    assert simulate(w, hw, plain).step_time_s == ideal + 2.0
    assert simulate(w, hw, region).step_time_s == ideal + 2.0 + 4.0


def test_a_region_op_whose_inputs_are_gone_rebuilds_them_first():
    # a2 recomputed: op2 re-runs before op3's backward (step 0). The region (op1, op2) adds op1,
    # whose input a0 is recomputed too, so op0 re-runs first; a0 then stays for op1's backward.
    w = chain(4, fwd_time_s=[1.0, 2.0, 4.0, 8.0])
    actions = full(w, {"a0": R, "a2": R})
    assert derive_recompute_groups(w, actions, {}) == {"op3": ("op2",), "op1": ("op0",)}
    assert derive_recompute_groups(w, actions, {}, [("op1", "op2")]) == {"op3": ("op0", "op1", "op2")}


def test_a_plan_whose_regions_name_an_unknown_op_or_disagree_with_its_groups_is_refused():
    w = chain(3)
    plain = make_plan(w, {"a1": R}, policy="hand", budget_bytes=None)
    with pytest.raises(PlanMismatchError, match="recompute_regions.*'opX'"):
        check_plan(w, dataclasses.replace(plain, recompute_regions=(("op1", "opX"),)))
    with pytest.raises(ValidationError, match="recompute_groups do not match"):
        check_plan(w, dataclasses.replace(plain, recompute_regions=(("op1", "op2"),)))
    with pytest.raises(PlanMismatchError, match="recompute_regions"):
        make_plan(w, {}, policy="hand", budget_bytes=None, recompute_regions=[("nope",)])


def test_remembered_groups_and_full_actions_give_what_the_plain_computation_gives():
    """derive_schedule reuses RecomputeGroups made for earlier plans, and first_need_step takes a
    complete actions dict as it is: on random plans the schedule equals one built from fresh groups
    and the need steps equal those of the partial actions (unnamed tensors kept)."""
    import random

    from slackswap import schedule as schedule_module
    from slackswap.hardware import PRESETS
    from slackswap.plans import CopyBack, RecomputeGroup
    from slackswap.schedule import derive_schedule
    from slackswap.workloads.models import build_model_workload

    hw = PRESETS["a100-80gb-pcie4"]
    workload = build_model_workload("gpt2-xl", hw, layers=2)
    names = [t.name for t in workload.saved_tensors if t.producer is not None]
    rng = random.Random(3)
    grouped = 0
    for _ in range(40):
        partial = {n: rng.choice([S, R]) for n in names if rng.random() < 0.4}
        plan = make_plan(workload, partial, policy="test", budget_bytes=None, hardware=hw)
        n = len(workload.ops)
        fresh = sorted((RecomputeGroup(n - 1 - workload.op_index[before], before, tuple(ops))
                        for before, ops in plan.recompute_groups.items()), key=lambda g: g.step)
        assert plan.schedule.recompute_groups == tuple(fresh)
        production = {t.name: i for i, t in enumerate(workload.saved_tensors)}
        order = sorted(plan.prefetch_step, key=lambda s: (plan.prefetch_step[s], first_use_step(workload, s), production[s]))
        assert plan.schedule.copy_backs == tuple(CopyBack(s, plan.prefetch_step[s], plan.prefetch_step[s]) for s in order)
        if order:  # a remembered copy is not handed out for a step that is not an int
            with pytest.raises(ValidationError):
                derive_schedule(workload, {**plan.prefetch_step, order[0]: float(plan.prefetch_step[order[0]])}, {})
        grouped += bool(fresh)
        assert schedule_module._GROUPS_MADE  # the groups are remembered, and the next plans reuse them
        assert first_need_step(workload, full(workload, partial)) == first_need_step(workload, partial)
    assert grouped > 20


def test_make_plan_groups_are_those_of_its_own_prefetch_steps():
    """make_plan takes the recompute groups it derived on the way to the first need steps (every
    copy back there from the start) as the plan's: on random plans with swaps and recomputes, on a
    fast link, a slow one and without one, they equal the groups derived from the plan's own
    prefetch steps, and the plan checks."""
    import random

    from slackswap.hardware import PRESETS
    from slackswap.workloads.models import build_model_workload

    fast = PRESETS["a100-80gb-pcie4"]
    slow = dataclasses.replace(fast, d2h_bytes_per_s=fast.d2h_bytes_per_s / 50, h2d_bytes_per_s=fast.h2d_bytes_per_s / 50)
    workload = build_model_workload("gpt2-xl", fast, layers=2)
    names = [t.name for t in workload.saved_tensors if t.producer is not None]
    rng = random.Random(5)
    moved = 0
    for i in range(60):
        partial = {n: rng.choice([S, R, R]) for n in names if rng.random() < 0.6}
        hardware = (fast, slow, None)[i % 3]
        plan = make_plan(workload, partial, policy="test", budget_bytes=None, hardware=hardware)
        assert plan.recompute_groups == derive_recompute_groups(workload, plan.actions, plan.prefetch_step)
        check_plan(workload, plan)
        need = first_need_step(workload, plan.actions)
        moved += any(plan.prefetch_step[n] < need[n] for n in plan.prefetch_step) and bool(plan.recompute_groups)
    assert moved > 10  # copies issued before their need steps, with groups: the case the reuse is about


def test_plans_outside_make_plan_are_still_checked_entry_by_entry():
    """make_plan's plans skip the per-entry checks of their own actions and groups (plans.
    derived_entries); a plan made afterwards, or from make_plan's own parts with a bad entry, is
    checked as before."""
    from slackswap.plans import Plan

    w = chain(3)
    plan = make_plan(w, {"a0": R}, policy="hand", budget_bytes=None)
    assert plan.recompute_groups == {"op1": ("op0",)} and plan == Plan.from_dict(plan.to_dict())
    with pytest.raises(ValidationError, match="actions"):
        dataclasses.replace(plan, actions={**plan.actions, "a1": 3})
    with pytest.raises(ValidationError, match="recompute_groups"):
        dataclasses.replace(plan, recompute_groups={"op1": ("op0", 7)})
    assert dataclasses.replace(plan, actions={**plan.actions, "a1": "swap"}).actions["a1"] is S
