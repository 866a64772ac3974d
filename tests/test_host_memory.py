"""Pinned host memory (slackswap.memory.host): what a plan needs, the simulator's refusal, and
planners that keep to a hardware's limit."""

from __future__ import annotations

import pytest

from slackswap import Action, Hardware, get_hardware, make_plan
from slackswap.errors import BudgetError, InfeasiblePlanError, ValidationError
from slackswap.memory.host import fit_host_memory, pinned_host_bytes_for
from slackswap.planners import plan_workload
from slackswap.sim import simulate
from slackswap.workloads.synthetic import chain

LINK = dict(name="link", peak_flops_per_s=1e12, gemm_efficiency=1.0, attention_efficiency=1.0,
            hbm_bytes_per_s=1e12, hbm_efficiency=1.0, hbm_capacity_bytes=10**9, d2h_bytes_per_s=100.0,
            h2d_bytes_per_s=100.0, copy_latency_s=0.0)


def test_a_plan_needs_its_swapped_bytes_in_64_byte_slots():
    w = chain(4, size_bytes=[100, 64, 1, 50])  # saved: a0 (100 B), a1 (64 B), a2 (1 B)
    plan = make_plan(w, {"a0": Action.SWAP, "a1": Action.SWAP, "a2": Action.SWAP}, policy="hand", budget_bytes=None)
    assert pinned_host_bytes_for(w, plan) == 128 + 64 + 64


def test_simulate_refuses_a_plan_that_needs_more_host_memory():
    w = chain(3)
    plan = make_plan(w, {"a0": Action.SWAP}, policy="hand", budget_bytes=None)
    simulate(w, Hardware(**LINK, pinned_host_bytes=128), plan)  # a0: 100 B in a 128 B slot
    with pytest.raises(InfeasiblePlanError, match=r"swaps 128 B \(128 bytes\) to pinned host memory .* 127 B") as info:
        simulate(w, Hardware(**LINK, pinned_host_bytes=127), plan)
    assert (info.value.needed_bytes, info.value.budget_bytes) == (128, 127)


def test_swaps_that_do_not_fit_the_host_become_recomputes_cheapest_per_byte_first():
    # a0 is rebuilt by op0 (1 s for 100 B), a1 by op1 (3 s for 100 B): a0 goes first.
    w = chain(3, fwd_time_s=[1.0, 3.0, 1.0])
    plan = make_plan(w, {"a0": Action.SWAP, "a1": Action.SWAP}, policy="hand", budget_bytes=None)
    fitted = fit_host_memory(w, Hardware(**LINK, pinned_host_bytes=128), plan)
    assert fitted.actions["a0"] is Action.RECOMPUTE and fitted.actions["a1"] is Action.SWAP
    assert "1 swaps turned into recomputes" in fitted.info["host_memory"]
    assert fit_host_memory(w, Hardware(**LINK), plan) is plan


def test_planners_keep_to_the_host_limit():
    hw = get_hardware("a100-80gb-pcie4")
    from slackswap.workloads.models import build_model_workload

    w = build_model_workload("gpt2-xl", hw, layers=2)
    peak = simulate(w, hw, make_plan(w, {}, policy="ideal", budget_bytes=None)).peak_memory_bytes
    free = plan_workload(w, hw, int(0.85 * peak), "capuchin")
    swapped = pinned_host_bytes_for(w, free)
    assert swapped > 0
    limited = hw.replace(pinned_host_bytes=swapped // 2)
    plan = plan_workload(w, limited, int(0.85 * peak), "capuchin")
    assert pinned_host_bytes_for(w, plan) <= swapped // 2
    assert simulate(w, limited, plan).peak_memory_bytes <= int(0.85 * peak)
    # No host memory: every swap is recomputed instead, which fits 85 % of the peak but not 75 %.
    tiny = hw.replace(pinned_host_bytes=1)
    plan = plan_workload(w, tiny, int(0.85 * peak), "capuchin")
    assert pinned_host_bytes_for(w, plan) == 0 and plan.count(Action.RECOMPUTE) > free.count(Action.RECOMPUTE)
    with pytest.raises(BudgetError, match="with at most 1 B of pinned host memory"):
        plan_workload(w, tiny, int(0.75 * peak), "capuchin")


def test_hardware_files_carry_the_limit_only_when_set():
    hw = get_hardware("a100-80gb-pcie4")
    assert "pinned_host_bytes" not in hw.to_dict()
    limited = hw.replace(pinned_host_bytes=2**30)
    assert Hardware.from_dict(limited.to_dict()) == limited
    with pytest.raises(ValidationError, match="pinned_host_bytes"):
        hw.replace(pinned_host_bytes=0)


def test_cli_host_memory_flag(capsys, tmp_path):
    from slackswap.cli import main

    w = chain(3)
    path, plan_path = tmp_path / "w.json", tmp_path / "p.json"
    w.save(path)
    make_plan(w, {"a0": Action.SWAP}, policy="hand", budget_bytes=None).save(plan_path, w)
    assert main(["simulate", "--workload", str(path), "--plan", str(plan_path), "--host-memory", "128"]) == 0
    capsys.readouterr()
    code = main(["simulate", "--workload", str(path), "--plan", str(plan_path), "--host-memory", "100"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "to pinned host memory" in err
