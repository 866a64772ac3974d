"""Op-level workload of one training step of a transformer language model.

Every op inside a layer is its own Op (norm, QKV GEMM, QK^T bmm, softmax, attention
dropout, P.V bmm or one flash-attention op, output projection, dropout+residual, second
norm, FC1 or gate+up, GELU or SwiGLU, FC2 or down, dropout+residual), plus the
embedding, final norm (or BERT's MLM transform), LM head and loss. Each saved tensor
names the ops whose backward reads it, following Korthikanti et al. (arXiv 2205.05198,
sec. 4.1): with eager attention, dropout and a 4h GELU MLP a layer saves
sbh(34 + 5as/h) bytes in bf16. Intermediates that no backward reads (attention scores
before softmax, the output of each projection before dropout) are transient tensors, so
a recompute chain passes through them: the softmax output is rebuilt from Q and K by
re-running QK^T and softmax; the GELU output from the FC1 output.

Choices that the formulas leave open (docs/models.md discusses each):
- Norms also save their fp32 statistics: mean and rstd for LayerNorm (8 bytes per token),
  rstd for RMSNorm (4 bytes per token), as the PyTorch kernels do; Korthikanti omits them.
- Flash attention saves Q, K, V, its output O (also the out-proj input) and the fp32
  log-sum-exp (4 bytes per head per token); attention dropout inside the kernel keeps only
  an RNG seed, which is not modelled.
- The fused SwiGLU op saves gate and up and recomputes SiLU(gate) in its backward.
- Softmax runs in bf16 (HF Llama's fp32 upcast would add 4as^2b bytes per layer in eager).
- Logits: the LM head output (bf16, 2TV) and the fp32 log-probabilities of the cross
  entropy (4TV) are both saved for the loss backward, 6TV bytes in all (Korthikanti et al., arXiv 2205.05198, sec. 4.3).
- Token ids and labels are int64 step inputs, always resident.
- Biases are folded into their GEMM; weights and optimizer states are not activations.

Parallel layouts (tensor, sequence, context and pipeline parallelism, layout.py) give the
workload of one rank; a pipeline stage i of p holds the activations of p - i micro-batches in
flight under the 1F1B schedule, which the workload represents as p - i copies of its layers
run forward one after another and then backward in reverse (the same peak: every in-flight
micro-batch keeps its saved tensors until its backward).
"""

from __future__ import annotations

from ..hardware import Hardware
from ..workload import Workload
from .layout import (
    FP32_BYTES, LAYERNORM_STATS_BYTES, MASK_BYTES, RMSNORM_STATS_BYTES, Builder, Shapes, column_input, gather_kv,
    row_output, row_output_name,
)
from .roofline import bmm_cost, elementwise_cost, flash_attention_cost, gemm_cost
from .spec import TransformerSpec

__all__ = [
    "ASSUMPTIONS", "PARALLEL_ASSUMPTIONS", "FP32_BYTES", "INDEX_BYTES", "LAYERNORM_STATS_BYTES", "MASK_BYTES",
    "RMSNORM_STATS_BYTES", "LOSS_VALUE_BYTES", "assumptions_for", "build_transformer",
]

INDEX_BYTES = 8  # token ids and labels are int64
LOSS_VALUE_BYTES = 4

