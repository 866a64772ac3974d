"""Hand-computed simulations of tiny workloads (docs/simulator.md gives the rules).

Sizes, bandwidths and times are chosen so that every figure is exact in binary floating
point, so results are compared with ==. Each test's comment shows the arithmetic.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from slackswap.errors import InfeasiblePlanError
from slackswap.hardware import Hardware
from slackswap.plans import Action
from slackswap.schedule import make_plan
from slackswap.sim import simulate, simulate_ideal
from slackswap.workloads.synthetic import chain, dag

K, S, R = Action.KEEP, Action.SWAP, Action.RECOMPUTE


def link(*, d2h=100.0, h2d=100.0, latency=0.0, duplex_h2d=1.0, duplex_d2h=1.0) -> Hardware:
    """A host link in round numbers; compute speeds are unused (op times come from the workload)."""
    return Hardware(
        name="toy", peak_flops_per_s=1.0, gemm_efficiency=1.0, attention_efficiency=1.0,
        hbm_bytes_per_s=1.0, hbm_efficiency=1.0, hbm_capacity_bytes=10**6,
        d2h_bytes_per_s=d2h, h2d_bytes_per_s=h2d, copy_latency_s=latency,
        duplex_h2d_factor=duplex_h2d, duplex_d2h_factor=duplex_d2h,
    )


def plan_for(workload, actions, prefetch=None, budget=None):
    return make_plan(workload, actions, policy="hand", budget_bytes=budget, prefetch_step=prefetch)


def spans(timeline, kind):
    return [(e.name, e.start_s, e.end_s) for e in timeline.events if e.kind == kind]


def assert_within_budget(timeline, budget):
    assert max(value for _, value in timeline.memory) == timeline.peak_memory_bytes <= budget


# ---- keep everything ------------------------------------------------------------------------

def test_all_keep_takes_exactly_the_ideal_time():
    w = chain(4, fwd_time_s=(1.0, 2.0, 4.0, 8.0), bwd_time_s=(0.5, 0.25, 2.0, 1.0))
    t = simulate(w, link(), plan_for(w, {}))
    assert t.step_time_s == t.ideal_step_time_s == 15.0 + 3.75
    assert (t.stall_copy_s, t.stall_memory_s, t.recompute_time_s, t.d2h_bytes, t.h2d_bytes) == (0, 0, 0, 0, 0)
    # x (1 B) and a0, a1, a2 (100 B each) are all on the device once op2 starts; a3 is the transient loss.
    assert t.peak_memory_bytes == 301
    assert simulate_ideal(w, link()) == dataclasses.replace(t, policy="ideal")


def test_all_keep_memory_rises_in_forward_and_falls_in_backward():
    w = chain(3)
    t = simulate(w, link(), plan_for(w, {}))
    # forward adds a0 at 0 s and a1 at 1 s; Bw(op2) drops a1 at 5 s, Bw(op1) drops a0 at 7 s.
    assert t.memory == ((0.0, 0), (0.0, 1), (0.0, 101), (1.0, 201), (5.0, 101), (7.0, 1))


# ---- the worked example of docs/simulator.md ----------------------------------------------

def test_worked_example_swap_hidden_by_backward():
    w = chain(3)
    t = simulate(w, link(), plan_for(w, {"a0": S}, {"a0": 0}, budget=201))
    assert t.step_time_s == 9.0 == t.ideal_step_time_s
    assert t.peak_memory_bytes == 201 and t.stall_copy_s == 0.0 and t.stall_memory_s == 0.0
    assert spans(t, "copy_out") == [("a0", 1.0, 2.0)]
    assert spans(t, "copy_in") == [("a0", 3.0, 4.0)]
    assert spans(t, "backward") == [("op2", 3.0, 5.0), ("op1", 5.0, 7.0), ("op0", 7.0, 9.0)]
    assert (t.d2h_bytes, t.h2d_bytes) == (100, 100)
    # The "in use" column of the table in docs/simulator.md.
    assert t.memory == ((0.0, 0), (0.0, 1), (0.0, 101), (1.0, 201), (2.0, 101), (3.0, 201), (5.0, 101), (7.0, 1))
    assert_within_budget(t, 201)


def test_worked_example_late_prefetch_stalls_one_second():
    w = chain(3)
    t = simulate(w, link(), plan_for(w, {"a0": S}, {"a0": 1}, budget=201))
    # The trigger of step 1 fires when Bw(op2) ends at 5 s; the 1 s copy lands at 6 s.
    assert spans(t, "copy_in") == [("a0", 5.0, 6.0)]
    assert spans(t, "stall_copy") == [("op1", 5.0, 6.0)]
    assert t.stall_copy_s == 1.0 and t.step_time_s == 10.0


def test_worked_example_budget_too_small_is_infeasible():
    w = chain(3)
    with pytest.raises(InfeasiblePlanError) as info:
        simulate(w, link(), plan_for(w, {"a0": S}, {"a0": 0}), 150)
    # F(op1) needs a1 (100 B) while x (1 B) and a0 (100 B, read by op1) are on the device.
    assert (info.value.needed_bytes, info.value.budget_bytes) == (201, 150)
    assert "150 bytes" in str(info.value) and "\n" not in str(info.value)


# ---- swaps that cannot hide ---------------------------------------------------------------

def test_swap_copy_longer_than_its_slack_stalls_by_the_excess():
    w = chain(3, size_bytes=(400, 100, 100))
    # a0 (400 B) goes out at 400 B/s in [1, 2) and back at 100 B/s from the step 0 trigger at 3 s:
    # 4 s of copy against 2 s of Bw(op2), so Bw(op1) waits 2 s.
    t = simulate(w, link(d2h=400.0, h2d=100.0), plan_for(w, {"a0": S}, {"a0": 0}))
    assert spans(t, "copy_in") == [("a0", 3.0, 7.0)]
    assert t.stall_copy_s == 2.0 and t.stall_memory_s == 0.0
    assert t.step_time_s == t.ideal_step_time_s + 2.0 == 11.0
    assert spans(t, "stall_copy") == [("op1", 5.0, 7.0)]


def test_copy_latency_is_added_to_every_copy():
    w = chain(3)
    t = simulate(w, link(latency=0.5), plan_for(w, {"a0": S}, {"a0": 1}))
    # Out: 0.5 s + 1 s from 1 s. Back: issued at 5 s, lands at 6.5 s, so Bw(op1) waits 1.5 s.
    assert spans(t, "copy_out") == [("a0", 1.0, 2.5)]
    assert spans(t, "copy_in") == [("a0", 5.0, 6.5)]
    assert t.stall_copy_s == 1.5 and t.step_time_s == 10.5


def test_swapped_tensor_stays_until_both_its_copy_out_and_last_forward_use_end():
    w = chain(4)
    t = simulate(w, link(d2h=25.0), plan_for(w, {"a0": S}, {"a0": 2}))
    # The copy out takes 4 s ([1, 5)); op1, the last forward user of a0, ends at 2 s. a0 leaves at 5 s
    # (in use: x + a1 + a2 = 201 B), and comes back when step 2 is triggered (Bw(op2) ends at 8 s).
    assert spans(t, "copy_out") == [("a0", 1.0, 5.0)]
    assert (5.0, 201) in t.memory
    assert spans(t, "copy_in") == [("a0", 8.0, 9.0)]


def test_a_swap_still_on_the_device_when_needed_back_is_cancelled():
    # Behaviour changed by issue 16: the copy back used to wait for the copy out (ending at 5 s),
    # free a0, copy it back in [5, 6) and stall Bw(op1) 1 s. Now at the step-0 trigger (3 s) a0 is
    # still on the device, so its copy back is skipped and a0 stays: no copy in, no stall.
    w = chain(3)
    t = simulate(w, link(d2h=25.0), plan_for(w, {"a0": S}, {"a0": 0}))
    assert spans(t, "copy_out") == [("a0", 1.0, 5.0)]
    assert spans(t, "copy_in") == [] and t.h2d_bytes == 0 and t.d2h_bytes == 100
    assert t.stall_copy_s == 0.0 and t.step_time_s == t.ideal_step_time_s == 9.0
    # a0 never leaves before its last backward reader: x + a0 (+ a1 until Bw(op2) ends at 5 s).
    assert t.memory == ((0.0, 0), (0.0, 1), (0.0, 101), (1.0, 201), (5.0, 101), (7.0, 1))


def test_a_copy_queued_behind_another_launches_while_it_runs():
    """Launch latency overlaps for queued copies (docs/simulator.md, an assumption, issue 16).

    op0 makes a (ends 1 s), op1 makes b (ends 2.25 s), op2 reads both (2.25-4.25 s); 0.5 s latency,
    100 B/s. a goes out on an idle stream: bytes from 1.5 s, ends 2.5 s. b, queued at 2.25 s, starts
    back to back at 2.5 s and moves bytes from max(2.5, 2.25 + 0.5) = 2.75 s: a quarter second of
    its latency hidden, ends 3.75 s. At the step-0 trigger (4.25 s) a goes back on an idle stream
    (bytes from 4.75 s, ends 5.75 s); b, queued since 4.25 s, follows back to back with its whole
    latency hidden: 5.75-6.75 s. Bw(op2) waits 2.5 s; with latency paid by every copy it was 3 s.
    """
    w = dag([("op0", ["x"], ["a"]), ("op1", ["x"], ["b"]), ("op2", ["a", "b"], ["y"])],
            {"x": 1, "a": 100, "b": 100, "y": 1}, {"x": ["op0", "op1"], "a": ["op2"], "b": ["op2"]},
            fwd_time_s={"op0": 1.0, "op1": 1.25, "op2": 2.0})
    t = simulate(w, link(latency=0.5), plan_for(w, {"a": S, "b": S}, {"a": 0, "b": 0}))
    assert spans(t, "copy_out") == [("a", 1.0, 2.5), ("b", 2.5, 3.75)]
    assert spans(t, "copy_in") == [("a", 4.25, 5.75), ("b", 5.75, 6.75)]
    assert t.stall_copy_s == 2.5 and t.step_time_s == t.ideal_step_time_s + 2.5 == 12.75


# ---- recompute -----------------------------------------------------------------------------

def test_recompute_adds_its_producers_forward_time():
    w = chain(3, fwd_time_s=(1.5, 1.0, 1.0))
    plan = plan_for(w, {"a0": R})
    assert dict(plan.recompute_groups) == {"op1": ("op0",)}
    t = simulate(w, link(), plan)
    assert t.recompute_time_s == 1.5 and t.step_time_s == t.ideal_step_time_s + 1.5 == 9.5 + 1.5
    assert spans(t, "recompute") == [("op0", 5.5, 7.0)]
    # a0 leaves when op1 ends (its last forward use, 2.5 s), returns with the group at 5.5 s.
    assert t.memory == ((0.0, 0), (0.0, 1), (0.0, 101), (1.5, 201), (2.5, 101), (5.5, 1), (5.5, 101), (9.0, 1))


def test_recompute_chain_reruns_every_missing_producer():
    w = chain(4, fwd_time_s=(1.0, 2.0, 4.0, 8.0), bwd_time_s=1.0)
    plan = plan_for(w, {"a0": R, "a1": R})
    # Bw(op2) needs a1; its producer op1 needs a0, also gone: both re-run, once, before step 1.
    assert dict(plan.recompute_groups) == {"op2": ("op0", "op1")}
    t = simulate(w, link(), plan)
    assert t.recompute_time_s == 3.0 and t.step_time_s == 19.0 + 3.0
    assert spans(t, "recompute") == [("op0", 16.0, 17.0), ("op1", 17.0, 19.0)]
    # a0 stays after the group (Bw(op1) reads it next), so step 2 re-runs nothing.
    assert [e.name for e in t.events if e.kind in ("recompute", "backward") and e.step == 2] == ["op1"]
    assert t.peak_memory_bytes == 201


def test_recompute_through_a_transient_tensor():
    # op1 reads the transient s made by op0 and saves p; recomputing p re-runs op0 and op1.
    w = dag([("op0", ["x"], ["s"]), ("op1", ["s"], ["p"]), ("op2", ["p"], ["y"])],
            {"x": 1, "s": 50, "p": 100, "y": 1}, {"x": ["op0"], "p": ["op2"]},
            fwd_time_s={"op0": 0.5, "op1": 0.25, "op2": 1.0}, bwd_time_s=1.0)
    plan = plan_for(w, {"p": R})
    assert dict(plan.recompute_groups) == {"op2": ("op0", "op1")}
    t = simulate(w, link(), plan)
    assert t.recompute_time_s == 0.75 and t.step_time_s == 1.75 + 3.0 + 0.75
    assert t.peak_memory_bytes == 101  # s is transient: it takes no memory


def test_copy_back_of_a_tensor_a_group_recreated_is_counted_once():
    # op0 makes p (swapped) and q (recomputed); re-running op0 for q re-creates p while p's copy back runs.
    w = dag([("op0", ["x"], ["p", "q"]), ("op1", ["p", "q"], ["r"])],
            {"x": 1, "p": 100, "q": 100, "r": 1}, {"x": ["op0"], "p": ["op1"], "q": ["op1"]})
    plan = plan_for(w, {"p": S, "q": R}, {"p": 0})
    t = simulate(w, link(), plan)
    # Behaviour changed by issue 16: the copy back of p, which the group has just rebuilt, is dropped
    # (it used to move p's 100 B again in [2, 3)).
    assert spans(t, "recompute") == [("op0", 2.0, 3.0)] and spans(t, "copy_in") == [] and t.h2d_bytes == 0
    assert t.peak_memory_bytes == 201
    # Bw(op1) drops p and q at 5 s; before the fix p was counted twice and never left.
    assert t.memory[-1] == (5.0, 1) and t.step_time_s == 7.0



def out_of_order_workload(a0: int = 200):
    """op0: x -> a0 (swapped, read by Bw(op1)); op1: a0 -> a1 (swapped, 100 B, read by Bw(op2));
    op2: a1 -> a2 (10 B, kept, read by Bw(op3)) and k (300 B, kept, read by Bw(op2)); op3: a2 -> y."""
    return dag([("op0", ["x"], ["a0"]), ("op1", ["a0"], ["a1"]), ("op2", ["a1"], ["a2", "k"]), ("op3", ["a2"], ["y"])],
               {"x": 1, "a0": a0, "a1": 100, "a2": 10, "k": 300, "y": 1},
               {"x": ["op0"], "a0": ["op1"], "a1": ["op2"], "a2": ["op3"], "k": ["op2"]})


def test_a_copy_back_compute_waits_for_may_pass_a_head_that_does_not_fit():
    # Behaviour added by issue 16. At 200 B/s: a0 out [1, 2), a1 out [2, 2.5). Forward peaks at
    # x + a1 + a2 + k = 411 B. From the step-0 trigger (4 s) in use is 311 B (301 after Bw(op3) at
    # 6 s), so a0 (prefetch 0, head of the h2d order) never fits 420 B before step 1 ends. Bw(op2)
    # waits for a1 (prefetch 1), which fits: it goes first, [6, 6.5); the old in-order stream
    # declared the plan infeasible here. Then a0 at 8.5 s, after Bw(op2) freed a1 and k.
    w = out_of_order_workload()
    plan = plan_for(w, {"a0": S, "a1": S}, {"a0": 0, "a1": 1})
    t = simulate(w, link(d2h=200.0, h2d=200.0), plan, 420)
    assert spans(t, "copy_in") == [("a1", 6.0, 6.5), ("a0", 8.5, 9.5)]
    assert spans(t, "stall_copy") == [("op2", 6.0, 6.5), ("op1", 8.5, 9.5)]
    assert t.step_time_s == t.ideal_step_time_s + 1.5 == 13.5 and t.peak_memory_bytes == 411


def test_infeasibility_names_the_tensor_waited_for_and_its_bytes():
    # a0 (150 B) fits at the step-0 trigger and comes back early; in step 1, 451 B are in use
    # (x, k, a0) and a1 (100 B) needs 551 B of 461: nothing can free memory.
    w = out_of_order_workload(a0=150)
    plan = plan_for(w, {"a0": S, "a1": S}, {"a0": 0, "a1": 1})
    with pytest.raises(InfeasiblePlanError, match=r"the copy back of 'a1' that backward of 'op2' waits for") as info:
        simulate(w, link(d2h=200.0, h2d=200.0), plan, 461)
    assert (info.value.needed_bytes, info.value.budget_bytes) == (551, 461)

# ---- duplex --------------------------------------------------------------------------------

def skip_workload():
    """op0 makes e, which op3 reads again (a skip connection); op1 makes b (300 B), read by op2.
    e is used first in backward but copied out first, so its copy back overlaps b's copy out."""
    return dag(
        [("op0", ["x"], ["e"]), ("op1", ["e"], ["b"]), ("op2", ["b"], ["c"]), ("op3", ["c", "e"], ["y"])],
        {"x": 1, "e": 100, "b": 300, "c": 1, "y": 1},
        {"x": ["op0"], "e": ["op3"], "b": ["op2"]},
        bwd_time_s={"op0": 2.0, "op1": 2.0, "op2": 2.0, "op3": 4.0},
    )


