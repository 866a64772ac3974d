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
  entropy (4TV) are both saved for the loss backward, 6TV bytes in all (reference sec. 2).
- Token ids and labels are int64 step inputs, always resident.
- Biases are folded into their GEMM; weights and optimizer states are not activations.
"""

from __future__ import annotations

from ..hardware import Hardware
from ..workload import Op, Tensor, Workload
from .roofline import OpCost, bmm_cost, elementwise_cost, flash_attention_cost, gemm_cost, op_times_s
from .spec import TransformerSpec

INDEX_BYTES = 8  # token ids and labels are int64
FP32_BYTES = 4  # norm statistics, flash LSE and cross-entropy log-probabilities are fp32
MASK_BYTES = 1  # a dropout mask is one byte per element (torch.bool)
LAYERNORM_STATS_BYTES = 2 * FP32_BYTES  # mean and rstd per token
RMSNORM_STATS_BYTES = FP32_BYTES  # rstd per token
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


class _Builder:
    """Collects ops and tensors in execution order; backward readers may be added later."""

    def __init__(self, spec: TransformerSpec, hardware: Hardware) -> None:
        self.spec = spec
        self.hardware = hardware
        self.ops: list[Op] = []
        self.sizes: dict[str, int] = {}
        self.producers: dict[str, str | None] = {}
        self.readers: dict[str, list[str]] = {}

    def step_input(self, name: str, size_bytes: int) -> str:
        self._tensor(name, size_bytes, None)
        return name

    def _tensor(self, name: str, size_bytes: int, producer: str | None) -> None:
        self.sizes[name] = int(size_bytes)
        self.producers[name] = producer
        self.readers[name] = []

    def op(
        self,
        name: str,
        layer: int,
        kind: str,
        cost: OpCost,
        inputs: tuple[str, ...],
        outputs: tuple[tuple[str, int], ...],
        saves: tuple[str, ...],
    ) -> None:
        """Add an op; ``saves`` lists the inputs or outputs its backward reads."""
        for out, size in outputs:
            self._tensor(out, size, name)
        for tensor in saves:
            self.readers[tensor].append(name)
        fwd_s, bwd_s = op_times_s(cost, self.hardware)
        self.ops.append(Op(
            name=name, layer=layer, kind=kind, fwd_time_s=fwd_s, bwd_time_s=bwd_s,
            flops=cost.fwd_flops, bytes_accessed=cost.fwd_bytes,
            inputs=inputs, outputs=tuple(out for out, _ in outputs),
        ))

    def tensors(self) -> tuple[Tensor, ...]:
        return tuple(
            Tensor(name=name, size_bytes=self.sizes[name], producer=self.producers[name],
                   bwd_readers=tuple(self.readers[name]))
            for name in self.sizes
        )


class _Shapes:
    """Sizes in bytes of the tensors of one micro-batch."""

    def __init__(self, spec: TransformerSpec) -> None:
        s = spec
        self.T = s.tokens
        self.d = s.dtype_bytes
        self.th = self.T * s.hidden * self.d  # one [T, h] activation
        self.tf = self.T * s.ffn * self.d  # one [T, f] activation
        self.th_mask = self.T * s.hidden * MASK_BYTES
        self.scores_elems = s.micro_batch * s.heads * s.seq_len * s.seq_len  # a s^2 b
        self.stats = self.T * (LAYERNORM_STATS_BYTES if s.norm == "layernorm" else RMSNORM_STATS_BYTES)
        self.lse = FP32_BYTES * s.heads * self.T
        self.logits = self.T * s.vocab * self.d
        self.logprobs = self.T * s.vocab * FP32_BYTES


def _norm(b: _Builder, sh: _Shapes, name: str, layer: int, x: str, out: str) -> None:
    """LayerNorm or RMSNorm: the backward reads the input and the fp32 statistics."""
    spec = b.spec
    # ~8 FLOPs per element for LayerNorm (mean, variance, scale, shift), ~4 for RMSNorm (reference sec. 2).
    flops_per_elem = 8 if spec.norm == "layernorm" else 4
    stats = f"{name}.stats"
    b.op(name, layer, "norm",
         elementwise_cost(flops_per_elem * sh.T * spec.hidden, 2 * sh.th + sh.stats),
         inputs=(x,), outputs=((out, sh.th), (stats, sh.stats)), saves=(x, stats))


def _residual(b: _Builder, sh: _Shapes, name: str, layer: int, branch: str, residual: str, out: str) -> None:
    """Dropout on the branch output (when enabled) fused with the residual add.
    Its backward reads only the mask; the add's backward reads nothing."""
    spec = b.spec
    outputs = [(out, sh.th)]
    saves: tuple[str, ...] = ()
    traffic = 3 * sh.th
    if spec.dropout:
        mask = f"{name}.mask"
        outputs.append((mask, sh.th_mask))
        saves = (mask,)
        traffic += sh.th_mask
    b.op(name, layer, "elementwise", elementwise_cost(2 * sh.T * spec.hidden, traffic),
         inputs=(branch, residual), outputs=tuple(outputs), saves=saves)


