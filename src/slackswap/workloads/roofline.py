"""Roofline op times: an op takes as long as its slower resource, compute or HBM traffic.

t = max(FLOPs / (efficiency x peak FLOP/s), bytes / (hbm_efficiency x HBM bytes/s))

(Williams, Waterman and Patterson, "Roofline", CACM 2009). GEMMs and batched matmuls use
``Hardware.gemm_efficiency``; fused (flash) attention uses ``attention_efficiency``;
elementwise ops are memory-bound at every realistic size, so which FLOP rate they are
charged at does not matter and they share the GEMM rate (the Hardware docstring's
default for "other compute-bound ops").

Backward costs follow the same reference: a GEMM or bmm does two GEMMs of the forward
size (input gradient and weight gradient, or the two operand gradients of a bmm);
flash attention's backward does 2.5x the forward FLOPs because it recomputes the
scores (FlashAttention benchmark convention, flash-attention issue #477); an
elementwise op reads the output gradient and its saved input(s) and writes the input
gradient, about twice its forward traffic.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ValidationError
from ..hardware import Hardware
from ..workload import MAX_OP_TIME_S

GEMM = "gemm"
ATTENTION = "attention"

GEMM_BWD_FACTOR = 2.0
FLASH_BWD_FLOP_FACTOR = 2.5
ELEMENTWISE_BWD_FACTOR = 2.0


@dataclass(frozen=True, slots=True)
class OpCost:
    fwd_flops: float
    fwd_bytes: float
    bwd_flops: float
    bwd_bytes: float
    compute: str = GEMM
    """Which achieved FLOP rate applies: GEMM or ATTENTION."""


def roofline_time_s(flops: float, bytes_accessed: float, *, flops_per_s: float, bytes_per_s: float) -> float:
    return max(flops / flops_per_s, bytes_accessed / bytes_per_s)


def op_times_s(cost: OpCost, hardware: Hardware) -> tuple[float, float]:
    """(forward, backward) seconds of an op on ``hardware``."""
    rate = hardware.achieved_attention_flops_per_s if cost.compute == ATTENTION else hardware.achieved_gemm_flops_per_s
    bandwidth = hardware.achieved_hbm_bytes_per_s
    times = (
        roofline_time_s(cost.fwd_flops, cost.fwd_bytes, flops_per_s=rate, bytes_per_s=bandwidth),
        roofline_time_s(cost.bwd_flops, cost.bwd_bytes, flops_per_s=rate, bytes_per_s=bandwidth),
    )
    if max(times) > MAX_OP_TIME_S:
        # The hardware is the problem, not the model: say so before the workload check blames an op time.
        raise ValidationError(
            f"hardware {hardware.name!r} makes one op take {max(times):.3g} s (peak_flops_per_s "
            f"{hardware.peak_flops_per_s:g}, hbm_bytes_per_s {hardware.hbm_bytes_per_s:g}): rates are per second, "
            "e.g. 312e12 FLOP/s and 2039e9 B/s for an A100 80GB ('slackswap hardware' lists the presets)"
        )
    return times


def gemm_cost(rows: int, inner: int, cols: int, dtype_bytes: int) -> OpCost:
    """[rows x inner] @ [inner x cols]: reads both operands, writes the product."""
    flops = 2.0 * rows * inner * cols
    traffic = float(dtype_bytes * (rows * inner + inner * cols + rows * cols))
    return OpCost(flops, traffic, GEMM_BWD_FACTOR * flops, GEMM_BWD_FACTOR * traffic, GEMM)


def bmm_cost(batch: int, rows: int, inner: int, cols: int, dtype_bytes: int) -> OpCost:
    """``batch`` independent [rows x inner] @ [inner x cols] products."""
    one = gemm_cost(rows, inner, cols, dtype_bytes)
    return OpCost(batch * one.fwd_flops, batch * one.fwd_bytes, batch * one.bwd_flops, batch * one.bwd_bytes, GEMM)


def elementwise_cost(flops: float, traffic_bytes: float) -> OpCost:
    return OpCost(float(flops), float(traffic_bytes), ELEMENTWISE_BWD_FACTOR * flops,
                  ELEMENTWISE_BWD_FACTOR * traffic_bytes, GEMM)


def flash_attention_cost(
    *, micro_batch: int, q_len: int, kv_len: int, q_width: int, kv_width: int, heads: int, causal: bool,
    dtype_bytes: int,
) -> OpCost:
    """FlashAttention forward and backward for ``q_len`` queries over ``kv_len`` keys.

    Forward: QK^T and P.V are 2b x q_len x kv_len x q_width FLOPs each, half when causal
    because the kernel skips the masked blocks. Backward: 2.5x forward. ``q_width`` is
    heads x head_dim, ``kv_width`` kv_heads x head_dim (smaller with grouped-query attention).
    Traffic: forward reads Q, K, V and writes O and the fp32 log-sum-exp; backward reads Q,
    K, V, O, dO and the LSE and writes dQ, dK, dV. The scores never reach HBM.
    """
    flops = 4.0 * micro_batch * q_len * kv_len * q_width * (0.5 if causal else 1.0)
    q = micro_batch * q_len * q_width * dtype_bytes
    kv = micro_batch * kv_len * kv_width * dtype_bytes
    lse = 4 * heads * micro_batch * q_len
    return OpCost(flops, float(2 * q + 2 * kv + lse), FLASH_BWD_FLOP_FACTOR * flops,
                  float(4 * q + 4 * kv + lse), ATTENTION)
