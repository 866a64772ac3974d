"""What bounds `slackswap` with more budget or a faster link on workloads too large for its exact
search (issue 17, item 5; docs/planners.md, "More bandwidth, more budget").

There a faster link or a larger budget can give a slower plan (benchmarks/results/monotone-models.md
lists the pairs). What is proven holds on those pairs too: rule 1's link-free floor copies nothing,
so it is the same plan and step on every link, and the answer is never slower than it on any link.
So the step on the faster link, or at the larger budget, is bounded by a figure that does not depend
on the link: step(B, any link) <= step(floor(B)). These tests check it on pairs of the built-in
bert-large that got slower in the re-measured table, at the inputs on both sides.
"""

from __future__ import annotations

import pytest

from slackswap.hardware import PRESETS
from slackswap.planners import plan_workload
from slackswap.planners.search import Search
from slackswap.planners.slackswap import POLICY, link_free_floor
from slackswap.sim import simulate, simulate_ideal
from slackswap.workloads.models import build_model_workload

HW = PRESETS["a100-80gb-pcie4"]


def _step_s(workload, hardware, budget: int) -> float:
    return simulate(workload, hardware, plan_workload(workload, hardware, budget, "slackswap"), budget).step_time_s


def _floor(workload, hardware, budget: int):
    return link_free_floor(Search(workload, hardware, budget, POLICY))


@pytest.fixture(scope="module")
def bert():
    workload = build_model_workload("bert-large", HW)
    return workload, simulate_ideal(workload, HW).peak_memory_bytes


def test_a_faster_link_stays_within_the_link_free_floor(bert):
    workload, peak = bert
    budget = int(0.3 * peak)
    faster = HW.replace(h2d_bytes_per_s=HW.h2d_bytes_per_s * 1.1)
    floors = [_floor(workload, link, budget) for link in (HW, faster)]
    # The floor copies nothing: the same plan and the same step on both links.
    assert dict(floors[0].plan.actions) == dict(floors[1].plan.actions)
    assert floors[0].step_time_s == floors[1].step_time_s
    assert floors[0].timeline.d2h_bytes == 0 and floors[0].timeline.h2d_bytes == 0
    for link in (HW, faster):
        assert _step_s(workload, link, budget) <= floors[0].step_time_s


def test_a_larger_budget_stays_within_its_floor(bert):
    workload, peak = bert
    for pct in (44, 45):
        budget = int(peak * pct / 100)
        assert _step_s(workload, HW, budget) <= _floor(workload, HW, budget).step_time_s