def _gemm(b: _Builder, name: str, layer: int, x: str, inner: int, outputs: tuple[tuple[str, int], ...], cols: int) -> None:
    """Linear layer on [T, inner]: its backward reads its input (for the weight gradient)."""
    b.op(name, layer, "gemm", gemm_cost(b.spec.tokens, inner, cols, b.spec.dtype_bytes),
         inputs=(x,), outputs=outputs, saves=(x,))


def _attention(b: _Builder, sh: _Shapes, i: int, q: str, k: str, v: str) -> str:
    """Core attention from Q, K, V to the context (heads concatenated); returns its name."""
    spec, p = b.spec, f"L{i}."
    head_dim = spec.hidden // spec.heads
    ctx = p + "ctx"
    if spec.attention == "flash":
        lse = p + "lse"
        b.op(p + "flash_attn", i, "attention",
             flash_attention_cost(micro_batch=spec.micro_batch, seq_len=spec.seq_len, hidden=spec.hidden,
                                  heads=spec.heads, causal=spec.causal, dtype_bytes=sh.d),
             inputs=(q, k, v), outputs=((ctx, sh.th), (lse, sh.lse)), saves=(q, k, v, ctx, lse))
        return ctx
    batch = spec.micro_batch * spec.heads
    scores_bytes = sh.scores_elems * sh.d
    # Eager attention computes the full s x s scores even when causal (the mask is applied in softmax).
    b.op(p + "qk_bmm", i, "bmm", bmm_cost(batch, spec.seq_len, head_dim, spec.seq_len, sh.d),
         inputs=(q, k), outputs=((p + "scores", scores_bytes),), saves=(q, k))
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
    b.op(p + "pv_bmm", i, "bmm", bmm_cost(batch, spec.seq_len, spec.seq_len, head_dim, sh.d),
         inputs=(probs, v), outputs=((ctx, sh.th),), saves=(probs, v))
    return ctx


def _qkv(b: _Builder, sh: _Shapes, i: int, x: str) -> tuple[str, str, str]:
    spec, p = b.spec, f"L{i}."
    if not spec.rope:
        _gemm(b, p + "qkv", i, x, spec.hidden, ((p + "q", sh.th), (p + "k", sh.th), (p + "v", sh.th)), 3 * spec.hidden)
        return p + "q", p + "k", p + "v"
    # RoPE rotates Q and K; its backward needs only the shared cos/sin tables, so the
    # pre-rotation Q and K are transient and the rotated ones are what attention saves.
    _gemm(b, p + "qkv", i, x, spec.hidden,
          ((p + "q_prerope", sh.th), (p + "k_prerope", sh.th), (p + "v", sh.th)), 3 * spec.hidden)
    b.op(p + "rope", i, "elementwise", elementwise_cost(6 * sh.T * spec.hidden, 4 * sh.th),
         inputs=(p + "q_prerope", p + "k_prerope"), outputs=((p + "q", sh.th), (p + "k", sh.th)), saves=())
    return p + "q", p + "k", p + "v"