# One line each in Workload.meta["assumptions"], so reports can print what a row assumed.
ASSUMPTIONS: tuple[str, ...] = (
    "activations bf16 (2 bytes); dropout masks 1 byte per element; norm statistics, flash LSE and "
    "cross-entropy log-probabilities fp32; token ids and labels int64",
    "saved tensors follow Korthikanti et al. (arXiv 2205.05198) sec. 4.1, plus norm statistics",
    "flash attention saves Q, K, V, O and the fp32 LSE; eager saves softmax output, dropout mask and dropped probs",
    "fused SwiGLU saves gate and up and recomputes SiLU(gate) in its backward",
    "LM head and loss run on all T positions; logits (bf16) and fp32 log-probabilities are saved (6TV bytes)",
    "weights, gradients and optimizer states are not in the activation budget",
    "op times: roofline max(FLOPs / (efficiency x peak), bytes / (hbm_efficiency x HBM bandwidth)); "
    "backward 2x forward for GEMMs and elementwise ops, 2.5x FLOPs for flash attention",
)
PARALLEL_ASSUMPTIONS: tuple[str, ...] = (
    "one rank of a Megatron-LM layout: heads, kv heads, FFN and vocabulary split over t; with sequence "
    "parallelism norms, dropouts and residuals on s/t tokens; context parallelism holds s/cp tokens and "
    "all-gathers K and V",
    "collectives are ring all-reduce / all-gather / reduce-scatter at the preset's measured bus bandwidth, "
    "on the compute stream, no launch latency; a column-parallel GEMM's backward collectives overlap its "
    "backward GEMMs as in Megatron-LM",
    "pipeline stage i of p under 1F1B holds p - i micro-batches in flight, run as that many copies of its layers; "
    "point-to-point sends between stages are not modelled",
)


def assumptions_for(spec: TransformerSpec) -> list[str]:
    return list(ASSUMPTIONS) + (list(PARALLEL_ASSUMPTIONS) if spec.is_parallel else [])


def _norm(b: Builder, sh: Shapes, name: str, layer: int, x: str, out: str) -> None:
    """LayerNorm or RMSNorm: the backward reads the input and the fp32 statistics."""
    spec = b.spec
    # ~8 FLOPs per element for LayerNorm (mean, variance, scale, shift), ~4 for RMSNorm (counted from their formulas).
    flops_per_elem = 8 if spec.norm == "layernorm" else 4
    stats = f"{name}.stats"
    b.op(name, layer, "norm",
         elementwise_cost(flops_per_elem * sh.Ts * spec.hidden, 2 * sh.ths + sh.stats),
         inputs=(x,), outputs=((out, sh.ths), (stats, sh.stats)), saves=(x, stats))


def _residual(b: Builder, sh: Shapes, name: str, layer: int, branch: str, residual: str, out: str) -> None:
    """Dropout on the branch output (when enabled) fused with the residual add.
    Its backward reads only the mask; the add's backward reads nothing."""
    spec = b.spec
    outputs = [(out, sh.ths)]
    saves: tuple[str, ...] = ()
    traffic = 3 * sh.ths
    if spec.dropout:
        mask = f"{name}.mask"
        outputs.append((mask, sh.ths_mask))
        saves = (mask,)
        traffic += sh.ths_mask
    b.op(name, layer, "elementwise", elementwise_cost(2 * sh.Ts * spec.hidden, traffic),
         inputs=(branch, residual), outputs=tuple(outputs), saves=saves)


def _gemm(b: Builder, name: str, layer: int, x: str, rows: int, inner: int,
          outputs: tuple[tuple[str, int], ...], cols: int, saves: tuple[str, ...] | None = None) -> None:
    """Linear layer on [rows, inner]: its backward reads its input (for the weight gradient),
    unless ``saves`` names what it keeps instead (a sequence-parallel all-gather keeps it)."""
    b.op(name, layer, "gemm", gemm_cost(rows, inner, cols, b.spec.dtype_bytes),
         inputs=(x,), outputs=outputs, saves=(x,) if saves is None else saves)


