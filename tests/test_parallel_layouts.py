"""Parallel layouts in the transformer builder: tensor, sequence, context and pipeline parallelism
and grouped-query attention, checked against Korthikanti et al. (arXiv 2205.05198) and by hand."""

from __future__ import annotations

import itertools
import json

import pytest

from slackswap.cli import main
from slackswap.errors import ValidationError
from slackswap.hardware import PRESETS
from slackswap.planners import plan_workload
from slackswap.planners.common import block_layers
from slackswap.planners.selective_recompute import core_attention_actions
from slackswap.sim import simulate_ideal
from slackswap.units import GB
from slackswap.workload import Workload
from slackswap.workloads.models import MODELS, closed_form_saved_bytes, model_spec
from slackswap.workloads.spec import TransformerSpec
from slackswap.workloads.transformer import build_transformer

HW = PRESETS["a100-80gb-pcie4"]

# Korthikanti et al. Table 3: heads, hidden, layers; s = 2048, V = 51200, f = 4h, GELU, LayerNorm,
# dropout; activations with eager attention as the paper counts them.
KORTHIKANTI = {"22B": (64, 6144, 48), "175B": (96, 12288, 96), "530B": (128, 20480, 105), "1T": (160, 25600, 128)}


def _korthikanti(heads: int, hidden: int, *, t: int, sp: bool, layers: int = 1) -> TransformerSpec:
    return TransformerSpec(name="k", layers=layers, hidden=hidden, heads=heads, ffn=4 * hidden, vocab=51200,
                           seq_len=2048, micro_batch=1, attention="eager", tensor_parallel=t, sequence_parallel=sp)


def _layer_bytes(w: Workload, layer: int, skip: set[str] = frozenset()) -> tuple[int, int]:
    """(saved bytes made by ``layer``'s ops except norm statistics and ``skip``, the norm statistics)."""
    ops = {op.name for op in w.ops if op.layer == layer}
    made = [t for t in w.saved_tensors if t.producer in ops and t.name not in skip]
    stats = sum(t.size_bytes for t in made if t.name.endswith(".stats"))
    return sum(t.size_bytes for t in made) - stats, stats


