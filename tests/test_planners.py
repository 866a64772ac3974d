"""Every policy on tiny workloads whose best plan is known by hand, the registry and the minimum budget."""

from __future__ import annotations

import pytest

from slackswap.errors import BudgetError, UnknownNameError
from slackswap.hardware import Hardware
from slackswap.planners import PLANNERS, get_planner, lowest_memory_plan, minimum_budget_bytes, plan_workload
from slackswap.plans import Action
from slackswap.sim import simulate
from slackswap.workload import Op, Tensor, Workload
from slackswap.workloads.synthetic import chain


def slow_link(**changes) -> Hardware:
    """A link so slow (1 byte/s) that no copy ever hides: swapping only stalls."""
    base = dict(name="slow-link", peak_flops_per_s=1e12, gemm_efficiency=0.5, attention_efficiency=0.5,
                hbm_bytes_per_s=1e12, hbm_efficiency=0.8, hbm_capacity_bytes=10**12,
                d2h_bytes_per_s=1.0, h2d_bytes_per_s=1.0, copy_latency_s=0.0)
    base.update(changes)
    return Hardware(**base)


def fast_link() -> Hardware:
    """A link fast enough (1e6 bytes/s on 100-byte tensors: 0.1 ms) that every copy hides."""
    return slow_link(name="fast-link", d2h_bytes_per_s=1e6, h2d_bytes_per_s=1e6)


def step_time(workload, hw, plan):
    return simulate(workload, hw, plan, plan.budget_bytes).step_time_s


# chain(4): x(1 B) -> op0 -> a0 -> op1 -> a1 -> op2 -> a2 -> op3 -> a3 (transient).
# Saved: x (input, 1 B) and a0, a1, a2 (100 B each); keep-all peak 301 B; ideal step 4 x 1 s + 4 x 2 s = 12 s.
CHAIN = chain(4)


def test_registry_lists_every_policy_and_rejects_unknown_names():
    assert set(PLANNERS) == {"ideal", "full-recompute", "selective-recompute", "recompute-optimal", "swap-only",
                             "capuchin", "slackswap-paper", "slackswap", "optimal"}
    with pytest.raises(UnknownNameError, match="choose one of ideal, full-recompute"):
        get_planner("nope")


def test_minimum_budget_of_a_chain_is_one_tensor_plus_input():
    # Forward: op i holds its input and output (200 B) but a0's producer op0 reads only x:
    # at op1, a0 and a1 are live (200 B). Backward of op i+1 reads a_i only (100 B).
    assert minimum_budget_bytes(CHAIN) == 1 + 200


def test_minimum_budget_is_reached_by_the_lowest_memory_plan_and_not_below():
    hw = fast_link()
    for workload in (CHAIN, chain(5, size_bytes=[10, 200, 30, 40, 50])):
        minimum = minimum_budget_bytes(workload)
        timeline = simulate(workload, hw, lowest_memory_plan(workload, minimum), minimum)
        assert timeline.peak_memory_bytes == minimum
        from slackswap.errors import InfeasiblePlanError
        with pytest.raises(InfeasiblePlanError):
            simulate(workload, hw, lowest_memory_plan(workload, minimum - 1), minimum - 1)


def test_budget_below_the_minimum_is_one_clear_error():
    with pytest.raises(BudgetError) as info:
        plan_workload(CHAIN, fast_link(), 200, "slackswap")
    message = str(info.value)
    assert "201 bytes" in message and "0.668 of the unconstrained peak of 301 bytes" in message
    assert "\n" not in message and info.value.minimum_bytes == 201


def test_ideal_keeps_everything_and_ignores_the_budget():
    plan = plan_workload(CHAIN, fast_link(), 250, "ideal")
    assert plan.budget_bytes is None and plan.count(Action.KEEP) == 4


