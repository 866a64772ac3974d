"""Explain: per-layer keep / swap / recompute with slack and prices, checked on hand-worked chains."""

from __future__ import annotations

import json

import pytest

from slackswap.hardware import Hardware
from slackswap.plans import Action
from slackswap.report.explain import explain, explanation_lines
from slackswap.schedule import make_plan
from slackswap.sim import simulate
from slackswap.units import MiB
from slackswap.workload import Op, Tensor, Workload
from slackswap.workloads.synthetic import chain


def link(bytes_per_s: float, latency_s: float = 0.0) -> Hardware:
    return Hardware(
        name="test-link", peak_flops_per_s=1e12, gemm_efficiency=1.0, attention_efficiency=1.0,
        hbm_bytes_per_s=1e12, hbm_efficiency=1.0, hbm_capacity_bytes=10**12,
        d2h_bytes_per_s=bytes_per_s, h2d_bytes_per_s=bytes_per_s, copy_latency_s=latency_s,
    )


def run(workload, hardware, actions, budget=None, prefetch_step=None):
    plan = make_plan(workload, actions, policy="hand", budget_bytes=budget, hardware=hardware,
                     prefetch_step=prefetch_step)
    return explain(workload, hardware, plan, simulate(workload, hardware, plan))


def tensor(ex, name):
    return next(t for layer in ex.layers for t in layer.tensors if t.name == name)


def test_swap_that_stalls_and_recompute_priced_like_the_copy():
    # chain(4): 1 s forward, 2 s backward, 100 B tensors, 100 B/s link (see test_trace.hand_case).
    # a0's copy out runs 1-2 s, during op1's forward, so layer 0's D2H link is idle all of its
    # 1 s and layer 1's not at all. Its copy back, issued at backward step 1 (6-7 s), is waited
    # for by the recompute of op1 (the default schedule would issue it a step earlier).
    hw = link(100.0)
    ex = run(chain(4), hw, {"a0": Action.SWAP, "a1": Action.RECOMPUTE}, budget=250, prefetch_step={"a0": 1})
    l0, l1, l2, l3 = ex.layers
    assert (l0.d2h_slack_s, l0.forward_time_s) == (1.0, 1.0)
    assert (l1.d2h_slack_s, l1.forward_time_s) == (0.0, 1.0)
    assert (l1.h2d_slack_s, l1.backward_time_s) == (3.0, 3.0)  # recompute 7-8 s and backward 10-12 s
    assert (l0.kept_bytes, l0.swapped_bytes, l1.recomputed_bytes, l2.kept_bytes) == (1, 100, 100, 100)
    assert l3.tensors == ()
    one_second_per_100_bytes = 1e6 * MiB / 100  # us per MiB
    a0, a1 = tensor(ex, "a0"), tensor(ex, "a1")
    assert a0.copy_us_per_mib == pytest.approx(one_second_per_100_bytes)
    assert a1.recompute_us_per_mib == pytest.approx(one_second_per_100_bytes)
    assert a0.arrival_margin_s == 0.0 and "compute waited for its copy back" in a0.reason
    assert a1.reason.startswith("recomputed: the link had 0.0 us slack left in this layer")
    assert tensor(ex, "x").reason.startswith("step input") and tensor(ex, "x").layer == 0
    assert ex.totals["swap_bytes"] == 100 and ex.totals["recompute_count"] == 1 and ex.totals["keep_count"] == 2
    assert ex.totals["step_time_s"] == 14.0 and ex.totals["stall_copy_s"] == 1.0


def test_swap_that_lands_early_and_cheap_recompute():
    # 0.1 s forward ops: re-running a 100 B tensor costs 0.1 s, a tenth of its 1 s copy.
    # a2 is recomputed (op2 re-runs, 0.1 s, before the backward of op3); a0 is swapped. Its first
    # use is the backward of op1 at step 2; the 1 s copy is issued as late as possible, at step 1,
    # which starts at 0.4 + 0.1 + 2 = 2.5 s: it lands at 3.5 s and is read at 4.5 s, 1 s early.
    w, hw = chain(4, fwd_time_s=0.1), link(100.0)
    ex = run(w, hw, {"a0": Action.SWAP, "a2": Action.RECOMPUTE})
    a0, a1 = tensor(ex, "a0"), tensor(ex, "a2")
    assert a0.arrival_margin_s == pytest.approx(1.0)
    assert a0.reason.startswith("swapped: back 1.000 s before use")
    assert a1.recompute_us_per_mib == pytest.approx(a1.copy_us_per_mib / 10)
    assert a1.reason.startswith("recomputed: cheaper to re-run than to copy (re-run 104857")


