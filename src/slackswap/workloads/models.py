"""The built-in models of every family, custom configurations, and the closed-form activation sizes.

A model name is looked up in the family registry (workloads/families.py); its family's builder
makes the workload. The transformer family's models are in workloads/transformer_family.py and
docs/models.md explains each default. Sizes are bytes, T = seq_len x micro_batch tokens.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import UnknownNameError, ValidationError
from ..hardware import Hardware
from ..workload import Workload
from .families import FAMILIES, family_of, family_of_spec, model_names
from .layout import Shapes
from .spec import TransformerSpec
from .transformer import (
    ASSUMPTIONS, FP32_BYTES, INDEX_BYTES, LAYERNORM_STATS_BYTES, MASK_BYTES, RMSNORM_STATS_BYTES,
    build_transformer, micro_batches_in_flight,
)
from .transformer_family import MODEL_SOURCES, MODELS

__all__ = [
    "MODELS", "MODEL_SOURCES", "ASSUMPTIONS", "CUSTOM", "FAMILIES", "get_model", "model_spec", "build_transformer",
    "build_model_workload", "closed_form_saved_bytes", "workload_label",
]

CUSTOM = "custom"
"""The transformer family's custom model: every size given as a setting."""


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def get_model(name: str) -> Any:
    """The built-in configuration called ``name`` (a TransformerSpec for the transformer family)."""
    family = family_of(name)
    if name not in family.models:
        raise UnknownNameError(
            f"{name!r} is not a built-in model: choose one of {', '.join(model_names())}"
        )
    return family.models[name]


def model_spec(name: str, **overrides: Any) -> Any:
    """The configuration of built-in model ``name`` with ``overrides`` (fields of its family's
    configuration type) applied; a family's custom name ('custom') needs every size field."""
    family = family_of(name)
    settings = family.settings()
    unknown = sorted(set(overrides) - set(settings))
    if unknown:
        raise ValidationError(
            f"unknown model setting {unknown[0]!r}: use one of {', '.join(settings)}"
        )
    if name == family.custom_name:
        missing = [k for k in family.required_for_custom if overrides.get(k) is None]
        if missing:
            raise ValidationError(
                f"model {name!r} needs {', '.join(_flag(k) for k in missing)}: give every size flag "
                f"({' '.join(_flag(k) for k in family.required_for_custom)})"
            )
        return family.spec_type(name=name, **overrides)
    base = family.models[name]
    return dataclasses.replace(base, **overrides) if overrides else base


def workload_label(spec: Any) -> str:
    """A name for the workload that identifies its configuration.

    A built-in model unchanged is just its name; otherwise the fields that differ from the
    built-in (all of them for a custom model) follow in brackets, in the configuration's field
    order: 'gpt2-xl[seq_len=2048,attention=eager]'.
    """
    family = family_of_spec(spec)
    base = family.models.get(spec.name)
    if base == spec:
        return spec.name
    changed = []
    for f in dataclasses.fields(family.spec_type):
        if f.name == "name":
            continue
        value = getattr(spec, f.name)
        reference = getattr(base, f.name) if base is not None else f.default
        if base is None and f.name in family.required_for_custom or value != reference:
            changed.append(f"{f.name}={str(value).lower() if isinstance(value, bool) else value}")
    return f"{spec.name}[{','.join(changed)}]" if changed else spec.name


def build_model_workload(name: str, hardware: Hardware, **overrides: Any) -> Workload:
    """Workload of built-in model ``name`` (or a family's custom name) with ``overrides`` applied,
    timed on ``hardware``, built by the model's family (workloads/families.py)."""
    spec = model_spec(name, **overrides)
    family = family_of(name)
    meta = {
        "kind": family.name,
        "model": spec.to_dict(),
        "hardware": hardware.name,
        "assumptions": family.assumptions(spec),
        "source": family.sources.get(spec.name, "custom configuration"),
    }
    return family.build(spec, hardware, name=workload_label(spec), meta=meta)


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
