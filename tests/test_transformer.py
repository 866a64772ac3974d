"""The op-level transformer builder: saved bytes against the published formulas, roofline
op times worked out by hand, and recompute chains that rebuild what a real step rebuilds."""

from __future__ import annotations

import itertools
from collections import defaultdict

import pytest

from slackswap.hardware import PRESETS
from slackswap.plans import Action
from slackswap.schedule import make_plan
from slackswap.workloads.models import MODELS, closed_form_saved_bytes
from slackswap.workloads.spec import TransformerSpec
from slackswap.workloads.transformer import build_transformer

HW = PRESETS["a100-80gb-pcie4"]


def saved_bytes_by_layer(workload) -> dict[int, int]:
    """Saved bytes grouped by the layer of the ops whose backward reads them."""
    by_layer: dict[int, int] = defaultdict(int)
    for t in workload.saved_tensors:
        layers = {workload.ops[workload.op_index[r]].layer for r in t.bwd_readers}
        assert len(layers) == 1, f"{t.name} is read by the backward of several layers: {layers}"
        by_layer[layers.pop()] += t.size_bytes
    return dict(by_layer)


def small(**changes) -> TransformerSpec:
    base = dict(name="custom", layers=3, hidden=64, heads=4, ffn=256, vocab=97, seq_len=32, micro_batch=2)
    base.update(changes)
    return TransformerSpec(**base)


# ---- saved bytes per layer, formulas computed here by hand ----------------------------------

@pytest.mark.parametrize("model", ["bert-large", "gpt2-xl"])
def test_eager_layer_saves_korthikanti_sbh_34_plus_5as_over_h(model):
    spec = MODELS[model].replace(attention="eager")
    s, b, h, a = spec.seq_len, spec.micro_batch, spec.hidden, spec.heads
    korthikanti = s * b * h * 34 + 5 * a * s * s * b  # sbh(34 + 5as/h), kept in integers
    layernorm_stats = 2 * 8 * s * b  # two LayerNorms, fp32 mean + rstd per token
    by_layer = saved_bytes_by_layer(build_transformer(spec, HW))
    assert [by_layer[i] for i in range(spec.layers)] == [korthikanti + layernorm_stats] * spec.layers


@pytest.mark.parametrize("model", ["bert-large", "gpt2-xl"])
def test_flash_layer_saves_34sbh_plus_fp32_lse(model):
    spec = MODELS[model]
    assert spec.attention == "flash"
    s, b, h, a = spec.seq_len, spec.micro_batch, spec.hidden, spec.heads
    expected = 34 * s * b * h + 4 * a * s * b + 2 * 8 * s * b  # Q,K,V,O + LSE + LayerNorm stats
    by_layer = saved_bytes_by_layer(build_transformer(spec, HW))
    assert [by_layer[i] for i in range(spec.layers)] == [expected] * spec.layers


def test_llama_layer_saves_16Th_6Tf_lse_and_rmsnorm_rstd():
    spec = MODELS["llama-7b"]
    T, h, f, a = spec.tokens, spec.hidden, spec.ffn, spec.heads
    expected = 16 * T * h + 6 * T * f + 4 * a * T + 2 * 4 * T
    by_layer = saved_bytes_by_layer(build_transformer(spec, HW))
    assert [by_layer[i] for i in range(spec.layers)] == [expected] * spec.layers
    # about 32.2 Th per layer (reference sec. 2) plus the small LSE and rstd terms
    assert expected / (T * h) == pytest.approx(32.2, abs=0.1)


def test_eager_without_dropout_keeps_one_copy_of_the_probabilities():
    spec = small(attention="eager", dropout=False)
    T, h, f, a, s, b = spec.tokens, spec.hidden, spec.ffn, spec.heads, spec.seq_len, spec.micro_batch
    # 34Th less the two Th masks, probabilities 2as^2b shared by softmax and P.V backward
    expected = 32 * T * h + 2 * a * s * s * b + 16 * T
    assert f == 4 * h
    by_layer = saved_bytes_by_layer(build_transformer(spec, HW))
    assert by_layer[0] == expected


@pytest.mark.parametrize(
    "attention,mlp,norm,dropout,post_norm,rope",
    list(itertools.product(("eager", "flash"), ("gelu", "swiglu"), ("layernorm", "rmsnorm"),
                           (True, False), (True, False), (True, False))),
)
def test_builder_matches_closed_form_for_every_variant(attention, mlp, norm, dropout, post_norm, rope):
    spec = small(attention=attention, mlp=mlp, norm=norm, dropout=dropout, post_norm=post_norm, rope=rope)
    w = build_transformer(spec, HW)
    closed = closed_form_saved_bytes(spec)
    by_layer = saved_bytes_by_layer(w)
    assert [by_layer[i] for i in range(spec.layers)] == [closed["per_layer"]] * spec.layers
    assert by_layer[-1] == closed["embedding"]
    assert by_layer[spec.layers] == closed["head"] + closed["loss"]
    assert w.saved_bytes == closed["total"]