def test_duplex_slows_a_copy_back_until_the_copy_out_ends():
    w = skip_workload()
    plan = plan_for(w, {"e": S, "b": S}, {"e": 0, "b": 0})
    t = simulate(w, link(duplex_h2d=0.5), plan)
    # b goes out in [2, 5). e comes back from 4 s: 50 B/s while b's copy is in flight (50 B by 5 s),
    # then 100 B/s for the other 50 B: it lands at 5.5 s, so Bw(op3) waits 1.5 s.
    assert spans(t, "copy_out") == [("e", 1.0, 2.0), ("b", 2.0, 5.0)]
    assert spans(t, "copy_in") == [("e", 4.0, 5.5), ("b", 5.5, 8.5)]
    assert t.stall_copy_s == 1.5 and t.step_time_s == 14.0 + 1.5
    full_duplex = simulate(w, link(), plan)
    assert spans(full_duplex, "copy_in")[0] == ("e", 4.0, 5.0) and full_duplex.stall_copy_s == 1.0


def test_duplex_slows_a_copy_out_when_a_copy_back_starts():
    w = skip_workload()
    plan = plan_for(w, {"e": S, "b": S}, {"e": 0, "b": 0})
    t = simulate(w, link(duplex_h2d=0.5, duplex_d2h=0.5), plan)
    # b moved 200 B in [2, 4) at 100 B/s; when e's copy back starts the last 100 B go at 50 B/s: 6 s.
    # e moves at 50 B/s throughout [4, 6). Both end at 6 s; Bw(op3) waits 2 s.
    assert spans(t, "copy_out")[1] == ("b", 2.0, 6.0)
    assert spans(t, "copy_in")[0] == ("e", 4.0, 6.0)
    assert t.stall_copy_s == 2.0