def _mlp(b: _Builder, sh: _Shapes, i: int, x: str) -> str:
    """FC1/GELU/FC2 or gate+up/SwiGLU/down from ``x``; returns the (transient) MLP output."""
    spec, p = b.spec, f"L{i}."
    out = p + "mlp_out"
    if spec.mlp == "gelu":
        _gemm(b, p + "fc1", i, x, spec.hidden, ((p + "fc1_out", sh.tf),), spec.ffn)
        # GELU (tanh form) ~8 FLOPs per element (reference sec. 2); backward reads its input.
        b.op(p + "gelu", i, "elementwise", elementwise_cost(8 * sh.T * spec.ffn, 2 * sh.tf),
             inputs=(p + "fc1_out",), outputs=((p + "act", sh.tf),), saves=(p + "fc1_out",))
    else:
        _gemm(b, p + "gate_up", i, x, spec.hidden, ((p + "gate", sh.tf), (p + "up", sh.tf)), 2 * spec.ffn)
        # Fused SiLU(gate) * up: the backward reads gate and up and recomputes SiLU(gate) inside
        # the kernel, so SiLU's output is not saved (eager PyTorch would keep it: +2Tf bytes).
        b.op(p + "swiglu", i, "elementwise", elementwise_cost(6 * sh.T * spec.ffn, 3 * sh.tf),
             inputs=(p + "gate", p + "up"), outputs=((p + "act", sh.tf),), saves=(p + "gate", p + "up"))
    _gemm(b, p + ("fc2" if spec.mlp == "gelu" else "down"), i, p + "act", spec.ffn, ((out, sh.th),), spec.hidden)
    return out


def _layer(b: _Builder, sh: _Shapes, i: int, x: str) -> str:
    """One transformer layer from input ``x``; returns the layer's output tensor name."""
    spec, p = b.spec, f"L{i}."
    out = f"L{i + 1}.x" if i + 1 < spec.layers else "final.x"
    if spec.post_norm:  # BERT: x -> attn -> add -> LN1 -> MLP -> add -> LN2
        q, k, v = _qkv(b, sh, i, x)
        ctx = _attention(b, sh, i, q, k, v)
        _gemm(b, p + "out_proj", i, ctx, spec.hidden, ((p + "attn_out", sh.th),), spec.hidden)
        _residual(b, sh, p + "attn_residual", i, p + "attn_out", x, p + "h1")
        _norm(b, sh, p + "norm1", i, p + "h1", p + "norm1_out")
        mlp_out = _mlp(b, sh, i, p + "norm1_out")
        _residual(b, sh, p + "mlp_residual", i, mlp_out, p + "norm1_out", p + "h2")
        _norm(b, sh, p + "norm2", i, p + "h2", out)
        return out
    # GPT-2 / Llama: x -> norm1 -> attn -> add -> norm2 -> MLP -> add
    _norm(b, sh, p + "norm1", i, x, p + "norm1_out")
    q, k, v = _qkv(b, sh, i, p + "norm1_out")
    ctx = _attention(b, sh, i, q, k, v)
    _gemm(b, p + "out_proj", i, ctx, spec.hidden, ((p + "attn_out", sh.th),), spec.hidden)
    _residual(b, sh, p + "attn_residual", i, p + "attn_out", x, p + "h1")
    _norm(b, sh, p + "norm2", i, p + "h1", p + "norm2_out")
    mlp_out = _mlp(b, sh, i, p + "norm2_out")
    _residual(b, sh, p + "mlp_residual", i, mlp_out, p + "h1", out)
    return out


