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
        for key in ("dropout", "causal", "post_norm", "rope"):
            if not isinstance(getattr(self, key), bool):
                raise ValidationError(f"model spec {key} must be true or false, got {getattr(self, key)!r}")

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
        for key, default in (("dropout", True), ("causal", True), ("post_norm", False), ("rope", False)):
            value = f.obj.get(key, default)
            f.used.add(key)
            if not isinstance(value, bool):
                raise ValidationError(f"model spec {key} must be true or false, got {value!r}")
            kwargs[key] = value
        kwargs["dtype_bytes"] = f.int("dtype_bytes", positive=True, default=2)
        f.no_extra()
        return cls(**kwargs)