def test_recompute_price_counts_producers_of_transient_inputs():
    # op1 makes a transient t (no backward reads it); op2 turns it into the saved a2. Rebuilding
    # a2 re-runs op1 and op2: 2 s + 3 s for 200 bytes.
    ops = (
        Op(name="op0", layer=0, kind="gemm", fwd_time_s=1.0, bwd_time_s=1.0, flops=0, bytes_accessed=0,
           inputs=("x",), outputs=("a0",)),
        Op(name="op1", layer=1, kind="elementwise", fwd_time_s=2.0, bwd_time_s=1.0, flops=0, bytes_accessed=0,
           inputs=("a0",), outputs=("t",)),
        Op(name="op2", layer=1, kind="gemm", fwd_time_s=3.0, bwd_time_s=1.0, flops=0, bytes_accessed=0,
           inputs=("t",), outputs=("a2",)),
        Op(name="op3", layer=2, kind="gemm", fwd_time_s=1.0, bwd_time_s=1.0, flops=0, bytes_accessed=0,
           inputs=("a2",), outputs=("out",)),
    )
    tensors = (
        Tensor(name="x", size_bytes=10, producer=None, bwd_readers=("op0",)),
        Tensor(name="a0", size_bytes=100, producer="op0", bwd_readers=("op1",)),
        Tensor(name="t", size_bytes=100, producer="op1"),
        Tensor(name="a2", size_bytes=200, producer="op2", bwd_readers=("op3",)),
        Tensor(name="out", size_bytes=10, producer="op3"),
    )
    w = Workload(name="transient", ops=ops, tensors=tensors)
    ex = run(w, link(100.0), {"a2": Action.RECOMPUTE})
    assert tensor(ex, "a2").recompute_us_per_mib == pytest.approx(5.0 * 1e6 * MiB / 200)
    assert [layer.layer for layer in ex.layers] == [0, 1, 2]
    assert ex.layers[1].forward_time_s == 5.0


def test_text_and_json_forms():
    ex = run(chain(4), link(100.0), {"a0": Action.SWAP, "a1": Action.RECOMPUTE}, budget=250)
    lines = explanation_lines(ex)
    assert lines[0] == "chain4 on test-link, policy hand, budget 250 B"
    assert lines[2].startswith("layer 0: keep 1 B, swap 100 B, recompute 0 B; link slack left: D2H 1.000 s of 1.000 s")
    assert any(line.split()[:3] == ["a1", "recompute", "100"] for line in lines)
    assert "layer 3" not in "\n".join(lines)  # no saved tensors there: nothing to explain
    assert lines[-2] == "totals: keep 2 tensors (101 B), swap 1 tensor (100 B), recompute 1 tensor (100 B)"
    # 12 s ideal + 1 s re-running op1; a0's copy back lands before that recompute, so no stall
    assert lines[-1].startswith("step 13.000 s (92.31% of ideal 12.000 s); peak 201 B")
    data = json.loads(json.dumps(ex.to_dict(), allow_nan=False))
    assert data["layers"][1]["tensors"][0]["action"] == "recompute"
    assert data["totals"]["throughput_pct"] == pytest.approx(100 * 12 / 13)


# ---- the CLI ------------------------------------------------------------------------------------
def test_explain_command_json_accounts_for_every_saved_tensor(tmp_path, capsys):
    from slackswap.cli import main

    w = chain(6, fwd_time_s=0.5, bwd_time_s=1.0)
    w.save(tmp_path / "w.json")
    link(100.0).save(tmp_path / "hw.json")
    code = main(["explain", "--workload", str(tmp_path / "w.json"), "--hardware", str(tmp_path / "hw.json"),
                 "--budget", "0.6", "--policy", "slackswap", "--json"])
    out, err = capsys.readouterr()
    assert code == 0 and err == ""
    data = json.loads(out)
    listed = [t["name"] for layer in data["layers"] for t in layer["tensors"]]
    assert sorted(listed) == sorted(t.name for t in w.saved_tensors)
    totals = data["totals"]
    assert totals["keep_bytes"] + totals["swap_bytes"] + totals["recompute_bytes"] == w.saved_bytes
    assert totals["peak_memory_bytes"] <= data["budget_bytes"] == int(0.6 * 501)
    assert data["policy"] == "slackswap"


def test_explain_command_text_and_bad_policy(tmp_path, capsys):
    from slackswap.cli import main

    chain(4).save(tmp_path / "w.json")
    assert main(["explain", "--workload", str(tmp_path / "w.json"), "--budget", "1.0", "--policy", "ideal"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("chain4 on a100-80gb-pcie4, policy ideal, budget 301 B\n")
    assert "totals: keep 4 tensors (301 B), swap 0 tensors (0 B), recompute 0 tensors (0 B)" in out
    assert main(["explain", "--workload", str(tmp_path / "w.json"), "--policy", "magic"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown policy 'magic'" in err


def test_explain_empty_policy_is_named_not_defaulted(tmp_path, capsys):
    from slackswap.cli import main

    chain(4).save(tmp_path / "w.json")
    assert main(["explain", "--workload", str(tmp_path / "w.json"), "--policy", ""]) == 2
    assert "unknown policy ''" in capsys.readouterr().err
