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
    """Parameter elements of ``spec``'s model (see the module docstring for the layout)."""
    h, f, V = spec.hidden, spec.ffn, spec.vocab
    layernorm = spec.norm == "layernorm"
    bias = layernorm  # GPT-2 / BERT carry biases; Llama has none
    norm = 2 * h if layernorm else h  # weight and bias, or weight only
    kv = spec.num_kv_heads * (h // spec.heads)  # K and V widths (smaller with grouped-query attention)
    attention = 2 * h * h + 2 * h * kv + (2 * h + 2 * kv if bias else 0)  # Q, K, V and output projections
    if spec.mlp == "gelu":
        mlp = 2 * h * f + (f + h if bias else 0)
    else:
        mlp = 3 * h * f + (2 * f + h if bias else 0)  # gate, up and down
    per_layer = attention + mlp + 2 * norm
    embedding = V * h
    if not spec.rope:
        embedding += spec.seq_len * h  # learned absolute positions
    if spec.post_norm:
        embedding += 2 * h + norm  # token types and the embedding LayerNorm
        head = h * h + h + norm + V  # MLM transform dense, its LayerNorm, vocabulary bias
    else:
        head = norm  # final norm
    if not layernorm:
        head += V * h  # untied LM head
    total = spec.layers * per_layer + embedding + head
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