def _embedding(b: _Builder, sh: _Shapes) -> str:
    """Token (+ learned position) embedding, BERT's embedding LayerNorm, embedding dropout."""
    spec = b.spec
    tokens = b.step_input("tokens", sh.T * INDEX_BYTES)
    gathers = 1 if spec.rope else 2  # word rows, plus position rows for learned positions
    steps = ["embed"] + (["embed_norm"] if spec.post_norm else []) + (["embed_dropout"] if spec.dropout else [])
    first_out = "L0.x" if len(steps) == 1 else "embed.out"
    # Backward scatter-adds the output gradient into the embedding table rows named by the tokens.
    b.op("embed", -1, "embedding",
         elementwise_cost((gathers - 1) * sh.T * spec.hidden, sh.T * INDEX_BYTES + (gathers + 1) * sh.th),
         inputs=(tokens,), outputs=((first_out, sh.th),), saves=(tokens,))
    x = first_out
    if spec.post_norm:
        out = "L0.x" if not spec.dropout else "embed_norm.out"
        _norm(b, sh, "embed_norm", -1, x, out)
        x = out
    if spec.dropout:
        mask = "embed_dropout.mask"
        b.op("embed_dropout", -1, "elementwise", elementwise_cost(sh.T * spec.hidden, 2 * sh.th + sh.th_mask),
             inputs=(x,), outputs=(("L0.x", sh.th), (mask, sh.th_mask)), saves=(mask,))
    return "L0.x"


def _head(b: _Builder, sh: _Shapes, x: str) -> None:
    """Final norm (or BERT's MLM transform), LM head over all T positions, cross-entropy loss."""
    spec = b.spec
    last = spec.layers  # Op.layer of the ops after the last layer
    if spec.post_norm:  # BERT MLM transform: dense h->h, GELU, LayerNorm
        _gemm(b, "head_dense", last, x, spec.hidden, (("head_dense.out", sh.th),), spec.hidden)
        b.op("head_act", last, "elementwise", elementwise_cost(8 * sh.T * spec.hidden, 2 * sh.th),
             inputs=("head_dense.out",), outputs=(("head_act.out", sh.th),), saves=("head_dense.out",))
        _norm(b, sh, "final_norm", last, "head_act.out", "final_norm.out")
    else:
        _norm(b, sh, "final_norm", last, x, "final_norm.out")
    _gemm(b, "lm_head", last, "final_norm.out", spec.hidden, (("logits", sh.logits),), spec.vocab)
    labels = b.step_input("labels", sh.T * INDEX_BYTES)
    # Cross entropy: fp32 log-softmax of the logits, then NLL. The backward reads the fp32
    # log-probabilities and the labels; the bf16 logits are counted as saved too (reference
    # sec. 2 counts 2TV + 4TV), which also covers the logit gradient buffer of the same size.
    b.op("loss", last, "loss",
         elementwise_cost(5 * sh.T * spec.vocab, sh.logits + 2 * sh.logprobs + sh.T * INDEX_BYTES),
         inputs=("logits", labels), outputs=(("logprobs", sh.logprobs), ("loss.value", LOSS_VALUE_BYTES)),
         saves=("logits", "logprobs", labels))


def build_transformer(spec: TransformerSpec, hardware: Hardware, *, name: str | None = None,
                      meta: dict | None = None) -> Workload:
    """The op-level workload of one training step of ``spec`` with roofline op times on ``hardware``.

    The workload is called ``spec.name`` unless ``name`` is given; models.build_model_workload
    passes a name that spells out overrides and custom sizes."""
    b = _Builder(spec, hardware)
    sh = _Shapes(spec)
    x = _embedding(b, sh)
    for i in range(spec.layers):
        x = _layer(b, sh, i, x)
    _head(b, sh, x)
    return Workload(
        name=name or spec.name, ops=tuple(b.ops), tensors=b.tensors(),
        meta=meta if meta is not None else {
            "kind": "transformer", "model": spec.to_dict(), "hardware": hardware.name, "assumptions": list(ASSUMPTIONS),
        },
    )