def test_recompute_optimal_recomputes_the_one_cheap_tensor():
    # Producer times 1, 5, 9 s: a0 is by far the cheapest to rebuild, and 100 B must come off.
    w = chain(4, fwd_time_s=[1.0, 5.0, 9.0, 1.0])
    plan = plan_workload(w, slow_link(), 201, "recompute-optimal")
    assert {n for n, a in plan.actions.items() if a is Action.RECOMPUTE} == {"a0"}
    assert step_time(w, slow_link(), plan) == pytest.approx(w.ideal_step_time_s + 1.0)


def test_recompute_knapsack_beats_the_greedy_order_when_it_should():
    # Need 200 B off. Cheapest per byte first takes a1 (100 B, 1 s) then a0 (200 B, 3 s): 4 s.
    # The knapsack takes a0 alone: 3 s.
    from slackswap.planners.common import facts_for
    from slackswap.planners.selection import cheapest_per_byte, knapsack_min_time

    w = chain(4, fwd_time_s=[3.0, 1.0, 2.9, 1.0], size_bytes=[200, 100, 100, 1])
    facts = facts_for(w)
    assert facts.recompute_time_s(cheapest_per_byte(facts, facts.candidates, 200)) == pytest.approx(4.0)
    assert knapsack_min_time(facts, facts.candidates, 200) == ["a0"]


def test_recompute_optimal_takes_off_no_more_than_it_must():
    # chain(5) sizes 100, 200, 100, 100: keep-all peak 501 B; at 451 B one 100 B tensor (1 s)
    # is enough (the forward pass peaks at 401 B at op3), not a1 (10 s).
    w = chain(5, fwd_time_s=[1.0, 10.0, 1.0, 1.0, 1.0], size_bytes=[100, 200, 100, 100, 1])
    plan = plan_workload(w, slow_link(), 451, "recompute-optimal")
    assert plan.count(Action.RECOMPUTE) == 1 and plan.actions["a1"] is Action.KEEP
    assert step_time(w, slow_link(), plan) == pytest.approx(w.ideal_step_time_s + 1.0)


def test_swap_only_swaps_in_forward_order_and_stalls_on_a_slow_link():
    plan = plan_workload(CHAIN, slow_link(), 201, "swap-only")
    assert [n for n, a in plan.actions.items() if a is Action.SWAP][0] == "a0"
    assert plan.count(Action.RECOMPUTE) == 0
    timeline = simulate(CHAIN, slow_link(), plan, 201)
    assert timeline.stall_time_s > 100  # 100 B at 1 B/s cannot hide behind 1-2 s ops


@pytest.mark.parametrize("policy", ["slackswap", "slackswap-paper", "capuchin", "optimal"])
def test_hybrid_policies_swap_when_the_link_hides_it(policy):
    # Fast link: one 100 B copy takes 0.1 ms, hidden by 1 s ops; swapping costs nothing, so the
    # best plan runs at ideal speed.
    plan = plan_workload(CHAIN, fast_link(), 201, policy)
    assert plan.count(Action.SWAP) >= 1
    assert step_time(CHAIN, fast_link(), plan) == pytest.approx(CHAIN.ideal_step_time_s)


@pytest.mark.parametrize("policy", ["slackswap", "capuchin", "optimal"])
def test_hybrid_policies_recompute_when_the_link_is_too_slow(policy):
    # Slow link: any swap stalls for 100 s; recomputing the cheapest tensor (a0, 1 s) is best.
    w = chain(4, fwd_time_s=[1.0, 5.0, 9.0, 1.0])
    plan = plan_workload(w, slow_link(), 201, policy)
    assert plan.count(Action.SWAP) == 0
    assert step_time(w, slow_link(), plan) == pytest.approx(w.ideal_step_time_s + 1.0)