def _attention(b: Builder, sh: Shapes, i: int, q: str, k: str, v: str) -> str:
    """Core attention from Q, K, V to the context (heads concatenated); returns its name."""
    spec, p = b.spec, f"L{i}."
    ctx = p + "ctx"
    k, v, keeps_kv = gather_kv(b, sh, p, i, k, v)
    kv_saved = (k, v) if keeps_kv else ()
    if spec.attention == "flash":
        lse = p + "lse"
        b.op(p + "flash_attn", i, "attention",
             flash_attention_cost(micro_batch=spec.micro_batch, q_len=sh.seq, kv_len=spec.seq_len,
                                  q_width=sh.q_width, kv_width=sh.kv_width, heads=sh.heads, causal=spec.causal,
                                  dtype_bytes=sh.d),
             inputs=(q, k, v), outputs=((ctx, sh.q), (lse, sh.lse)), saves=(q,) + kv_saved + (ctx, lse))
        return ctx
    batch = spec.micro_batch * sh.heads
    scores_bytes = sh.scores_elems * sh.d
    # Eager attention computes the full s x s scores even when causal (the mask is applied in softmax).
    b.op(p + "qk_bmm", i, "bmm", bmm_cost(batch, sh.seq, sh.head_dim, spec.seq_len, sh.d),
         inputs=(q, k), outputs=((p + "scores", scores_bytes),), saves=(q,) + kv_saved[:1])
    # Softmax (with the causal mask and 1/sqrt(d) scale fused): ~5 FLOPs per score; backward reads its output.
    b.op(p + "softmax", i, "elementwise", elementwise_cost(5 * sh.scores_elems, 2 * scores_bytes),
         inputs=(p + "scores",), outputs=((p + "probs", scores_bytes),), saves=(p + "probs",))
    probs = p + "probs"
    if spec.dropout:
        mask = p + "attn_dropout.mask"
        b.op(p + "attn_dropout", i, "elementwise",
             elementwise_cost(2 * sh.scores_elems, 2 * scores_bytes + sh.scores_elems * MASK_BYTES),
             inputs=(probs,), outputs=((p + "probs_dropped", scores_bytes), (mask, sh.scores_elems * MASK_BYTES)),
             saves=(mask,))
        probs = p + "probs_dropped"
    b.op(p + "pv_bmm", i, "bmm", bmm_cost(batch, sh.seq, spec.seq_len, sh.head_dim, sh.d),
         inputs=(probs, v), outputs=((ctx, sh.q),), saves=(probs,) + kv_saved[1:])
    return ctx


def _qkv(b: Builder, sh: Shapes, i: int, x: str) -> tuple[str, str, str]:
    spec, p = b.spec, f"L{i}."
    cols = sh.q_width + 2 * sh.kv_width
    x, saves = column_input(b, sh, p + "qkv", i, x, cols)
    if not spec.rope:
        _gemm(b, p + "qkv", i, x, sh.T, spec.hidden, ((p + "q", sh.q), (p + "k", sh.kv), (p + "v", sh.kv)), cols, saves)
        return p + "q", p + "k", p + "v"
    # RoPE rotates Q and K; its backward needs only the shared cos/sin tables, so the
    # pre-rotation Q and K are transient and the rotated ones are what attention saves.
    _gemm(b, p + "qkv", i, x, sh.T, spec.hidden,
          ((p + "q_prerope", sh.q), (p + "k_prerope", sh.kv), (p + "v", sh.kv)), cols, saves)
    b.op(p + "rope", i, "elementwise", elementwise_cost(3 * sh.T * (sh.q_width + sh.kv_width), 2 * (sh.q + sh.kv)),
         inputs=(p + "q_prerope", p + "k_prerope"), outputs=((p + "q", sh.q), (p + "k", sh.kv)), saves=())
    return p + "q", p + "k", p + "v"


def _mlp(b: Builder, sh: Shapes, i: int, x: str) -> str:
    """FC1/GELU/FC2 or gate+up/SwiGLU/down from ``x``; returns the (transient) MLP output."""
    spec, p = b.spec, f"L{i}."
    out = p + "mlp_out"
    x, saves = column_input(b, sh, p + "mlp", i, x, sh.ffn if spec.mlp == "gelu" else 2 * sh.ffn)
    if spec.mlp == "gelu":
        _gemm(b, p + "fc1", i, x, sh.T, spec.hidden, ((p + "fc1_out", sh.tf),), sh.ffn, saves)
        # GELU (tanh form) ~8 FLOPs per element (counted from its formula); backward reads its input.
        b.op(p + "gelu", i, "elementwise", elementwise_cost(8 * sh.T * sh.ffn, 2 * sh.tf),
             inputs=(p + "fc1_out",), outputs=((p + "act", sh.tf),), saves=(p + "fc1_out",))
    else:
        _gemm(b, p + "gate_up", i, x, sh.T, spec.hidden, ((p + "gate", sh.tf), (p + "up", sh.tf)), 2 * sh.ffn, saves)
        # Fused SiLU(gate) * up: the backward reads gate and up and recomputes SiLU(gate) inside
        # the kernel, so SiLU's output is not saved (eager PyTorch would keep it: +2Tf bytes).
        b.op(p + "swiglu", i, "elementwise", elementwise_cost(6 * sh.T * sh.ffn, 3 * sh.tf),
             inputs=(p + "gate", p + "up"), outputs=((p + "act", sh.tf),), saves=(p + "gate", p + "up"))
    _gemm(b, p + ("fc2" if spec.mlp == "gelu" else "down"), i, p + "act", sh.T, sh.ffn,
          ((row_output_name(sh, out), sh.th),), spec.hidden)
    row_output(b, sh, p + "mlp", i, out)
    return out


