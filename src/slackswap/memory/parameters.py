"""Parameter counts of the built-in transformer specs, in closed form.

The layout follows the Hugging Face implementations the built-in models name
(docs/models.md): GPT-2 and BERT (LayerNorm models) have a bias on every linear layer and
an LM head tied to the token embedding; Llama (RMSNorm models) has no biases and an
untied LM head. Learned position tables (GPT-2, BERT) have ``seq_len`` rows, the context
the built-in configurations use; BERT also has two token-type rows and a LayerNorm on the
embedding sum, and its MLM head a dense+LayerNorm transform and a vocabulary bias. BERT's
pooler and next-sentence head are not counted: the workload does not run them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ..workloads.spec import TransformerSpec


@dataclass(frozen=True, slots=True)
class ParameterCount:
    """Parameter elements of a model, split where sharding by layer needs it."""

    total: int
    largest_unit: int
    """Parameters of the largest unit FSDP wraps (a transformer layer, or the embedding
    when it is larger): what one all-gather materializes at a time."""


def transformer_parameters(spec: TransformerSpec) -> ParameterCount:
    """Parameter elements of ``spec``'s model (see the module docstring for the layout); with a
    parallel layout (docs/models.md), those one rank holds: Megatron-LM splits every projection's
    weight (and a column-parallel projection's bias) and the vocabulary rows over the t ranks, keeps
    norms, row-parallel biases, position and token-type tables whole on each, and gives a pipeline
    stage its layers/p layers, the embedding to the first and the head to the last (a tied LM head
    keeps a copy of the embedding there when p > 1)."""
    h, f, V, t = spec.hidden, spec.ffn, spec.vocab, spec.tensor_parallel
    layernorm = spec.norm == "layernorm"
    bias = layernorm  # GPT-2 / BERT carry biases; Llama has none
    norm = 2 * h if layernorm else h  # weight and bias, or weight only
    kv = spec.num_kv_heads * (h // spec.heads)  # K and V widths (smaller with grouped-query attention)
    # Q, K, V and output projections: split weights and Q/K/V biases, the output bias whole.
    attention = (2 * h * h + 2 * h * kv + (h + 2 * kv if bias else 0)) // t + (h if bias else 0)
    if spec.mlp == "gelu":
        mlp = (2 * h * f + (f if bias else 0)) // t + (h if bias else 0)
    else:
        mlp = (3 * h * f + (2 * f if bias else 0)) // t + (h if bias else 0)  # gate, up and down
    per_layer = attention + mlp + 2 * norm
    vocab_rows = -(-V // t)
    embedding = vocab_rows * h
    if not spec.rope:
        embedding += spec.seq_len * h  # learned absolute positions
    if spec.post_norm:
        embedding += 2 * h + norm  # token types and the embedding LayerNorm
        head = h * h + h + norm + vocab_rows  # MLM transform dense, its LayerNorm, vocabulary bias
    else:
        head = norm  # final norm
    p, stage = spec.pipeline_parallel, spec.pipeline_stage
    if not layernorm or (p > 1 and stage == p - 1):
        head += vocab_rows * h  # untied LM head, or the last stage's copy of a tied one
    embedding = embedding if stage == 0 else 0
    head = head if stage == p - 1 else 0
    total = spec.layers // p * per_layer + embedding + head
    return ParameterCount(total=total, largest_unit=max(per_layer, embedding, head))


def parameter_meta(unit_counts: Iterable[tuple[int | None, int]]) -> dict[str, int]:
    """Workload meta keys the profiler records for the model states: the trainable parameter
    count, and the largest count in one unit, given (repeated-block index or None, count) per
    parameter. Each repeated block is a unit (as FSDP is usually applied, one unit per
    transformer block); the parameters outside every block form one more."""
    units: dict[int | None, int] = {}
    for unit, count in unit_counts:
        units[unit] = units.get(unit, 0) + count
    return {"parameter_count": sum(units.values()), "largest_unit_parameter_count": max(units.values(), default=0)}
