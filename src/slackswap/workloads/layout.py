"""The per-rank pieces of a transformer workload: tensor sizes under a parallel layout, the op
builder, and the collectives Megatron-LM runs where a tensor-parallel region begins and ends.

One rank of a layout with tensor-parallel degree t, optional sequence parallelism (SP) and
context-parallel degree cp (Shoeybi et al. arXiv 1909.08053; Korthikanti et al. arXiv
2205.05198 sec. 4.2) holds:
- T = b x s / cp tokens inside the tensor-parallel regions (attention and MLP), with heads/t
  query heads, kv_heads/t key/value heads, ffn/t MLP columns and ceil(V/t) vocabulary rows;
- Ts tokens of the residual stream (norms, dropouts, residual adds): T, or T/t with SP.

A column-parallel GEMM (QKV, FC1 or gate+up, LM head) is entered through Megatron's f: without
SP an identity whose backward all-reduces the input gradient; with SP an all-gather of the
sharded input. A row-parallel GEMM (output projection, FC2 or down, vocabulary-parallel
embedding) leaves through g: an all-reduce without SP, a reduce-scatter with SP. Each is an
Op of kind all_reduce / all_gather / reduce_scatter whose times come from
``collectives.collective_time_s``. With SP the all-gather keeps the s/t shard for backward and
gathers it again there (Korthikanti sec. 4.2.2), so the all-gather op, not the GEMM, is the
backward reader of the shard and its backward time is a reduce-scatter plus that all-gather.
"""

from __future__ import annotations

from ..hardware import Hardware
from ..workload import Op, Tensor
from .collectives import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, collective_time_s, link_bytes_per_rank
from .roofline import OpCost, gemm_cost, op_times_s
from .spec import TransformerSpec

FP32_BYTES = 4  # norm statistics, flash LSE and cross-entropy log-probabilities are fp32
MASK_BYTES = 1  # a dropout mask is one byte per element (torch.bool)
LAYERNORM_STATS_BYTES = 2 * FP32_BYTES  # mean and rstd per token
RMSNORM_STATS_BYTES = FP32_BYTES  # rstd per token