def _attention_block(b: Builder, sh: Shapes, i: int, x: str) -> str:
    """QKV, core attention and output projection from ``x``; returns the (transient) projection output."""
    p = f"L{i}."
    q, k, v = _qkv(b, sh, i, x)
    ctx = _attention(b, sh, i, q, k, v)
    out = p + "attn_out"
    _gemm(b, p + "out_proj", i, ctx, sh.T, sh.q_width, ((row_output_name(sh, out), sh.th),), b.spec.hidden)
    row_output(b, sh, p + "attn", i, out)
    return out


def _layer(b: Builder, sh: Shapes, i: int, x: str) -> str:
    """One transformer layer from input ``x``; returns the layer's output tensor name."""
    spec, p = b.spec, f"L{i}."
    out = f"L{i + 1}.x" if i + 1 < spec.layers else "final.x"
    if spec.post_norm:  # BERT: x -> attn -> add -> LN1 -> MLP -> add -> LN2
        attn_out = _attention_block(b, sh, i, x)
        _residual(b, sh, p + "attn_residual", i, attn_out, x, p + "h1")
        _norm(b, sh, p + "norm1", i, p + "h1", p + "norm1_out")
        mlp_out = _mlp(b, sh, i, p + "norm1_out")
        _residual(b, sh, p + "mlp_residual", i, mlp_out, p + "norm1_out", p + "h2")
        _norm(b, sh, p + "norm2", i, p + "h2", out)
        return out
    # GPT-2 / Llama: x -> norm1 -> attn -> add -> norm2 -> MLP -> add
    _norm(b, sh, p + "norm1", i, x, p + "norm1_out")
    attn_out = _attention_block(b, sh, i, p + "norm1_out")
    _residual(b, sh, p + "attn_residual", i, attn_out, x, p + "h1")
    _norm(b, sh, p + "norm2", i, p + "h1", p + "norm2_out")
    mlp_out = _mlp(b, sh, i, p + "norm2_out")
    _residual(b, sh, p + "mlp_residual", i, mlp_out, p + "h1", out)
    return out


def _embedding(b: Builder, sh: Shapes) -> str:
    """Token (+ learned position) embedding, BERT's embedding LayerNorm, embedding dropout."""
    spec = b.spec
    tokens = b.step_input("tokens", sh.T * INDEX_BYTES)
    gathers = 1 if spec.rope else 2  # word rows, plus position rows for learned positions
    steps = ["embed"] + (["embed_norm"] if spec.post_norm else []) + (["embed_dropout"] if spec.dropout else [])
    first_out = "L0.x" if len(steps) == 1 else "embed.out"
    # Backward scatter-adds the output gradient into the embedding table rows named by the tokens.
    # With t > 1 each rank looks up its vocabulary shard and g sums the partial rows.
    b.op("embed", -1, "embedding",
         elementwise_cost((gathers - 1) * sh.T * spec.hidden, sh.T * INDEX_BYTES + (gathers + 1) * sh.th),
         inputs=(tokens,), outputs=((row_output_name(sh, first_out), sh.th),), saves=(tokens,))
    row_output(b, sh, "embed", -1, first_out)
    x = first_out
    if spec.post_norm:
        out = "L0.x" if not spec.dropout else "embed_norm.out"
        _norm(b, sh, "embed_norm", -1, x, out)
        x = out
    if spec.dropout:
        mask = "embed_dropout.mask"
        b.op("embed_dropout", -1, "elementwise", elementwise_cost(sh.Ts * spec.hidden, 2 * sh.ths + sh.ths_mask),
             inputs=(x,), outputs=(("L0.x", sh.ths), (mask, sh.ths_mask)), saves=(mask,))
    return "L0.x"