def test_saved_tensors_of_one_gpt_layer_with_eager_attention():
    spec = small(attention="eager")
    w = build_transformer(spec, HW)
    th, tf, t = 2 * spec.tokens * spec.hidden, 2 * spec.tokens * spec.ffn, spec.tokens
    scores = spec.heads * spec.seq_len**2 * spec.micro_batch
    saved = {n.name: (n.size_bytes, n.bwd_readers) for n in w.saved_tensors
             if n.bwd_readers[0].startswith("L1.")}
    assert saved == {
        "L1.x": (th, ("L1.norm1",)),
        "L1.norm1_out": (th, ("L1.qkv",)),
        "L1.norm1.stats": (8 * t, ("L1.norm1",)),
        "L1.q": (th, ("L1.qk_bmm",)),
        "L1.k": (th, ("L1.qk_bmm",)),
        "L1.v": (th, ("L1.pv_bmm",)),
        "L1.probs": (2 * scores, ("L1.softmax",)),
        "L1.attn_dropout.mask": (scores, ("L1.attn_dropout",)),
        "L1.probs_dropped": (2 * scores, ("L1.pv_bmm",)),
        "L1.ctx": (th, ("L1.out_proj",)),
        "L1.attn_residual.mask": (th // 2, ("L1.attn_residual",)),
        "L1.h1": (th, ("L1.norm2",)),
        "L1.norm2_out": (th, ("L1.fc1",)),
        "L1.norm2.stats": (8 * t, ("L1.norm2",)),
        "L1.fc1_out": (tf, ("L1.gelu",)),
        "L1.act": (tf, ("L1.fc2",)),
        "L1.mlp_residual.mask": (th // 2, ("L1.mlp_residual",)),
    }


# ---- transient tensors and recompute chains ------------------------------------------------

def test_scores_and_branch_outputs_are_transient():
    w = build_transformer(small(attention="eager"), HW)
    for name in ("L0.scores", "L0.attn_out", "L0.mlp_out"):
        assert w.tensor_by_name[name].bwd_readers == ()
    assert w.tensor_by_name["L0.probs"].bwd_readers == ("L0.softmax",)
    assert w.tensor_by_name["L0.probs_dropped"].bwd_readers == ("L0.pv_bmm",)


def recompute_group(workload, recompute: list[str], backward_op: str) -> tuple[str, ...]:
    plan = make_plan(workload, {n: Action.RECOMPUTE for n in recompute}, policy="test", budget_bytes=None)
    return plan.recompute_groups[backward_op]


def test_softmax_output_is_rebuilt_from_q_and_k_through_qk_bmm():
    w = build_transformer(small(attention="eager"), HW)
    assert recompute_group(w, ["L1.probs"], "L1.softmax") == ("L1.qk_bmm", "L1.softmax")


def test_gelu_output_is_rebuilt_from_the_fc1_output_and_further_back_when_that_is_gone():
    w = build_transformer(small(), HW)
    assert recompute_group(w, ["L1.act"], "L1.fc2") == ("L1.gelu",)
    assert recompute_group(w, ["L1.act", "L1.fc1_out"], "L1.fc2") == ("L1.fc1", "L1.gelu")


def test_rotated_q_is_rebuilt_through_qkv_and_rope():
    w = build_transformer(MODELS["llama-7b"].replace(layers=2), HW)
    assert w.tensor_by_name["L0.q_prerope"].bwd_readers == ()
    assert recompute_group(w, ["L0.q"], "L0.flash_attn") == ("L0.qkv", "L0.rope")


def test_flash_output_is_rebuilt_by_rerunning_the_attention_kernel():
    w = build_transformer(small(), HW)
    # O is read by the flash backward (delta = rowsum(dO * O)) and by the out-proj weight gradient
    assert w.tensor_by_name["L2.ctx"].bwd_readers == ("L2.flash_attn", "L2.out_proj")
    assert recompute_group(w, ["L2.ctx"], "L2.out_proj") == ("L2.flash_attn",)


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("attention", ["eager", "flash"])
def test_every_saved_tensor_can_be_recomputed_from_resident_tensors(model, attention):
    w = build_transformer(MODELS[model].replace(attention=attention), HW)
    everything = {t.name: Action.RECOMPUTE for t in w.saved_tensors if t.producer is not None}
    plan = make_plan(w, everything, policy="all-recompute", budget_bytes=None)
    rerun = {op for group in plan.recompute_groups.values() for op in group}
    # every op that produces a saved tensor is re-run at least once
    assert {w.tensor_by_name[n].producer for n in everything} <= rerun


# ---- roofline times ---------------------------------------------------------------------------

def test_fc1_is_compute_bound_and_gelu_memory_bound_worked_by_hand():
    spec = MODELS["gpt2-xl"]
    w = build_transformer(spec, HW)
    T, h, f = spec.tokens, spec.hidden, spec.ffn
    flop_rate = 312e12 * 0.60
    byte_rate = 2039e9 * 0.80

    fc1 = w.ops[w.op_index["L0.fc1"]]
    fc1_flops = 2 * T * h * f
    fc1_bytes = 2 * (T * h + h * f + T * f)
    assert (fc1.flops, fc1.bytes_accessed) == (fc1_flops, fc1_bytes)
    assert fc1_flops / flop_rate > fc1_bytes / byte_rate
    assert fc1.fwd_time_s == pytest.approx(fc1_flops / flop_rate, rel=1e-12)
    assert fc1.bwd_time_s == pytest.approx(2 * fc1_flops / flop_rate, rel=1e-12)

    gelu = w.ops[w.op_index["L0.gelu"]]
    gelu_bytes = 2 * (2 * T * f)  # read FC1 output, write GELU output, bf16
    assert (gelu.flops, gelu.bytes_accessed) == (8 * T * f, gelu_bytes)
    assert gelu_bytes / byte_rate > 8 * T * f / flop_rate
    assert gelu.fwd_time_s == pytest.approx(gelu_bytes / byte_rate, rel=1e-12)
    assert gelu.bwd_time_s == pytest.approx(2 * gelu_bytes / byte_rate, rel=1e-12)


def test_flash_attention_time_uses_attention_efficiency_and_halves_flops_when_causal():
    spec = MODELS["gpt2-xl"]
    causal = build_transformer(spec, HW).ops
    full = build_transformer(spec.replace(causal=False), HW).ops
    op_c = next(op for op in causal if op.name == "L0.flash_attn")
    op_f = next(op for op in full if op.name == "L0.flash_attn")
    s, b, h = spec.seq_len, spec.micro_batch, spec.hidden
    assert op_f.flops == 4 * b * s * s * h
    assert op_c.flops == op_f.flops / 2
    attention_rate = 312e12 * 0.50
    assert op_f.fwd_time_s == pytest.approx(op_f.flops / attention_rate, rel=1e-12)
    assert op_f.bwd_time_s == pytest.approx(2.5 * op_f.flops / attention_rate, rel=1e-12)


def test_eager_attention_does_full_score_flops_even_when_causal():
    spec = small(attention="eager", causal=True)
    w = build_transformer(spec, HW)
    s, b, h = spec.seq_len, spec.micro_batch, spec.hidden
    assert w.ops[w.op_index["L0.qk_bmm"]].flops == 2 * b * s * s * h
    assert w.ops[w.op_index["L0.pv_bmm"]].flops == 2 * b * s * s * h


def test_faster_hardware_gives_shorter_op_times():
    slow = build_transformer(MODELS["llama-7b"], PRESETS["a100-80gb-pcie4"])
    fast = build_transformer(MODELS["llama-7b"], PRESETS["h200-pcie5"])
    assert fast.ideal_step_time_s < slow.ideal_step_time_s
    assert [t.size_bytes for t in fast.tensors] == [t.size_bytes for t in slow.tensors]


def test_op_order_of_a_pre_norm_and_a_post_norm_layer():
    pre = build_transformer(small(attention="eager", rope=True), HW)
    assert [op.name for op in pre.ops if op.layer == 0] == [
        "L0.norm1", "L0.qkv", "L0.rope", "L0.qk_bmm", "L0.softmax", "L0.attn_dropout", "L0.pv_bmm",
        "L0.out_proj", "L0.attn_residual", "L0.norm2", "L0.fc1", "L0.gelu", "L0.fc2", "L0.mlp_residual",
    ]
    post = build_transformer(small(post_norm=True, mlp="swiglu"), HW)
    assert [op.name for op in post.ops if op.layer == 0] == [
        "L0.qkv", "L0.flash_attn", "L0.out_proj", "L0.attn_residual", "L0.norm1", "L0.gate_up",
        "L0.swiglu", "L0.down", "L0.mlp_residual", "L0.norm2",
    ]
    assert [op.name for op in post.ops if op.layer in (-1, 3)] == [
        "embed", "embed_norm", "embed_dropout", "head_dense", "head_act", "final_norm", "lm_head", "loss",
    ]