def test_slackswap_paper_swaps_the_costliest_to_rebuild_within_the_slack():
    # Five 100 B tensors with rebuild times 1, 5, 9, 2, 3 s; forward 21 s. At 10 B/s the global
    # slack carries 210 B: the two costliest per byte, a2 and a1, are swapped.
    hw = slow_link(d2h_bytes_per_s=10.0, h2d_bytes_per_s=10.0)
    w = chain(6, fwd_time_s=[1.0, 5.0, 9.0, 2.0, 3.0, 1.0])
    plan = plan_workload(w, hw, 301, "slackswap-paper")
    assert {n for n, a in plan.actions.items() if a is Action.SWAP} == {"a1", "a2"}
    assert plan.info["slack_s"] == pytest.approx(21.0)


def layered(n_layers: int = 3) -> Workload:
    """Blocks of two ops: l{i}.a (reads the block input, makes h{i}) and l{i}.b (makes the block
    output y{i}); both save their input. An embedding at layer -1 and a head at layer n."""
    ops = [Op(name="embed", layer=-1, kind="embedding", fwd_time_s=1.0, bwd_time_s=1.0, flops=0, bytes_accessed=0,
              inputs=("tok",), outputs=("y-1",))]
    tensors = [Tensor(name="tok", size_bytes=1, producer=None, bwd_readers=("embed",))]
    for i in range(n_layers):
        ops.append(Op(name=f"l{i}.a", layer=i, kind="gemm", fwd_time_s=1.0, bwd_time_s=2.0, flops=0,
                      bytes_accessed=0, inputs=(f"y{i - 1}",), outputs=(f"h{i}",)))
        ops.append(Op(name=f"l{i}.b", layer=i, kind="attention", fwd_time_s=1.0, bwd_time_s=2.0, flops=0,
                      bytes_accessed=0, inputs=(f"h{i}",), outputs=(f"y{i}", f"s{i}")))
        tensors.append(Tensor(name=f"y{i - 1}", size_bytes=100, producer=ops[-3].name if i else "embed",
                              bwd_readers=(f"l{i}.a",)))
        tensors.append(Tensor(name=f"h{i}", size_bytes=100, producer=f"l{i}.a", bwd_readers=(f"l{i}.b",)))
        tensors.append(Tensor(name=f"s{i}", size_bytes=50, producer=f"l{i}.b", bwd_readers=(f"l{i}.b",)))
    ops.append(Op(name="head", layer=n_layers, kind="loss", fwd_time_s=1.0, bwd_time_s=1.0, flops=0,
                  bytes_accessed=0, inputs=(f"y{n_layers - 1}",), outputs=("loss",)))
    tensors.append(Tensor(name=f"y{n_layers - 1}", size_bytes=100, producer=f"l{n_layers - 1}.b",
                          bwd_readers=("head",)))
    tensors.append(Tensor(name="loss", size_bytes=1, producer="head"))
    return Workload(name="layered", ops=tuple(ops), tensors=tuple(tensors))


def test_full_recompute_keeps_block_outputs_and_recomputes_inside():
    w = layered()
    plan = plan_workload(w, slow_link(), 10**6, "full-recompute")
    recomputed = {n for n, a in plan.actions.items() if a is Action.RECOMPUTE}
    assert recomputed == {"h0", "s0", "h1", "s1", "h2", "s2"}
    # Each block re-runs both its ops once: 3 blocks x 2 ops x 1 s.
    assert step_time(w, slow_link(), plan) == pytest.approx(w.ideal_step_time_s + 6.0)


def test_selective_recompute_drops_attention_internals_then_whole_blocks():
    w = layered()
    roomy = plan_workload(w, slow_link(), 10**6, "selective-recompute")
    # s_i is made and read only by the 'attention' op: the core-attention internals.
    assert {n for n, a in roomy.actions.items() if a is Action.RECOMPUTE} == {"s0", "s1", "s2"}
    tight = plan_workload(w, slow_link(), 560, "selective-recompute")
    assert tight.info["full_blocks"] >= 1
    assert simulate(w, slow_link(), tight, 560).peak_memory_bytes <= 560