def test_latency_counts_as_in_flight_for_duplex():
    w = skip_workload()
    plan = plan_for(w, {"e": S, "b": S}, {"e": 0, "b": 0})
    t = simulate(w, link(duplex_h2d=0.5, latency=0.5), plan)
    # e out: [1, 2.5). b, queued at 2 s, starts back to back at 2.5 s with its latency hidden (issue 16;
    # it used to move bytes from 3 s and land at 6 s): bytes from max(2.5, 2 + 0.5) = 2.5 s, lands at
    # 5.5 s. e back issued at 4 s, bytes from 4.5 s at 50 B/s while b is in flight, until 5.5 s (50 B),
    # then 50 B at 100 B/s: lands at 6 s.
    assert spans(t, "copy_out") == [("e", 1.0, 2.5), ("b", 2.5, 5.5)]
    assert spans(t, "copy_in")[0] == ("e", 4.0, 6.0)
    assert t.stall_copy_s == 2.0


# ---- memory waits and the budget -----------------------------------------------------------

def test_forward_waits_for_a_copy_out_to_free_memory():
    w = chain(4)
    plan = plan_for(w, {"a0": S}, {"a0": 0})
    t = simulate(w, link(d2h=50.0), plan, 201)
    # a0 goes out in [1, 3); F(op2) needs 100 B more at 2 s and gets it when a0 leaves at 3 s.
    assert spans(t, "stall_memory") == [("op2", 2.0, 3.0)]
    assert t.stall_memory_s == 1.0 and t.stall_copy_s == 0.0
    # The copy back waits for memory too: issued at the step 0 trigger (5 s), it starts when Bw(op3)
    # frees a2 at 7 s; Bw(op1) needs a0 only at 9 s, so that wait costs nothing.
    assert spans(t, "copy_in") == [("a0", 7.0, 8.0)]
    assert t.step_time_s == 12.0 + 1.0
    assert_within_budget(t, 201)


