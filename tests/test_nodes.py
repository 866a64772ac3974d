"""Node presets: GPUs sharing PCIe switch uplinks and host memory, simulated rank by rank."""

from __future__ import annotations

import dataclasses

import pytest

from slackswap.errors import InfeasiblePlanError, UnknownNameError, ValidationError
from slackswap.hardware import PRESETS, get_hardware
from slackswap.nodes import NODES, get_node
from slackswap.plans import Action
from slackswap.schedule import make_plan
from slackswap.sim import simulate
from slackswap.sim.node import simulate_node
from slackswap.units import GB
from slackswap.workloads.synthetic import chain

DGX = NODES["dgx-a100"]
# One switch of a DGX A100 on its own: two GPUs behind one 24 GB/s uplink, whose 44 GB/s node total
# (half of the whole node's, not reached by two GPUs) never binds.
PAIR = dataclasses.replace(DGX, name="dgx-a100-pair", gpus=2, sockets=1)
SIZE = 12 * 10**9  # a0, swapped: 0.5 s alone on a 24 GB/s uplink, 1 s when two GPUs share it
LAT = PRESETS["a100-80gb-pcie4"].copy_latency_s


def _swap_a0():
    w = chain(3, size_bytes=SIZE)
    return w, make_plan(w, {"a0": Action.SWAP}, policy="manual", budget_bytes=None)


def _copy_out(timeline):
    (event,) = [e for e in timeline.events if e.kind == "copy_out"]
    return event


def _rates(result):
    return [SIZE / (out.end_s - out.start_s - LAT) for out in map(_copy_out, result.timelines)]


def test_two_gpus_on_one_switch_each_swap_at_half_the_uplink_while_both_copy():
    w, plan = _swap_a0()
    assert PAIR.gpus_per_switch == 2 and PAIR.switch_uplink_bytes_per_s == 24 * GB
    assert _rates(simulate_node(w, PAIR, plan)) == pytest.approx([12 * GB] * 2, rel=1e-9)  # lockstep
    # DGX H100 (no node total measured): every pair of a switch copying together gets half of 50 GB/s.
    h100 = NODES["dgx-h100"]
    assert _rates(simulate_node(w, h100, plan)) == pytest.approx([h100.switch_uplink_bytes_per_s / 2] * 8, rel=1e-9)
    # Each rank's step over before the next starts: every GPU copies alone at its whole link.
    assert _rates(simulate_node(w, DGX, plan, skew_s=20.0)) == pytest.approx([24 * GB] * 8, rel=1e-9)


def test_all_eight_gpus_of_a_dgx_a100_copying_get_the_5_to_6_gb_s_each_nvbandwidth_measured():
    # nvbandwidth issue #11: 5-6 GB/s per GPU with all eight copying, not the 12 GB/s switch share.
    w, plan = _swap_a0()
    rates = _rates(simulate_node(w, DGX, plan))
    assert rates == pytest.approx([44 * GB / 8] * 8, rel=1e-9)
    assert all(5 * GB <= r <= 6 * GB for r in rates)
    # Four GPUs (the first two switches) copying together: 11 GB/s each, the node total binding before
    # the switches' 12 GB/s.
    assert DGX.copy_rate_bytes_per_s("h2d", 2, 4, 4) == 11 * GB
    assert DGX.copy_rate_bytes_per_s("d2h", 2, 2, 2) == 12 * GB


def test_a_copy_slows_when_its_switch_neighbour_starts_and_speeds_up_when_it_ends():
    w, plan = _swap_a0()
    skew = 0.25
    result = simulate_node(w, PAIR, plan, skew_s=skew)
    first, second = _copy_out(result.timelines[0]), _copy_out(result.timelines[1])
    # Rank 0 copies alone from 1 s + latency until rank 1 starts its copy at 1.25 s (global), then
    # at half rate; rank 1 moves at half rate until rank 0 is done, then alone at the full rate.
    alone_bytes = 24 * GB * (skew - LAT)
    end0 = 1.0 + skew + (SIZE - alone_bytes) / (12 * GB)
    assert first.end_s == pytest.approx(end0, rel=1e-12)
    shared_bytes = 12 * GB * (end0 - (1.0 + skew + LAT))
    end1 = end0 + (SIZE - shared_bytes) / (24 * GB)
    assert second.end_s + skew == pytest.approx(end1, rel=1e-12)


