"""The built-in models, custom configurations, and the closed-form activation sizes.

Configurations come from the Hugging Face configs and micro-batches from the training recipes named
beside each model; docs/models.md explains each default. Sizes are bytes, T = seq_len x micro_batch tokens.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import UnknownNameError, ValidationError
from ..hardware import Hardware
from ..workload import Workload
from .spec import TransformerSpec
from .layout import Shapes
from .transformer import (
    ASSUMPTIONS, FP32_BYTES, INDEX_BYTES, LAYERNORM_STATS_BYTES, MASK_BYTES, RMSNORM_STATS_BYTES,
    assumptions_for, build_transformer, micro_batches_in_flight,
)

__all__ = [
    "MODELS", "MODEL_SOURCES", "ASSUMPTIONS", "CUSTOM", "get_model", "model_spec", "build_transformer",
    "build_model_workload", "closed_form_saved_bytes", "workload_label",
]

CUSTOM = "custom"

# Flash attention is the default everywhere: current training stacks (Megatron-LM, HF with
# SDPA, torchtitan) run fused attention, and eager attention's s^2 terms would make the
# activations of GPT-2 XL at s=1024 b=8 about 67 GiB (docs/models.md). Eager stays
# available as a sensitivity option (attention="eager").
MODELS: dict[str, TransformerSpec] = {
    # HF bert-large-uncased: L24 h1024 a16 f4096 V30522, post-LN, GELU, dropout 0.1, bidirectional.
    # s=512 b=16 is NVIDIA DeepLearningExamples BERT phase 2 on A100 (pretrain_config.sh
    # dgxa100_8gpu: 4096 sequences per GPU / 256 accumulation steps = 16).
    "bert-large": TransformerSpec(
        name="bert-large", layers=24, hidden=1024, heads=16, ffn=4096, vocab=30522, seq_len=512, micro_batch=16,
        attention="flash", mlp="gelu", norm="layernorm", dropout=True, causal=False, post_norm=True, rope=False,
    ),
    # HF gpt2-xl: L48 h1600 a25 f6400 V50257, n_ctx 1024, pre-LN, GELU, dropout 0.1, causal.
    # b=8 is an assumption (4-16 is usual at this size).
    "gpt2-xl": TransformerSpec(
        name="gpt2-xl", layers=48, hidden=1600, heads=25, ffn=6400, vocab=50257, seq_len=1024, micro_batch=8,
        attention="flash", mlp="gelu", norm="layernorm", dropout=True, causal=True, post_norm=False, rope=False,
    ),
    # Llama-2-7b / LLaMA-7B: L32 h4096 a32 (MHA) f11008 V32000, RMSNorm, SwiGLU, RoPE, no dropout,
    # no biases. s=2048 is LLaMA-1's context (4M-token batches); b=4 gives T=8192 like the others.
    "llama-7b": TransformerSpec(
        name="llama-7b", layers=32, hidden=4096, heads=32, ffn=11008, vocab=32000, seq_len=2048, micro_batch=4,
        attention="flash", mlp="swiglu", norm="rmsnorm", dropout=False, causal=True, post_norm=False, rope=True,
    ),
    # HF Meta-Llama-3-8B: L32 h4096 a32, 8 KV heads (GQA), f14336, V128256; pre-trained at s=8192
    # (Llama 3 paper, arXiv 2407.21783); b=1 gives T=8192 like the others.
    "llama-3-8b": TransformerSpec(
        name="llama-3-8b", layers=32, hidden=4096, heads=32, ffn=14336, vocab=128256, seq_len=8192, micro_batch=1,
        attention="flash", mlp="swiglu", norm="rmsnorm", dropout=False, causal=True, post_norm=False, rope=True,
        kv_heads=8,
    ),
    # HF Llama-2-70b: L80 h8192 a64, 8 KV heads (GQA), f28672, V32000; s=4096 (Llama 2 paper,
    # arXiv 2307.09288). Its activations do not fit one GPU (about 99 GB at b=1), so the default
    # layout is one rank of t=8 with sequence parallelism, Megatron-LM's layout within an 8-GPU node.
    "llama-2-70b": TransformerSpec(
        name="llama-2-70b", layers=80, hidden=8192, heads=64, ffn=28672, vocab=32000, seq_len=4096, micro_batch=1,
        attention="flash", mlp="swiglu", norm="rmsnorm", dropout=False, causal=True, post_norm=False, rope=True,
        kv_heads=8, tensor_parallel=8, sequence_parallel=True,
    ),
}

MODEL_SOURCES: dict[str, str] = {
    "bert-large": "HF bert-large-uncased config; NVIDIA DeepLearningExamples BERT pretrain_config.sh (phase 2)",
    "gpt2-xl": "HF gpt2-xl config; micro-batch 8 assumed",
    "llama-7b": "HF Llama-2-7b config; LLaMA paper (s=2048)",
    "llama-3-8b": "HF Meta-Llama-3-8B config; Llama 3 paper arXiv 2407.21783 (s=8192)",
    "llama-2-70b": "HF Llama-2-70b config; Llama 2 paper arXiv 2307.09288 (s=4096); t=8 with SP assumed",
}

# Keys build_model_workload accepts; the CLI flag for each is --<key with - for _>.
_REQUIRED_FOR_CUSTOM = ("layers", "hidden", "heads", "ffn", "vocab", "seq_len", "micro_batch")
_OVERRIDABLE = tuple(f.name for f in dataclasses.fields(TransformerSpec) if f.name != "name")


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def get_model(name: str) -> TransformerSpec:
    """The built-in TransformerSpec called ``name``."""
    try:
        return MODELS[name]
    except (KeyError, TypeError):
        raise UnknownNameError(
            f"unknown model {name!r}: choose one of {', '.join(MODELS)}, or {CUSTOM} with every size flag"
        ) from None


def model_spec(name: str, **overrides: Any) -> TransformerSpec:
    """The spec of built-in model ``name`` with ``overrides`` (TransformerSpec fields) applied;
    ``name`` 'custom' needs every size field."""
    unknown = sorted(set(overrides) - set(_OVERRIDABLE))
    if unknown:
        raise ValidationError(
            f"unknown model setting {unknown[0]!r}: use one of {', '.join(_OVERRIDABLE)}"
        )
    if name == CUSTOM:
        missing = [k for k in _REQUIRED_FOR_CUSTOM if overrides.get(k) is None]
        if missing:
            raise ValidationError(
                f"model 'custom' needs {', '.join(_flag(k) for k in missing)}: give every size flag "
                f"({' '.join(_flag(k) for k in _REQUIRED_FOR_CUSTOM)})"
            )
        return TransformerSpec(name=CUSTOM, **overrides)
    base = get_model(name)
    return base.replace(**overrides) if overrides else base


def workload_label(spec: TransformerSpec) -> str:
    """A name for the workload that identifies its configuration.

    A built-in model unchanged is just its name; otherwise the fields that differ from the
    built-in (all of them for a custom model) follow in brackets, in TransformerSpec field order:
    'gpt2-xl[seq_len=2048,attention=eager]'.
    """
    base = MODELS.get(spec.name)
    if base == spec:
        return spec.name
    changed = []
    for f in dataclasses.fields(TransformerSpec):
        if f.name == "name":
            continue
        value = getattr(spec, f.name)
        reference = getattr(base, f.name) if base is not None else f.default
        if base is None and f.name in _REQUIRED_FOR_CUSTOM or value != reference:
            changed.append(f"{f.name}={str(value).lower() if isinstance(value, bool) else value}")
    return f"{spec.name}[{','.join(changed)}]" if changed else spec.name


def build_model_workload(name: str, hardware: Hardware, **overrides: Any) -> Workload:
    """Workload of built-in model ``name`` (or 'custom') with ``overrides`` applied, timed on ``hardware``."""
    spec = model_spec(name, **overrides)
    meta = {
        "kind": "transformer",
        "model": spec.to_dict(),
        "hardware": hardware.name,
        "assumptions": assumptions_for(spec),
        "source": MODEL_SOURCES.get(spec.name, "custom configuration"),
    }
    return build_transformer(spec, hardware, name=workload_label(spec), meta=meta)


def closed_form_saved_bytes(spec: TransformerSpec) -> dict[str, int]:
    """Saved bytes of one step on one rank from formulas, independent of the op-level builder.

    Keys: ``per_layer`` (every layer is the same), ``per_layer_korthikanti`` (the part the
    Korthikanti formulas cover: sbh(34 + 5as/h) for eager attention with dropout and a 4h
    GELU MLP on one GPU, sbh(10 + 24/t + 5as/(ht)) with tensor parallelism, sbh(34 + 5as/h)/t
    with sequence parallelism too), ``per_layer_norm_stats``, ``embedding`` (token ids, BERT's
    embedding LayerNorm input and statistics, embedding dropout mask; first pipeline stage
    only), ``head`` (final norm or MLM transform inputs, LM head input; last stage only),
    ``loss`` (logits, fp32 log-probabilities, labels; last stage only), ``micro_batches``
    (in flight on this stage) and ``total`` = micro_batches x (layers of the stage x per_layer
    + embedding) + head + loss, which is the peak when everything is kept.
    """
    r = Shapes(spec)
    T, Ts, h, d = r.T, r.Ts, spec.hidden, spec.dtype_bytes
    mask = MASK_BYTES if spec.dropout else 0
    # Per layer: the inputs of the two norms and of QKV and FC1/gate_up (4 x Ts h: with sequence
    # parallelism the GEMM inputs are kept as s/t shards and gathered again), Q, K, V, the
    # attention output = out-proj input, two dropout masks on the residual stream, and the MLP's
    # saved [T, f/t] tensors (GELU: FC1 out, GELU out; fused SwiGLU: gate, up, product).
    linear = (4 * d * Ts * h + d * T * (2 * r.q_width + 2 * r.kv_width) + 2 * mask * Ts * h
              + (2 if spec.mlp == "gelu" else 3) * d * T * r.ffn)
    if spec.attention == "eager":
        # softmax output (d), dropout mask (1) and dropped probabilities (d) per score; without
        # dropout the softmax output serves both softmax and P.V backward.
        core = (2 * d + 1 if spec.dropout else d) * r.scores_elems
    else:
        core = FP32_BYTES * r.heads * T  # log-sum-exp per head per query
    stats_per_norm = (LAYERNORM_STATS_BYTES if spec.norm == "layernorm" else RMSNORM_STATS_BYTES) * Ts
    per_layer_stats = 2 * stats_per_norm
    per_layer_korthikanti = linear + core
    per_layer = per_layer_korthikanti + per_layer_stats
    first_stage = spec.pipeline_stage == 0
    last_stage = spec.pipeline_stage == spec.pipeline_parallel - 1
    embedding = head = loss = 0
    if first_stage:
        embedding = INDEX_BYTES * T + mask * Ts * h
        if spec.post_norm:
            embedding += d * Ts * h + stats_per_norm  # embedding LayerNorm input and statistics
    if last_stage:
        if spec.post_norm:
            head = 4 * d * Ts * h + stats_per_norm  # dense in, GELU in, norm in, LM-head in
        else:
            head = 2 * d * Ts * h + stats_per_norm  # final norm in, LM-head in
        loss = d * T * r.vocab + FP32_BYTES * T * r.vocab + INDEX_BYTES * T
    micro_batches = micro_batches_in_flight(spec)
    stage_layers = spec.layers // spec.pipeline_parallel
    return {
        "per_layer": per_layer,
        "per_layer_korthikanti": per_layer_korthikanti,
        "per_layer_norm_stats": per_layer_stats,
        "embedding": embedding,
        "head": head,
        "loss": loss,
        "micro_batches": micro_batches,
        "total": micro_batches * (stage_layers * per_layer + embedding) + head + loss,
    }
