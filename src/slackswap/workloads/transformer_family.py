"""The transformer family: the built-in transformer models and the builder they use.

Configurations come from the Hugging Face configs and micro-batches from the training recipes named
beside each model; docs/models.md explains each default. The builder is workloads/transformer.py.
"""

from __future__ import annotations

from .family import ModelFamily
from .spec import TransformerSpec
from .transformer import assumptions_for, build_transformer

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

TRANSFORMER = ModelFamily(
    name="transformer", spec_type=TransformerSpec, models=MODELS, sources=MODEL_SOURCES, build=build_transformer,
    assumptions=assumptions_for, custom_name="custom",
    required_for_custom=("layers", "hidden", "heads", "ffn", "vocab", "seq_len", "micro_batch"),
)