def test_copy_and_memory_stalls_are_counted_apart():
    w = chain(4)
    t = simulate(w, link(d2h=50.0, h2d=25.0), plan_for(w, {"a0": S}, {"a0": 1}), 201)
    # Out [1, 3): F(op2) waits 1 s for memory. Back: trigger of step 1 at 7 s, 4 s copy -> 11 s; Bw(op1)
    # could start at 9 s: 2 s copy stall.
    assert t.stall_memory_s == 1.0 and t.stall_copy_s == 2.0
    assert t.step_time_s == 12.0 + 3.0


def test_step_inputs_over_the_budget_are_infeasible():
    w = chain(3, input_bytes=500)
    with pytest.raises(InfeasiblePlanError) as info:
        simulate(w, link(), plan_for(w, {}), 400)
    assert (info.value.needed_bytes, info.value.budget_bytes) == (500, 400)


def test_copy_back_blocked_for_good_is_infeasible():
    # a0 (read by op1's backward, step 2) is prefetched at step 0; a1 (op2's backward, step 1) at step 1.
    # The in-order h2d stream brings a0 back first (4 s to 7 s); then a1 needs 300 B more than the 301 B
    # budget allows, and only Bw(op2), which waits for a1, could free anything.
    w = dag([("op0", ["x"], ["a0"]), ("op1", ["a0"], ["m"]), ("op2", ["m"], ["a1"]), ("op3", ["a1"], ["y"])],
            {"x": 1, "a0": 300, "m": 100, "a1": 300, "y": 1}, {"x": ["op0"], "a0": ["op1"], "a1": ["op2"]})
    plan = plan_for(w, {"a0": S, "a1": S}, {"a0": 0, "a1": 1})
    assert simulate(w, link(d2h=400.0), plan).peak_memory_bytes == 601
    with pytest.raises(InfeasiblePlanError) as info:
        simulate(w, link(d2h=400.0), plan, 301)
    assert (info.value.needed_bytes, info.value.budget_bytes) == (601, 301)
    assert "copy back of 'a1'" in str(info.value)
    # Prefetching a0 at step 2, where it is used, lets a1 go first: the plan fits.
    late = simulate(w, link(d2h=400.0), plan_for(w, {"a0": S, "a1": S}, {"a0": 2, "a1": 1}), 301)
    assert late.peak_memory_bytes == 301


