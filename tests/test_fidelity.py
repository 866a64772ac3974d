"""Modelled step times against Korthikanti et al. (arXiv 2205.05198) measurements on A100 at t = 8."""

from __future__ import annotations

import pytest

from slackswap.hardware import PRESETS
from slackswap.memory.parameters import transformer_parameters
from slackswap.planners import plan_workload
from slackswap.sim import simulate
from slackswap.workloads.spec import TransformerSpec
from slackswap.workloads.transformer import build_transformer

HW = PRESETS["a100-80gb-pcie4"]
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
CORE = ("qk_bmm", "softmax", "attn_dropout", "pv_bmm")
# Table 3: heads, hidden, layers, pipeline stages (t = 8, s = 2048, V = 51200); Table 5: iteration
# time with full recompute over that with sequence parallelism + selective recompute.
KORTHIKANTI = {"22B": (64, 6144, 48, 1), "175B": (96, 12288, 96, 8), "530B": (128, 20480, 105, 35),
               "1T": (160, 25600, 128, 64)}
TABLE_5 = {"22B": 1.291, "175B": 1.319, "530B": 1.297, "1T": 1.321}
# Table 3: global batch size and micro-batch size of each configuration.
TABLE_3_BATCH = {"22B": (4, 4), "175B": (64, 1), "530B": (280, 1), "1T": (512, 1)}
# HBM bytes per parameter of one step of Megatron-LM's mixed-precision optimizer (megatron/core/optimizer:
# unscale and inf check of the fp32 gradients, read and write 8; gradient-norm clipping, read 4; apex
# FusedAdam, read gradient, master weight and both moments and write the last three, 28; copy of the master
# weights to the 16-bit ones, read 4 and write 2; zeroing of the fp32 gradient buffer, write 4).
OPTIMIZER_STEP_BYTES_PER_PARAMETER = 8 + 4 + 28 + 6 + 4


def _spec(model: str, *, sp: bool, layers: int | None = None, micro_batch: int = 1) -> TransformerSpec:
    a, h, L, p = KORTHIKANTI[model]
    return TransformerSpec(name=model, layers=layers or L, hidden=h, heads=a, ffn=4 * h, vocab=51200, seq_len=2048,
                           micro_batch=micro_batch, attention="eager", tensor_parallel=8, sequence_parallel=sp,
                           pipeline_parallel=1 if layers else p, pipeline_stage=0 if layers else p - 1)


def test_22b_layer_backward_over_forward_and_recompute_costs_match_table_4():
    w = build_transformer(_spec("22B", sp=False, layers=2), HW)
    ops = [op for op in w.ops if op.layer == 0]
    fwd = sum(op.fwd_time_s for op in ops)
    bwd = sum(op.bwd_time_s for op in ops)
    # Table 4 (22B, t = 8, A100): forward 7.7 ms, backward 11.9 ms per layer; full recompute +7.6 ms.
    assert bwd / fwd == pytest.approx(11.9 / 7.7, rel=0.05)
    assert fwd / (fwd + bwd) == pytest.approx(7.6 / (7.7 + 11.9), rel=0.05)
    # The backward collectives hide behind the GEMMs (Megatron overlaps them); the forward ones do not.
    assert sum(op.bwd_time_s for op in ops if op.kind in COLLECTIVES) == 0
    assert sum(op.fwd_time_s for op in ops if op.kind in COLLECTIVES) > 0.1 * fwd


def test_22b_selective_recompute_reruns_the_core_with_the_product_with_v_as_megatron_does():
    """Megatron checkpoints the core attention as one function, so its recompute re-runs P.V too."""
    w = build_transformer(_spec("22B", sp=False, layers=2, micro_batch=4), HW)
    plan = plan_workload(w, HW, w.saved_bytes, "selective-recompute")
    assert all(g.ops[-1].endswith("pv_bmm") for g in plan.schedule.recompute_groups)
    ideal = simulate(w, HW, plan_workload(w, HW, w.saved_bytes, "ideal")).step_time_s
    overhead_s = (simulate(w, HW, plan).step_time_s - ideal) / 2
    core_fwd_s = sum(op.fwd_time_s for op in w.ops if op.layer == 0 and op.name.split(".")[-1] in CORE)
    assert overhead_s == pytest.approx(core_fwd_s, rel=1e-9)
    # Table 4 (22B, t = 8, b = 4, A100): selective recompute adds 1.3 ms per layer (13.2 ms backward
    # against 11.9 ms). Without P.V the model gave 0.71x of that.
    assert overhead_s == pytest.approx(1.3e-3, rel=0.2)


def _iteration_s(model: str, *, sp: bool, policy: str) -> float:
    """One iteration of Table 5 as the last pipeline stage runs it: with m micro-batches through p
    stages, 1F1B takes m + p - 1 micro-batch slots (Narayanan et al. arXiv 2104.04473 sec. 2.2),
    each one modelled step of the stage; then the optimizer step over the rank's parameters."""
    global_batch, micro_batch = TABLE_3_BATCH[model]
    p = KORTHIKANTI[model][3]
    spec = _spec(model, sp=sp, micro_batch=micro_batch)
    w = build_transformer(spec, HW)
    step_s = simulate(w, HW, plan_workload(w, HW, w.saved_bytes, policy)).step_time_s
    optimizer_s = (transformer_parameters(spec).total * OPTIMIZER_STEP_BYTES_PER_PARAMETER
                   / (HW.hbm_efficiency * HW.hbm_bytes_per_s))
    return (global_batch // micro_batch + p - 1) * step_s + optimizer_s


@pytest.mark.parametrize("model", list(KORTHIKANTI))
def test_full_over_selective_recompute_iteration_time_is_table_5_within_5_percent(model):
    """Table 5 compares Megatron's full-recompute baseline (tensor and pipeline parallelism, as in
    Table 4's "baseline with recompute" row) with the paper's work: sequence parallelism and selective
    recompute together. The model runs the same two configurations, as whole iterations."""
    selective = _iteration_s(model, sp=True, policy="selective-recompute")
    full = _iteration_s(model, sp=False, policy="full-recompute")
    assert full / selective == pytest.approx(TABLE_5[model], rel=0.05)
    # Read instead as sequence parallelism under both, the ratio is within 5 % too.
    assert _iteration_s(model, sp=True, policy="full-recompute") / selective == pytest.approx(TABLE_5[model], rel=0.05)