def test_a_policy_that_cannot_reach_a_budget_says_so():
    w = layered()
    with pytest.raises(BudgetError, match="policy full-recompute cannot fit"):
        plan_workload(w, slow_link(), minimum_budget_bytes(w), "full-recompute")


def test_optimal_reports_its_milp_and_simulated_figures():
    w = chain(4, fwd_time_s=[1.0, 5.0, 9.0, 1.0])
    plan = plan_workload(w, slow_link(), 201, "optimal")
    assert plan.info["milp_objective_s"] == pytest.approx(1.0)
    assert plan.info["simulated_step_time_s"] == pytest.approx(w.ideal_step_time_s + 1.0)
    assert plan.info["milp_solve_time_s"] >= 0


def test_planning_is_deterministic():
    w = layered()
    for policy in PLANNERS:
        a = plan_workload(w, fast_link(), 600, policy)
        b = plan_workload(w, fast_link(), 600, policy)
        assert a.to_dict(w) | {"info": None} == b.to_dict(w) | {"info": None}


def test_capuchin_swaps_more_when_recompute_alone_cannot_reach_the_budget():
    # At layered()'s minimum budget no recompute-only plan fits (recompute-optimal refuses), and
    # on a 1 B/s link no copy hides. Capuchin's fallback swaps anyway, stalls and all.
    w = layered()
    budget = minimum_budget_bytes(w)
    with pytest.raises(BudgetError):
        plan_workload(w, slow_link(), budget, "recompute-optimal")
    plan = plan_workload(w, slow_link(), budget, "capuchin")
    assert plan.count(Action.SWAP) >= 1 and "stalls and all" in plan.info["rule"]
    timeline = simulate(w, slow_link(), plan, budget)
    assert timeline.peak_memory_bytes <= budget and timeline.stall_time_s > 100


def test_window_booking_answers_like_round_trip_fits():
    import random

    from slackswap.planners.common import facts_for
    from slackswap.planners.copies import WindowBooking, round_trip_fits

    w = chain(12, fwd_time_s=[0.5 + (i % 3) for i in range(12)], size_bytes=[40 + 17 * i for i in range(11)] + [1])
    hw = slow_link(d2h_bytes_per_s=120.0, h2d_bytes_per_s=100.0, copy_latency_s=0.05, duplex_h2d_factor=0.5)
    facts = facts_for(w)
    rng = random.Random(3)
    booking, booked = WindowBooking(facts, hw), []
    answers = set()
    for name in rng.sample(list(facts.candidates), len(facts.candidates)):
        for deadline in (facts.forward_time_s, None):
            fits = booking.fits(name, out_deadline_s=deadline)
            assert fits == round_trip_fits(facts, hw, booked + [name], out_deadline_s=deadline)
            answers.add(fits)
        if booking.fits(name, out_deadline_s=None):
            booking.add(name)
            booked.append(name)
    assert answers == {True, False}  # both outcomes were exercised


@pytest.mark.parametrize("d2h,h2d", [(90.0, 70.0), (40.0, 400.0)])
def test_window_booking_walks_only_what_a_copy_moves_and_answers_the_same(d2h, h2d):
    # Copies back queued behind each other from the start of backward, and copies out so slow
    # that copies back wait for them (a delay dies out at the next gap); swaps booked whether they fit or not (late copies on record), both deadlines:
    # every answer is round_trip_fits's, and the booking built one swap at a time holds what one
    # built from the whole list at once holds.
    import random

    from slackswap.planners.common import facts_for

    n = 40
    w = chain(n, fwd_time_s=[0.2 + (i % 5) * 0.3 for i in range(n)], size_bytes=[30 + (7 * i) % 50 for i in range(n - 1)] + [1])
    hw = slow_link(d2h_bytes_per_s=d2h, h2d_bytes_per_s=h2d, copy_latency_s=0.02, duplex_h2d_factor=0.6)
    facts = facts_for(w)
    rng = random.Random(7)
    answers = set()
    for trial in range(4):
        answers |= _book_in_random_order_as_the_plain_walk(facts, hw, rng, 0.1 * trial)[0]
    assert answers == {True, False}


