"""TransformerSpec: the configuration a built-in transformer workload is made from."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .._fields import Fields
from ..errors import ValidationError

# Op count, and so build and simulation time, grows with the layer count; this bound keeps a typo
# (a million layers) from running for minutes while leaving room far above real models.
MAX_LAYERS = 4096
ATTENTION_KINDS = ("eager", "flash")
MLP_KINDS = ("gelu", "swiglu")
NORM_KINDS = ("layernorm", "rmsnorm")


@dataclass(frozen=True, slots=True, kw_only=True)
class TransformerSpec:
    name: str
    layers: int
    hidden: int
    heads: int
    ffn: int
    vocab: int
    seq_len: int
    micro_batch: int
    attention: str = "flash"
    """'eager' stores the softmax probabilities (the 5as^2b term); 'flash' stores only Q, K, V, O and the LSE."""
    mlp: str = "gelu"
    norm: str = "layernorm"
    dropout: bool = True
    causal: bool = True
    """Causal attention does half the attention FLOPs with flash kernels (GPT, Llama); BERT is bidirectional."""
    post_norm: bool = False
    """BERT-style encoder: norms follow the residual adds (post-LN), the embedding sum is normalized,
    and the MLM head has a dense+GELU+norm transform before the vocabulary projection.
    False: GPT/Llama-style pre-norm decoder with a final norm before the LM head."""
    rope: bool = False
    """Rotary position embeddings applied to Q and K after the QKV GEMM (Llama); False: learned
    absolute position embeddings added at the input (GPT-2, BERT)."""
    dtype_bytes: int = 2
    """Bytes per activation element (bf16)."""
    kv_heads: int | None = None
    """Key/value heads (grouped-query attention, Llama-2-70B and Llama 3); None: as many as ``heads``."""
    tensor_parallel: int = 1
    """Tensor-parallel degree t (Megatron-LM): heads, FFN and vocabulary split over t ranks."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism: norms, dropouts and residuals run on s/t tokens per rank."""
    context_parallel: int = 1
    """Context-parallel degree: each rank holds s/cp tokens and gathers K and V from the others."""
    pipeline_parallel: int = 1
    """Pipeline stages p; a stage holds layers/p layers (1F1B schedule)."""
    pipeline_stage: int = 0
    """Which stage this rank's workload is (0 is first: embedding, and p micro-batches in flight)."""

    def __post_init__(self) -> None:
        for key in ("layers", "hidden", "heads", "ffn", "vocab", "seq_len", "micro_batch", "dtype_bytes"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValidationError(f"model spec {key} must be a positive integer, got {value!r}")
        if self.layers > MAX_LAYERS:
            raise ValidationError(
                f"model spec layers is {self.layers}; at most {MAX_LAYERS} are supported (the largest published "
                "dense transformers have about 130): check the value"
            )
        if self.hidden % self.heads:
            raise ValidationError(f"model spec hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        for key, allowed in (("attention", ATTENTION_KINDS), ("mlp", MLP_KINDS), ("norm", NORM_KINDS)):
            if getattr(self, key) not in allowed:
                raise ValidationError(f"model spec {key} is {getattr(self, key)!r}: use one of {', '.join(allowed)}")
        for key in ("dropout", "causal", "post_norm", "rope", "sequence_parallel"):
            if not isinstance(getattr(self, key), bool):
                raise ValidationError(f"model spec {key} must be true or false, got {getattr(self, key)!r}")
        _check_layout(self)

    @property
    def num_kv_heads(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def is_parallel(self) -> bool:
        """True when any parallel layout field differs from a single GPU."""
        return (self.tensor_parallel, self.context_parallel, self.pipeline_parallel) != (1, 1, 1)

    @property
    def tokens(self) -> int:
        """Tokens per micro-batch, T = b * s."""
        return self.seq_len * self.micro_batch

    def replace(self, **changes: Any) -> "TransformerSpec":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> "TransformerSpec":
        f = Fields(data, "model spec")
        kwargs: dict[str, Any] = {"name": f.str("name", default="custom")}
        for key in ("layers", "hidden", "heads", "ffn", "vocab", "seq_len", "micro_batch"):
            kwargs[key] = f.int(key, positive=True)
        for key, default in (("attention", "flash"), ("mlp", "gelu"), ("norm", "layernorm")):
            kwargs[key] = f.str(key, default=default)
        for key, default in (("dropout", True), ("causal", True), ("post_norm", False), ("rope", False),
                             ("sequence_parallel", False)):
            value = f.obj.get(key, default)
            f.used.add(key)
            if not isinstance(value, bool):
                raise ValidationError(f"model spec {key} must be true or false, got {value!r}")
            kwargs[key] = value
        kwargs["dtype_bytes"] = f.int("dtype_bytes", positive=True, default=2)
        kv_heads = f.obj.get("kv_heads")
        f.used.add("kv_heads")
        kwargs["kv_heads"] = None if kv_heads is None else f.int("kv_heads", positive=True)
        for key in ("tensor_parallel", "context_parallel", "pipeline_parallel"):
            kwargs[key] = f.int(key, positive=True, default=1)
        kwargs["pipeline_stage"] = f.int("pipeline_stage", default=0)
        f.no_extra()
        return cls(**kwargs)


def _check_layout(spec: TransformerSpec) -> None:
    """The divisibility Megatron-LM asks of a parallel layout, one message per problem."""
    for key in ("tensor_parallel", "context_parallel", "pipeline_parallel"):
        value = getattr(spec, key)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValidationError(f"model spec {key} must be a positive integer, got {value!r}")
    stage = spec.pipeline_stage
    if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage < spec.pipeline_parallel:
        raise ValidationError(
            f"model spec pipeline_stage is {stage!r}: use 0 to {spec.pipeline_parallel - 1} (one per pipeline stage)"
        )
    kv = spec.kv_heads
    if kv is not None and (isinstance(kv, bool) or not isinstance(kv, int) or kv <= 0 or spec.heads % kv):
        raise ValidationError(
            f"model spec kv_heads is {kv!r}: it must be a positive divisor of heads ({spec.heads}), "
            "each key/value head serving heads/kv_heads query heads"
        )
    t = spec.tensor_parallel
    for key, value in (("heads", spec.heads), ("kv_heads", spec.num_kv_heads), ("ffn", spec.ffn)):
        if value % t:
            raise ValidationError(
                f"model spec {key} ({value}) is not divisible by tensor_parallel ({t}): each rank holds {key}/t; "
                "choose a tensor-parallel degree that divides it"
            )
    if spec.sequence_parallel and t == 1:
        raise ValidationError(
            "model spec sequence_parallel needs tensor_parallel above 1 (it shards the sequence over the t ranks): "
            "turn it off (--no-sp) or set tensor_parallel"
        )
    cp = spec.context_parallel
    if spec.seq_len % cp:
        raise ValidationError(f"model spec seq_len ({spec.seq_len}) is not divisible by context_parallel ({cp})")
    if spec.sequence_parallel and (spec.seq_len // cp) % t:
        raise ValidationError(
            f"model spec seq_len per context-parallel rank ({spec.seq_len // cp}) is not divisible by "
            f"tensor_parallel ({t}), which sequence parallelism needs"
        )
    if spec.layers % spec.pipeline_parallel:
        raise ValidationError(
            f"model spec layers ({spec.layers}) is not divisible by pipeline_parallel ({spec.pipeline_parallel}): "
            "each stage holds layers/p layers"
        )