def _head(b: Builder, sh: Shapes, x: str) -> None:
    """Final norm (or BERT's MLM transform), LM head over all T positions, cross-entropy loss."""
    spec = b.spec
    last = spec.layers  # Op.layer of the ops after the last layer
    if spec.post_norm:  # BERT MLM transform: dense h->h, GELU, LayerNorm (replicated under tensor parallelism)
        _gemm(b, "head_dense", last, x, sh.Ts, spec.hidden, (("head_dense.out", sh.ths),), spec.hidden)
        b.op("head_act", last, "elementwise", elementwise_cost(8 * sh.Ts * spec.hidden, 2 * sh.ths),
             inputs=("head_dense.out",), outputs=(("head_act.out", sh.ths),), saves=("head_dense.out",))
        _norm(b, sh, "final_norm", last, "head_act.out", "final_norm.out")
    else:
        _norm(b, sh, "final_norm", last, x, "final_norm.out")
    head_in, saves = column_input(b, sh, "lm_head", last, "final_norm.out", sh.vocab)
    _gemm(b, "lm_head", last, head_in, sh.T, spec.hidden, (("logits", sh.logits),), sh.vocab, saves)
    labels = b.step_input("labels", sh.T * INDEX_BYTES)
    # Cross entropy: fp32 log-softmax of the logits, then NLL. The backward reads the fp32
    # log-probabilities and the labels; the bf16 logits are counted as saved too (reference
    # sec. 2 counts 2TV + 4TV), which also covers the logit gradient buffer of the same size.
    # Under tensor parallelism each rank holds V/t columns (Megatron's vocabulary-parallel
    # cross entropy; its all-reduces of per-token maxima and sums are 8 bytes a token, not modelled).
    b.op("loss", last, "loss",
         elementwise_cost(5 * sh.T * sh.vocab, sh.logits + 2 * sh.logprobs + sh.T * INDEX_BYTES),
         inputs=("logits", labels), outputs=(("logprobs", sh.logprobs), ("loss.value", LOSS_VALUE_BYTES)),
         saves=("logits", "logprobs", labels))


def micro_batches_in_flight(spec: TransformerSpec) -> int:
    """Micro-batches whose activations a pipeline stage holds under 1F1B: p - i for stage i
    (Narayanan et al. arXiv 2104.04473 sec. 2.2; Korthikanti sec. 4.2.3)."""
    return spec.pipeline_parallel - spec.pipeline_stage


def build_transformer(spec: TransformerSpec, hardware: Hardware, *, name: str | None = None,
                      meta: dict | None = None) -> Workload:
    """The op-level workload of one training step of ``spec`` with roofline op times on ``hardware``.

    With a parallel layout this is the workload of one rank (of pipeline stage
    ``spec.pipeline_stage``). The workload is called ``spec.name`` unless ``name`` is given;
    models.build_model_workload passes a name that spells out overrides and custom sizes."""
    b = Builder(spec, hardware)
    sh = Shapes(spec)
    per_stage = spec.layers // spec.pipeline_parallel
    first = spec.pipeline_stage * per_stage
    in_flight = micro_batches_in_flight(spec)
    for k in range(in_flight):
        b.prefix = f"mb{k}." if in_flight > 1 else ""
        b.layer_offset = k * per_stage
        x = _embedding(b, sh) if first == 0 else b.step_input(f"L{first}.x", sh.ths)
        for i in range(first, first + per_stage):
            x = _layer(b, sh, i, x)
    if spec.pipeline_stage == spec.pipeline_parallel - 1:
        _head(b, sh, x)
    return Workload(
        name=name or spec.name, ops=tuple(b.ops), tensors=b.tensors(),
        meta=meta if meta is not None else {
            "kind": "transformer", "model": spec.to_dict(), "hardware": hardware.name,
            "assumptions": assumptions_for(spec),
        },
    )