_BOOKING_FIELDS = ("out_end_s", "out_waits", "out_transfer_s", "end_of", "back_end_s", "late", "waits",
                   "slack_after", "use_s", "transfer_s", "tail_s")


def _book_in_random_order_as_the_plain_walk(facts, hw, rng, also_late: float) -> tuple[set[bool], int]:
    """Book swaps in a random order, those that fit and a share ``also_late`` of the others, checking
    every answer of WindowBooking.fits against round_trip_fits (both deadlines) and the booking built
    one swap at a time against one built from the whole list. The answers seen, and the longest
    stretch of copies out that did not wait for their tensors."""
    from slackswap.planners.copies import WindowBooking, round_trip_fits

    answers, stretches = set(), 0
    booking, booked = WindowBooking(facts, hw), []
    for name in rng.sample(list(facts.candidates), len(facts.candidates)):
        for deadline in (facts.forward_time_s, None):
            fits = booking.fits(name, out_deadline_s=deadline)
            assert fits == round_trip_fits(facts, hw, booked + [name], out_deadline_s=deadline)
            answers.add(fits)
        if booking.fits(name, out_deadline_s=None) or rng.random() < also_late:
            booking.add(name)
            booked.append(name)
            stretches = max(stretches, max(map(len, booking.out_waits.split(b"\x01"))))
    whole = WindowBooking(facts, hw, booked)
    assert [getattr(whole, f) for f in _BOOKING_FIELDS] == [getattr(booking, f) for f in _BOOKING_FIELDS]
    return answers, stretches


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_window_booking_on_long_random_streams_answers_as_the_plain_walk(seed):
    # Long copy-out streams, busy for stretches of tens of copies between copies that wait for
    # their tensors: the booking walks such a stretch in one go (a doubling stretch at a time, up to
    # the first end as recorded). Every answer is round_trip_fits's, and the booking built one
    # swap at a time holds what one built from the whole list at once holds.
    import random

    from slackswap.planners.common import facts_for

    rng = random.Random(seed)
    n = 90
    # Bursts of quick ops with big tensors (the link falls behind) between slow ops (it catches up).
    fwd = [rng.choice((0.01, 0.02, 0.05)) if (i // 15) % 2 == 0 else rng.uniform(0.5, 1.5) for i in range(n)]
    w = chain(n, fwd_time_s=fwd, size_bytes=[rng.randint(5, 60) for _ in range(n - 1)] + [1])
    hw = slow_link(d2h_bytes_per_s=rng.uniform(60.0, 200.0), h2d_bytes_per_s=rng.uniform(60.0, 200.0),
                   copy_latency_s=0.01, duplex_h2d_factor=0.5)
    answers, stretches = _book_in_random_order_as_the_plain_walk(facts_for(w), hw, rng, 0.3)
    assert answers == {True, False}
    assert stretches > 16  # some stretch of copies out that do not wait outran the first walked stretch


def test_window_booking_lowers_the_least_slack_before_a_copy_booked_late_in_the_use_order():
    # chain(10): a8 .. a0 (100 B each) are first used 0, 2, .., 16 s into backward; copies out take
    # 0.1 ms (all end in forward, so the duplex tail stays 0) and copies back 2.5 s at 40 B/s, queued
    # from the start of backward: the k-th lands at 2.5 (k + 1) s, 2.5 + 0.5 k s after its first use.
    # Booked in use order, each commit walks only the new last copy back; the least slack from
    # every earlier position on still falls to the new copy's, as a booking built at once holds.
    from slackswap.planners.common import facts_for
    from slackswap.planners.copies import WindowBooking

    facts = facts_for(chain(10))
    hw = slow_link(d2h_bytes_per_s=1e6, h2d_bytes_per_s=40.0)
    by_use = [f"a{i}" for i in range(8, -1, -1)]
    assert [facts.first_use_s[n] for n in by_use] == [2.0 * k for k in range(9)]
    booking = WindowBooking(facts, hw)
    for k, name in enumerate(by_use):
        booking.add(name)
        assert booking.tail_s == 0.0
        assert booking.slack_after == [-(2.5 + 0.5 * k)] * (k + 1) + [float("inf")]
        assert booking.slack_after == WindowBooking(facts, hw, by_use[:k + 1]).slack_after


def test_slackswap_spill_pass_appends_swaps_whose_copies_end_in_backward():
    from slackswap.planners.common import facts_for
    from slackswap.planners.slackswap import windowed_swaps

    w = chain(4, fwd_time_s=[1.0, 0.5, 0.5, 0.5], bwd_time_s=[2.0, 2.0, 2.0, 2.0], size_bytes=[100, 100, 80, 1])
    hw = slow_link(d2h_bytes_per_s=50.0, h2d_bytes_per_s=50.0)
    facts = facts_for(w)
    # Forward ends at 2.5 s; a0's copy out runs 1 .. 3 s (0.5 s into backward); its first use is
    # step 2, 4 s into backward; the copy back (2 s) lands at 2.5 s. a1's copy would start at 3 s.
    strict = windowed_swaps(facts, hw, list(facts.candidates))
    spill = windowed_swaps(facts, hw, list(facts.candidates), spill=True)
    assert strict == [] and spill == ["a0"]


def test_optimal_reports_its_bound_objective_and_simulated_step():
    w = layered()
    plan = plan_workload(w, fast_link(), 500, "optimal")
    info = plan.info
    assert info["milp_dual_bound_s"] <= info["milp_objective_s"] + 1e-9
    assert info["milp_bound_step_time_s"] <= info["milp_predicted_step_time_s"] + 1e-9
    assert info["milp_units"] == 7  # per-op units: embed, l{i}.a and l{i}.b (the head saves nothing)
    # Fast link: every unit can be swapped, so the linear model predicts the ideal step and the
    # simulator agrees.
    assert info["milp_objective_s"] == pytest.approx(0.0, abs=1e-9)
    assert info["simulated_step_time_s"] == pytest.approx(w.ideal_step_time_s)


def sized_by_peak(monkeypatch, peak_at):
    """Replace fit_need's simulations: a plan is its need, it peaks at peak_at(need) bytes, fits
    when that is within the budget (120 B), and takes 1 s plus 1 ms per byte of need. Returns
    the search, the list of needs asked for and the family's make(need)."""
    import types

    from slackswap.planners.search import Search

    search = Search(chain(4), fast_link(), 120, "test")

    def fake_evaluate(need, *, unlimited=False):
        peak = peak_at(need)
        fits = peak <= (float("inf") if unlimited else search.budget_bytes)
        return types.SimpleNamespace(fits=fits, step_time_s=1.0 + need / 1000 if fits else float("inf"),
                                     timeline=types.SimpleNamespace(peak_memory_bytes=peak), need=need)

    monkeypatch.setattr(search, "evaluate", fake_evaluate)
    visited: list[int] = []

    def make(need: int) -> int:
        visited.append(need)
        return need

    return search, visited, make


def test_fit_need_goes_back_when_taking_more_off_raises_the_peak(monkeypatch):
    """A family's far end can peak higher than its middle (recomputing everything rebuilds long
    groups in backward). Here the peak is 200 - 2 x need up to need 60, and 300 beyond: growing
    the need by the overshoot jumps from 0 to 80, past every plan that fits a 120 B budget. The
    sizing must come back (to 40, the least need that fits) instead of growing without end, as
    it did when the 977 B / 1006 B counterexample (tests/test_invariants.py) lost its plan."""
    from slackswap.planners import selection

    def peak_at(need: int) -> int:
        return 200 - 2 * need if need < 60 else 300

    search, visited, make = sized_by_peak(monkeypatch, peak_at)
    found = selection.fit_need(search, 0, make, rounds=14)
    assert visited[:3] == [0, 80, 40]
    assert found is not None and found.need == 40 and found.timeline.peak_memory_bytes == 120


def test_fit_need_leaps_past_a_range_of_needs_that_all_raise_the_peak(monkeypatch):
    """gpt2-xl at 52 % of its peak: the first need overshoots a little, every need in the next
    2 GiB picks larger items and peaks higher, and the first need that clears lies beyond. Going
    back halfway finds nothing, so the sizing leaps past the largest need tried (1 % of the
    keep-all peak, then 2 %, 4 %, ...) instead of going back and forth in the range (before,
    it spent every round there and returned nothing); here the least need that
    clears is 10 % of the keep-all peak, and the bisection then finds exactly it."""
    from slackswap.planners import selection

    total = 10_000  # keep-all peak, B: needs are sized in steps of 1 % of it
    monkeypatch.setattr(selection, "keep_all_peak_bytes_of", lambda workload: total)
    clears_from = total // 10

    def peak_at(need: int) -> int:
        # 10 B over at the first need; in between, the more is taken off the higher the peak
        # (larger items, longer groups), 1 B more per 1 % of the keep-all peak
        return 130 if need == 0 else 131 + need // 100 if need < clears_from else 110

    search, visited, make = sized_by_peak(monkeypatch, peak_at)
    found = selection.fit_need(search, 0, make, rounds=14)
    assert found is not None and found.need == clears_from
    assert max(visited) < 2 * clears_from  # leaps double from 1 %: past 10 % without running far


def test_fit_fewer_swaps_sizes_the_longest_swap_prefix_whose_far_end_fits(monkeypatch):
    """When every accepted swap plus recomputing the rest does not fit (copies back hold memory
    rebuilds would not), the far ends of 7/8, 6/8, ... of the list are tried until one fits, the
    longest fitting prefix is bisected between that one and the next longer, and both the first
    fitting prefix and the longest are sized: both are start candidates."""
    import types

    from slackswap.planners import slackswap as planner
    from slackswap.planners.search import Search

    accepted = [f"s{i}" for i in range(80)]
    far_ends, sized = [], []

    def family(prefix):
        def make(need):
            return tuple(prefix)
        return make

    fits = [range(1, 68)]  # prefix lengths whose far end fits

    def fake_evaluate(plan, *, unlimited=False):
        far_ends.append(len(plan))
        return types.SimpleNamespace(fits=len(plan) in fits[0])

    def fake_fit_need(search, initial_need, make, **kwargs):
        prefix = make(initial_need)
        sized.append(len(prefix))
        return types.SimpleNamespace(step_time_s=1.0, prefix=prefix)

    search = Search(chain(4), fast_link(), 100, "test")
    monkeypatch.setattr(search, "evaluate", fake_evaluate)
    monkeypatch.setattr(planner, "fit_need", fake_fit_need)
    found = planner.fit_fewer_swaps(search, accepted, family)
    # down from the list: 70 does not fit, 60 does; bisect 60..70: 65 fits, 67 fits, 68 does not
    assert far_ends == [70, 60, 65, 67, 68]
    # both sized, the longest first: each is a start candidate
    assert sized == [67, 60] and [f.prefix for f in found] == [tuple(accepted[:67]), tuple(accepted[:60])]
    # nothing short enough fits: no sizing at all, and the empty prefix is never tried
    far_ends.clear()
    sized.clear()
    fits[0] = range(0)
    assert planner.fit_fewer_swaps(search, accepted, family) == []
    assert far_ends == [70, 60, 50, 40, 30, 20, 10] and sized == []