def test_lockstep_ranks_match_one_rank_on_the_lockstep_share_and_planners_see_that_share():
    w, plan = _swap_a0()
    share = get_hardware("dgx-a100")
    assert (share.d2h_bytes_per_s, share.h2d_bytes_per_s) == (5.5 * GB, 5.5 * GB)  # 44 GB/s over eight
    assert share.pinned_host_bytes == 1024 * 10**9 // 4  # four ranks share a socket's 1 TB
    one = simulate(w, share, plan)
    result = simulate_node(w, DGX, plan)
    assert [t.step_time_s for t in result.timelines] == pytest.approx([one.step_time_s] * 8, rel=1e-12)
    # GH200: each GPU has its own C2C link, so nothing is shared.
    gh = get_hardware("gh200-x4")
    assert (gh.d2h_bytes_per_s, gh.h2d_bytes_per_s) == (PRESETS["gh200-c2c"].d2h_bytes_per_s,
                                                         PRESETS["gh200-c2c"].h2d_bytes_per_s)


def test_pinned_host_memory_of_all_ranks_is_checked_against_the_socket():
    w = chain(3, size_bytes=200 * 10**9)
    plan = make_plan(w, {"a0": Action.SWAP}, policy="manual", budget_bytes=None)
    result = simulate_node(w, DGX, plan, skew_s=1e3)
    assert result.pinned_host_bytes_per_socket == 4 * 200 * 10**9  # four ranks per socket: 0.8 of its 1 TB
    heavy = make_plan(w, {"a0": Action.SWAP, "a1": Action.SWAP}, policy="manual", budget_bytes=None)
    with pytest.raises(InfeasiblePlanError, match="4 ranks per socket pin .* of host memory"):
        simulate_node(w, DGX, heavy)


def test_node_errors():
    w, plan = _swap_a0()
    with pytest.raises(ValidationError, match="skew"):
        simulate_node(w, DGX, plan, skew_s=-1.0)
    with pytest.raises(UnknownNameError, match="choose one of dgx-a100"):
        get_node("dgx-z")
    with pytest.raises(UnknownNameError, match="a node \\(dgx-a100"):
        get_hardware("dgx-z")


def test_reproduce_node_rows_run_the_paper_policies_on_the_rank_share_and_skip_layouts_that_do_not_split():
    from slackswap.experiments.reproduce import _node_rows
    from slackswap.workloads.models import build_model_workload

    def build(model, hw, **layout):
        heads = 8 if model == "even" else 6
        return build_model_workload("custom", hw, layers=2, hidden=48 * heads // 6, heads=heads, ffn=128, vocab=64,
                                    seq_len=32, micro_batch=1, **layout)

    rows = _node_rows(("even", "odd"), "dgx-a100", 0.5, build, None, policies=("swap-only", "full-recompute"))
    assert [(r["model"], r["layout"], "skipped" in r) for r in rows] == [
        ("even", "one model per GPU", False), ("even", "t=8 with sequence parallelism", False),
        ("odd", "one model per GPU", False), ("odd", "t=8 with sequence parallelism", True)]
    assert rows[0]["copy_bytes_per_s"] == 5.5 * GB and list(rows[0]["policies"]) == ["swap-only", "full-recompute"]
    assert rows[0]["policies"]["full-recompute"]["fits"] and rows[1]["unconstrained_peak_bytes"] < rows[0]["unconstrained_peak_bytes"] / 4
    assert "not divisible by tensor_parallel (8)" in rows[3]["skipped"]
    assert rows[1]["workload"].startswith("custom[") and "tensor_parallel=8" in rows[1]["workload"]


def test_cli_node_names_are_checked_and_hardware_takes_a_node(capsys, tmp_path):
    from slackswap.cli import main

    assert main(["reproduce", "--node", "dgx-z", "--quiet"]) == 2
    assert "unknown node 'dgx-z'" in capsys.readouterr().err
    assert main(["export-workload", "--model", "gpt2-xl", "--layers", "1", "--hardware", "dgx-a100",
                 "--out", str(tmp_path / "w.json"), "--quiet"]) == 0


def test_cli_simulate_runs_every_rank_of_a_node(capsys):
    import json

    from slackswap.cli import main

    assert main(["simulate", "--model", "gpt2-xl", "--layers", "4", "--hardware", "dgx-a100", "--policy", "slackswap",
                 "--budget", "0.8", "--node-skew", "0", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    ranks = data["node"]["rank_step_times_s"]
    assert len(ranks) == 8 and data["node"]["step_time_s"] == max(ranks) and data["d2h_bytes"] > 0
    assert ranks == pytest.approx([data["step_time_s"]] * 8, rel=1e-9)  # lockstep: each rank as the single one
    assert main(["simulate", "--model", "gpt2-xl", "--layers", "1", "--node-skew", "0"]) == 2
    assert "--node-skew needs a node preset" in capsys.readouterr().err