@pytest.mark.parametrize("model", list(KORTHIKANTI))
@pytest.mark.parametrize("sp", [False, True])
def test_per_layer_bytes_at_t8_are_korthikanti_eq_2_and_3_and_table_2_selective(model, sp):
    a, h, _ = KORTHIKANTI[model]
    t, s, b = 8, 2048, 1
    w = build_transformer(_korthikanti(a, h, t=t, sp=sp), HW)
    sbh = s * b * h
    # Eq. 2 (tensor parallel): sbh(10 + 24/t + 5as/(ht)); Eq. 3 (with sequence parallel): sbh(34 + 5as/h)/t.
    # Kept as integers: 5as^2b/t and the sbh terms are exact at these sizes.
    expected = (10 * sbh + 24 * sbh // t if not sp else 34 * sbh // t) + 5 * a * s * s * b // t
    got, stats = _layer_bytes(w, 0)
    assert got == expected
    assert abs(got + stats - expected) / expected < 1e-3  # the fp32 norm statistics slackswap adds
    # Table 2, selective activation recompute: the 5as/h term goes, sbh(10 + 24/t) or 34sbh/t remain.
    recomputed = set(core_attention_actions(w))
    kept, _ = _layer_bytes(w, 0, skip=recomputed)
    assert kept == (10 * sbh + 24 * sbh // t if not sp else 34 * sbh // t)


def test_builder_matches_the_closed_form_for_layouts_and_stages():
    for spec_kwargs in itertools.product(("flash", "eager"), (1, 2), (False, True), (1, 2), ((1, 0), (2, 0), (2, 1)),
                                         (False, True)):
        attention, t, sp, cp, (pp, stage), post_norm = spec_kwargs
        if sp and t == 1:
            continue
        spec = TransformerSpec(name="c", layers=4, hidden=64, heads=4, ffn=256, vocab=101, seq_len=32, micro_batch=2,
                               attention=attention, kv_heads=2, tensor_parallel=t, sequence_parallel=sp,
                               context_parallel=cp, pipeline_parallel=pp, pipeline_stage=stage, post_norm=post_norm)
        w = build_transformer(spec, HW)
        assert w.saved_bytes == closed_form_saved_bytes(spec)["total"], spec_kwargs
        assert simulate_ideal(w, HW).peak_memory_bytes == w.saved_bytes


def _op(w: Workload, name: str):
    return w.ops[w.op_index[name]]


def test_collectives_have_ring_bytes_and_bus_bandwidth_times():
    t = 8
    spec = _korthikanti(64, 6144, t=t, sp=False)
    w = build_transformer(spec, HW)
    th = 2048 * 6144 * 2
    ring = 2 * (t - 1) / t * th  # an all-reduce sends 2(t-1)/t of the tensor through each rank's link
    allreduce = _op(w, "L0.attn_allreduce")
    assert (allreduce.kind, allreduce.bytes_accessed) == ("all_reduce", ring)
    assert allreduce.fwd_time_s == ring / (200 * GB) and allreduce.bwd_time_s == 0
    # Megatron's f: identity forward; backward all-reduce of the input gradient, overlapped with the
    # weight-gradient GEMM (half of the QKV GEMM's backward), so only any excess adds time.
    f, qkv = _op(w, "L0.qkv_f"), _op(w, "L0.qkv")
    assert f.fwd_time_s == 0.0 and f.bwd_time_s == max(0.0, ring / (200 * GB) - qkv.bwd_time_s / 2)
    slow_link = build_transformer(spec, HW.replace(collective_bytes_per_s=10 * GB))
    f, qkv = _op(slow_link, "L0.qkv_f"), _op(slow_link, "L0.qkv")
    assert f.bwd_time_s == pytest.approx(ring / (10 * GB) - qkv.bwd_time_s / 2, rel=1e-12) and f.bwd_time_s > 0
    assert [op.kind for op in w.ops if op.layer == 0].count("all_reduce") == 4
    sp = build_transformer(spec.replace(sequence_parallel=True), HW.replace(collective_bytes_per_s=10 * GB))
    gather, scatter, fc1 = _op(sp, "L0.mlp_allgather"), _op(sp, "L0.mlp_reduce_scatter"), _op(sp, "L0.fc1")
    assert gather.bytes_accessed == scatter.bytes_accessed == (t - 1) / t * th
    # The all-gather keeps the s/t shard and gathers it again in backward (behind the input-gradient
    # GEMM) and reduce-scatters the input gradient (behind the weight-gradient GEMM).
    one = (t - 1) / t * th / (10 * GB)
    assert gather.fwd_time_s == one
    assert gather.bwd_time_s == pytest.approx(2 * max(0.0, one - fc1.bwd_time_s / 2), rel=1e-12)
    assert scatter.bwd_time_s == one  # the row-parallel output's backward all-gather is not overlapped
    assert sp.tensor_by_name["L0.norm2_out"].bwd_readers == ("L0.mlp_allgather",)
    assert sp.tensor_by_name["L0.norm2_out"].size_bytes == th // t


def test_full_recompute_re_runs_the_tensor_parallel_collectives():
    w = build_transformer(_korthikanti(64, 6144, t=8, sp=True, layers=2), HW)
    plan = plan_workload(w, HW, w.saved_bytes, "full-recompute")
    rerun = {name for group in plan.recompute_groups.values() for name in group}
    kinds = {_op(w, name).kind for name in rerun}
    assert {"all_gather", "reduce_scatter"} <= kinds
    collective_s = sum(_op(w, n).fwd_time_s for n in rerun if _op(w, n).kind in ("all_gather", "reduce_scatter"))
    assert collective_s > 0


def test_grouped_query_attention_shrinks_k_and_v_and_the_qkv_gemm():
    spec = MODELS["llama-3-8b"].replace(layers=1)
    w = build_transformer(spec, HW)
    T, h, kv = spec.tokens, spec.hidden, 8 * 128
    assert w.tensor_by_name["L0.k"].size_bytes == w.tensor_by_name["L0.v"].size_bytes == 2 * T * kv
    assert w.tensor_by_name["L0.q"].size_bytes == 2 * T * h
    assert _op(w, "L0.qkv").flops == 2.0 * T * h * (h + 2 * kv)
    tp = build_transformer(spec.replace(tensor_parallel=4), HW)
    assert tp.tensor_by_name["L0.k"].size_bytes == 2 * T * kv // 4
    assert tp.tensor_by_name["logits"].size_bytes == 2 * T * 128256 // 4


def test_context_parallel_rank_holds_its_share_of_the_sequence_and_gathers_k_and_v():
    spec = MODELS["llama-7b"].replace(layers=1, context_parallel=4)
    w = build_transformer(spec, HW)
    T = spec.tokens // 4
    assert w.tensor_by_name["L0.q"].size_bytes == 2 * T * 4096
    gather = _op(w, "L0.kv_allgather")
    assert w.tensor_by_name["L0.k"].bwd_readers == ("L0.kv_allgather",)
    assert gather.bytes_accessed == 3 / 4 * 2 * (2 * spec.tokens * 4096)
    one = build_transformer(spec.replace(context_parallel=1), HW)
    assert _op(w, "L0.flash_attn").flops == _op(one, "L0.flash_attn").flops / 4


def test_pipeline_stage_i_of_p_holds_p_minus_i_micro_batches():
    spec = MODELS["gpt2-xl"].replace(layers=8, pipeline_parallel=4)
    one_micro_batch_layers = closed_form_saved_bytes(spec)["per_layer"] * 2
    for stage in range(4):
        w = build_transformer(spec.replace(pipeline_stage=stage), HW)
        cf = closed_form_saved_bytes(spec.replace(pipeline_stage=stage))
        assert cf["micro_batches"] == 4 - stage
        assert len(block_layers(w)) == 2 * (4 - stage)  # each micro-batch's two layers are blocks of their own
        assert w.saved_bytes - cf["embedding"] * (4 - stage) - cf["head"] - cf["loss"] == (4 - stage) * one_micro_batch_layers
        assert ("embed" in " ".join(op.name for op in w.ops)) == (stage == 0)
        assert (("loss" in w.op_index) or ("mb0.loss" in w.op_index)) == (stage == 3)
    first = build_transformer(spec.replace(pipeline_stage=0), HW)
    assert first.ops[0].name == "mb0.embed" and "mb3.L1.mlp_residual" in first.op_index


def test_layout_errors_name_the_field_and_the_fix():
    base = MODELS["llama-7b"]
    for changes, words in (
        (dict(tensor_parallel=3), "heads (32) is not divisible by tensor_parallel (3)"),
        (dict(kv_heads=5), "kv_heads is 5"),
        (dict(sequence_parallel=True), "turn it off (--no-sp)"),
        (dict(pipeline_parallel=5), "layers (32) is not divisible by pipeline_parallel (5)"),
        (dict(pipeline_parallel=2, pipeline_stage=2), "use 0 to 1"),
    ):
        with pytest.raises(ValidationError, match=words.replace("(", r"\(").replace(")", r"\)")):
            base.replace(**changes)
    no_link = HW.replace(collective_bytes_per_s=None)
    with pytest.raises(ValidationError, match="collective_bytes_per_s"):
        build_transformer(base.replace(layers=1, tensor_parallel=2), no_link)


def test_spec_json_carries_the_layout():
    spec = MODELS["llama-2-70b"].replace(pipeline_parallel=4, pipeline_stage=1, context_parallel=2)
    again = TransformerSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again == spec
    assert TransformerSpec.from_dict({**MODELS["gpt2-xl"].to_dict(), "kv_heads": None}) == MODELS["gpt2-xl"]


def test_cli_export_writes_the_per_rank_workload(tmp_path, capsys):
    out = tmp_path / "rank.json"
    code = main(["export-workload", "--model", "llama-3-8b", "--layers", "2", "--tp", "4", "--sp", "--kv-heads", "4",
                 "--cp", "2", "--pp", "2", "--pp-stage", "1", "--out", str(out), "--quiet"])
    assert code == 0
    w = Workload.load(out)
    expected = model_spec("llama-3-8b", layers=2, tensor_parallel=4, sequence_parallel=True, kv_heads=4,
                          context_parallel=2, pipeline_parallel=2, pipeline_stage=1)
    assert w.saved_bytes == closed_form_saved_bytes(expected)["total"]
    assert w.meta["model"]["tensor_parallel"] == 4 and "L1.x" in w.tensor_by_name
    capsys.readouterr()
    assert main(["simulate", "--model", "gpt2-xl", "--tp", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not divisible by tensor_parallel (3)" in err[0]