class Shapes:
    """Sizes in bytes of the tensors of one micro-batch on one rank."""

    def __init__(self, spec: TransformerSpec) -> None:
        s = spec
        self.t = s.tensor_parallel
        self.cp = s.context_parallel
        self.seq = s.seq_len // self.cp  # queries per rank
        self.T = self.seq * s.micro_batch
        self.Ts = self.T // self.t if s.sequence_parallel else self.T
        self.d = s.dtype_bytes
        self.head_dim = s.hidden // s.heads
        self.heads = s.heads // self.t
        self.q_width = self.heads * self.head_dim
        self.kv_width = s.num_kv_heads // self.t * self.head_dim
        self.ffn = s.ffn // self.t
        self.vocab = -(-s.vocab // self.t)  # Megatron pads the vocabulary to a multiple of t
        self.th = self.T * s.hidden * self.d  # one gathered [T, h] activation
        self.ths = self.Ts * s.hidden * self.d  # one [Ts, h] activation of the residual stream
        self.q = self.T * self.q_width * self.d
        self.kv = self.T * self.kv_width * self.d
        self.tf = self.T * self.ffn * self.d
        self.ths_mask = self.Ts * s.hidden * MASK_BYTES
        self.scores_elems = s.micro_batch * self.heads * self.seq * s.seq_len  # (a/t) (s/cp) s b
        self.stats = self.Ts * (LAYERNORM_STATS_BYTES if s.norm == "layernorm" else RMSNORM_STATS_BYTES)
        self.lse = FP32_BYTES * self.heads * self.T
        self.logits = self.T * self.vocab * self.d
        self.logprobs = self.T * self.vocab * FP32_BYTES


class Builder:
    """Collects ops and tensors in execution order.

    ``prefix`` is put before every op and tensor name (one prefix per micro-batch in flight on a
    pipeline stage) and ``layer_offset`` is added to the block index of each layer op, so copies of
    the same layers for several micro-batches stay distinct blocks."""

    def __init__(self, spec: TransformerSpec, hardware: Hardware) -> None:
        self.spec = spec
        self.hardware = hardware
        self.ops: list[Op] = []
        self.sizes: dict[str, int] = {}
        self.producers: dict[str, str | None] = {}
        self.readers: dict[str, list[str]] = {}
        self.prefix = ""
        self.layer_offset = 0

    def step_input(self, name: str, size_bytes: int) -> str:
        self._tensor(self.prefix + name, size_bytes, None)
        return name

    def _tensor(self, name: str, size_bytes: int, producer: str | None) -> None:
        self.sizes[name] = int(size_bytes)
        self.producers[name] = producer
        self.readers[name] = []

    def op(self, name: str, layer: int, kind: str, cost: OpCost, inputs: tuple[str, ...],
           outputs: tuple[tuple[str, int], ...], saves: tuple[str, ...]) -> None:
        """Add an op; ``saves`` lists the inputs or outputs its backward reads."""
        fwd_s, bwd_s = op_times_s(cost, self.hardware)
        self._add(name, layer, kind, fwd_s, bwd_s, cost.fwd_flops, cost.fwd_bytes, inputs, outputs, saves)

    def _add(self, name, layer, kind, fwd_s, bwd_s, flops, nbytes, inputs, outputs, saves) -> None:
        p = self.prefix
        for out, size in outputs:
            self._tensor(p + out, size, p + name)
        for tensor in saves:
            self.readers[p + tensor].append(p + name)
        if 0 <= layer < self.spec.layers:
            layer += self.layer_offset
        self.ops.append(Op(
            name=p + name, layer=layer, kind=kind, fwd_time_s=fwd_s, bwd_time_s=bwd_s, flops=flops,
            bytes_accessed=nbytes, inputs=tuple(p + i for i in inputs), outputs=tuple(p + o for o, _ in outputs),
        ))

    def collective(self, name: str, layer: int, kind: str, size_bytes: int, ranks: int, *,
                   forward: tuple[str, ...], backward: tuple[str, ...], inputs: tuple[str, ...],
                   outputs: tuple[tuple[str, int], ...], saves: tuple[str, ...] = (),
                   hidden_behind_s: tuple[float, ...] = ()) -> None:
        """A collective op: ``forward`` and ``backward`` list the ring collectives of ``size_bytes``
        (gathered size) each pass runs; Op.bytes_accessed is the bytes each rank sends in forward.
        ``hidden_behind_s`` pairs with ``backward``: compute that the i-th backward collective
        overlaps, so only what exceeds it adds time."""
        hw = self.hardware
        fwd_s = float(sum(collective_time_s(k, size_bytes, ranks, hw) for k in forward))
        hidden = hidden_behind_s or (0.0,) * len(backward)
        bwd_s = float(sum(max(0.0, collective_time_s(k, size_bytes, ranks, hw) - h) for k, h in zip(backward, hidden)))
        sent = sum(link_bytes_per_rank(k, size_bytes, ranks) for k in forward)
        self._add(name, layer, kind, fwd_s, bwd_s, 0.0, float(sent), inputs, outputs, saves)

    def tensors(self) -> tuple[Tensor, ...]:
        return tuple(
            Tensor(name=name, size_bytes=self.sizes[name], producer=self.producers[name],
                   bwd_readers=tuple(self.readers[name]))
            for name in self.sizes
        )


def column_input(b: Builder, sh: Shapes, name: str, layer: int, x: str, cols: int) -> tuple[str, tuple[str, ...]]:
    """Enter a column-parallel GEMM (T x hidden -> T x ``cols``) from residual-stream tensor ``x``.

    Returns what the GEMM reads and what of it the GEMM's backward saves: ``x`` itself on one
    GPU; the output of Megatron's f without SP; nothing with SP (the all-gather keeps ``x``).

    Megatron-LM overlaps these backward collectives with the GEMM's own backward
    (LinearWithGradAccumulationAndAsyncCommunication): the all-reduce of the input gradient
    runs during the weight-gradient GEMM; with SP the re-gather of the input runs during the
    input-gradient GEMM and the reduce-scatter of the input gradient during the weight-gradient
    GEMM. Each GEMM is half of the backward (roofline.GEMM_BWD_FACTOR), so only what a
    collective takes beyond its half adds backward time."""
    if sh.t == 1:
        return x, (x,)
    half_bwd_s = op_times_s(gemm_cost(sh.T, b.spec.hidden, cols, sh.d), b.hardware)[1] / 2
    gathered = name + ".in"
    if not b.spec.sequence_parallel:
        b.collective(name + "_f", layer, ALL_REDUCE, sh.th, sh.t, forward=(), backward=(ALL_REDUCE,),
                     inputs=(x,), outputs=((gathered, sh.th),), hidden_behind_s=(half_bwd_s,))
        return gathered, (gathered,)
    b.collective(name + "_allgather", layer, ALL_GATHER, sh.th, sh.t, forward=(ALL_GATHER,),
                 backward=(REDUCE_SCATTER, ALL_GATHER), inputs=(x,), outputs=((gathered, sh.th),), saves=(x,),
                 hidden_behind_s=(half_bwd_s, half_bwd_s))
    return gathered, ()


def row_output_name(sh: Shapes, out: str) -> str:
    """What a row-parallel GEMM writes: ``out`` itself on one GPU, else a partial sum."""
    return out if sh.t == 1 else out + ".partial"


def row_output(b: Builder, sh: Shapes, name: str, layer: int, out: str) -> None:
    """Reduce the partial sums of a row-parallel GEMM into ``out`` (g: all-reduce, or reduce-scatter with SP)."""
    if sh.t == 1:
        return
    if b.spec.sequence_parallel:
        b.collective(name + "_reduce_scatter", layer, REDUCE_SCATTER, sh.th, sh.t, forward=(REDUCE_SCATTER,),
                     backward=(ALL_GATHER,), inputs=(out + ".partial",), outputs=((out, sh.ths),))
    else:
        b.collective(name + "_allreduce", layer, ALL_REDUCE, sh.th, sh.t, forward=(ALL_REDUCE,), backward=(),
                     inputs=(out + ".partial",), outputs=((out, sh.th),))


def gather_kv(b: Builder, sh: Shapes, p: str, layer: int, k: str, v: str) -> tuple[str, str, bool]:
    """Context parallelism: all-gather K and V of the whole sequence before attention.

    Returns the K and V attention reads and whether attention's backward saves them (True on one
    context rank; otherwise the all-gather keeps the local K and V and gathers them again in
    backward, where the gradients are reduce-scattered)."""
    if sh.cp == 1:
        return k, v, True
    full = sh.kv * sh.cp
    b.collective(p + "kv_allgather", layer, ALL_GATHER, 2 * full, sh.cp, forward=(ALL_GATHER,),
                 backward=(REDUCE_SCATTER, ALL_GATHER), inputs=(k, v),
                 outputs=((k + ".all", full), (v + ".all", full)), saves=(k, v))
    return k + ".all", v + ".all", False
