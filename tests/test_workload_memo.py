"""Answers remembered per workload (selection.workload_memo): the knapsack's and slackswap-paper's
are the plain computation's, and a caller changing what it got back changes no later answer."""

from __future__ import annotations

from pathlib import Path

from slackswap.hardware import PRESETS
from slackswap.planners.common import facts_for
from slackswap.planners.selection import keep_all_peak_bytes, knapsack_min_time, knapsack_min_time_of
from slackswap.planners.selective_recompute import plan_selective_recompute, selective_plan
from slackswap.planners.slackswap_paper import paper_plan, plan_slackswap_paper
from slackswap.sim import simulate_ideal
from slackswap.workload import Workload

HW = PRESETS["a100-80gb-pcie4"]
PROFILED = Path(__file__).parent / "profiled"


def test_remembered_knapsack_answers_are_the_plain_ones():
    facts = facts_for(Workload.load(PROFILED / "hf-llama.json"))
    names = list(facts.candidates)
    total = keep_all_peak_bytes(facts)
    for share in (0.1, 0.4, 0.7, 1.5):  # 1.5: more than every candidate holds (None)
        for subset in (names, names[::2]):
            need = int(share * total)
            want = knapsack_min_time_of(facts, subset, need)
            first = knapsack_min_time(facts, subset, need)
            assert first == want
            if first:
                first.clear()  # the caller's list, not the remembered one
            assert knapsack_min_time(facts, subset, need) == want


def test_the_remembered_paper_plan_is_the_plain_one():
    # Remembered per link too: on a link a quarter as fast the paper swaps less and recomputes more.
    w = Workload.load(PROFILED / "example-llama.json")
    budget = int(0.7 * simulate_ideal(w, HW).peak_memory_bytes)
    slow = HW.replace(d2h_bytes_per_s=HW.d2h_bytes_per_s / 4, h2d_bytes_per_s=HW.h2d_bytes_per_s / 4)
    plans = []
    for hardware in (HW, slow):
        remembered = plan_slackswap_paper(w, hardware, budget)
        assert plan_slackswap_paper(w, hardware, budget) is remembered
        assert remembered == paper_plan(w, hardware, budget)
        plans.append(remembered)
    assert plans[0].actions != plans[1].actions


def test_the_remembered_selective_plan_is_the_plain_one():
    # Per budget: at 50 % hf-gpt2 recomputes both of its blocks, at 70 % one.
    w = Workload.load(PROFILED / "hf-gpt2.json")
    peak = simulate_ideal(w, HW).peak_memory_bytes
    plans = []
    for fraction in (0.5, 0.7):
        budget = int(fraction * peak)
        remembered = plan_selective_recompute(w, HW, budget)
        assert plan_selective_recompute(w, HW, budget) is remembered
        assert remembered == selective_plan(w, HW, budget)
        plans.append(remembered)
    assert plans[0].actions != plans[1].actions
