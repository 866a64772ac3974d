"""One planning call's searches share their simulations (search.shared_simulations, opened by
registry.plan_workload): the same plan is simulated once per call, the memo does not outlive the
call, and searches of another budget or link keep their own."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from slackswap.hardware import PRESETS
from slackswap.planners import plan_workload
from slackswap.planners import common
from slackswap.planners.search import Search, shared_simulations
from slackswap.sim import simulate_ideal
from slackswap.workload import Workload

HW = PRESETS["a100-80gb-pcie4"]
PROFILED = Path(__file__).parent / "profiled"


def test_searches_in_one_call_share_a_memo_and_only_there():
    w = Workload.load(PROFILED / "hf-vit.json")
    other_link = dataclasses.replace(HW, d2h_bytes_per_s=HW.d2h_bytes_per_s / 2)
    with shared_simulations():
        first, second = Search(w, HW, 1000, "a"), Search(w, HW, 1000, "b")
        assert first.memo is second.memo
        assert Search(w, HW, 2000, "a").memo is not first.memo
        assert Search(w, other_link, 1000, "a").memo is not first.memo
        assert Search(Workload.load(PROFILED / "hf-vit.json"), HW, 1000, "a").memo is not first.memo
    assert Search(w, HW, 1000, "a").memo is not Search(w, HW, 1000, "a").memo


def test_a_slackswap_call_simulates_fewer_plans_and_plans_the_same(monkeypatch):
    # slackswap plans HF ViT with the other heuristics as starts (rule 6), and recompute-optimal
    # sizes the same recompute-only plans as slackswap's rule 1: shared, those are simulated once.
    from slackswap.planners.slackswap import plan_slackswap

    w = Workload.load(PROFILED / "hf-vit.json")
    budget = int(0.5 * simulate_ideal(w, HW).peak_memory_bytes)
    seen: list = []
    real = common.simulate

    def counting(workload, hardware, plan, budget_bytes, **kwargs):
        seen.append((budget_bytes, tuple(plan.actions.values()), tuple(sorted(plan.prefetch_step.items()))))
        return real(workload, hardware, plan, budget_bytes, **kwargs)

    monkeypatch.setattr(common, "simulate", counting)
    alone = plan_slackswap(w, HW, budget)  # every search with its own memo
    simulated_alone, repeats_alone = len(seen), len(seen) - len(set(seen))
    seen.clear()
    shared = plan_workload(w, HW, budget, "slackswap")
    assert shared == alone
    assert repeats_alone >= 8 and len(seen) <= simulated_alone - 8