def test_recompute_needing_memory_that_never_frees_is_infeasible():
    w = chain(3)
    with pytest.raises(InfeasiblePlanError) as info:
        simulate(w, link(), plan_for(w, {"a0": R, "a1": R}), 100)
    # x (1 B) is on the device; F(op0) needs a0 (100 B).
    assert info.value.needed_bytes == 101
    assert "forward of 'op0'" in str(info.value)


def test_swapping_everything_fits_a_budget_of_one_tensor_plus_inputs():
    w = chain(5)
    actions = {f"a{i}": S for i in range(4)}
    t = simulate(w, link(d2h=200.0, h2d=200.0), plan_for(w, actions), 201)
    assert_within_budget(t, 201)
    assert (t.d2h_bytes, t.h2d_bytes) == (400, 400)


# ---- determinism ---------------------------------------------------------------------------

def test_same_inputs_give_identical_timelines():
    w = skip_workload()
    plan = plan_for(w, {"e": S, "b": R}, {"e": 0})
    first = simulate(w, link(duplex_h2d=0.5, latency=0.25), plan, 500)
    second = simulate(w, link(duplex_h2d=0.5, latency=0.25), plan, 500)
    assert first == second
    assert json.dumps(first.to_dict()) == json.dumps(second.to_dict())


def test_explicit_budget_overrides_the_plans_budget():
    w = chain(3)
    plan = plan_for(w, {}, budget=10**6)
    assert simulate(w, link(), plan).budget_bytes == 10**6
    with pytest.raises(InfeasiblePlanError):
        simulate(w, link(), plan, 150)


def test_shared_setup_gives_the_tasks_and_waits_of_the_plain_computation():
    """The simulator shares per-workload tasks and reader lists between runs (sim/setup.py, setup_of):
    on random plans its tasks and the swapped tensors each op waits for equal those made afresh from
    the plan, as the simulator made them before, and the timeline equals a run with nothing shared."""
    import math
    import random

    from slackswap.hardware import PRESETS
    from slackswap.plans import Action
    from slackswap.schedule import make_plan
    from slackswap.sim import setup as sim_setup
    from slackswap.sim import simulator as sim_module
    from slackswap.workloads.models import build_model_workload

    hw = PRESETS["a100-80gb-pcie4"]
    workload = build_model_workload("llama-7b", hw, layers=2)
    n = len(workload.ops)
    names = [t.name for t in workload.saved_tensors if t.producer is not None]
    rng = random.Random(11)
    grouped = swapped_any = 0
    for _ in range(30):
        actions = {t: rng.choice([Action.SWAP, Action.RECOMPUTE]) for t in names if rng.random() < 0.4}
        plan = make_plan(workload, actions, policy="test", budget_bytes=None, hardware=hw)
        run = sim_module._Simulation(workload, hw, plan, math.inf)
        groups = plan.schedule.group_at_step()
        plain = [("forward", i, -1, False, False) for i in range(n)]
        for k in range(n):
            group = groups[k].ops if k in groups else ()
            plain += [("recompute", workload.op_index[g], k, j == 0, j == len(group) - 1) for j, g in enumerate(group)]
            plain.append(("backward", n - 1 - k, k, not group, False))
        assert [(t.kind, t.op_index, t.step, t.first_of_step, t.last_of_group) for t in run.tasks] == plain
        swapped = {t for t, a in plan.actions.items() if a is Action.SWAP}
        assert run.swapped_bwd_reads == [tuple(t for t in workload.bwd_reads[op.name] if t in swapped)
                                         for op in workload.ops]
        assert run.swapped_inputs == [tuple(t for t in op.inputs if t in swapped) for op in workload.ops]
        shared = simulate(workload, hw, plan, math.inf)
        sim_setup.SETUPS.clear()
        assert simulate(workload, hw, plan, math.inf) == shared
        grouped += bool(groups)
        swapped_any += any(run.swapped_inputs) and any(run.swapped_bwd_reads)
    assert grouped > 15 and swapped_any > 15
