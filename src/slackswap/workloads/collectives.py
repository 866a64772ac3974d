"""Time of the collectives a tensor- or context-parallel layer runs, from the link's bus bandwidth.

nccl-tests define bus bandwidth so that one figure describes every ring collective over n ranks
(nccl-tests PERFORMANCE.md): an all-gather or reduce-scatter of a tensor of S bytes (the whole,
gathered size) moves (n - 1)/n x S bytes through each rank's link, an all-reduce twice that. The
time is those bytes over ``Hardware.collective_bytes_per_s``, which each preset takes from an
nccl-tests measurement (docs/hardware.md). Launch latency (tens of microseconds) is not modelled.
"""

from __future__ import annotations

from ..errors import ValidationError
from ..hardware import Hardware

ALL_REDUCE = "all_reduce"
ALL_GATHER = "all_gather"
REDUCE_SCATTER = "reduce_scatter"
KINDS = (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER)


def link_bytes_per_rank(kind: str, size_bytes: int, ranks: int) -> float:
    """Bytes each rank sends over its link in a ring ``kind`` of a ``size_bytes`` tensor."""
    if kind not in KINDS:
        raise ValueError(f"unknown collective {kind!r}")
    share = (ranks - 1) / ranks * size_bytes
    return 2 * share if kind == ALL_REDUCE else share


def collective_time_s(kind: str, size_bytes: int, ranks: int, hardware: Hardware) -> float:
    if ranks == 1:
        return 0.0
    if hardware.collective_bytes_per_s is None:
        raise ValidationError(
            f"hardware {hardware.name!r} has no collective_bytes_per_s: a tensor- or context-parallel "
            "workload needs the GPU-to-GPU bus bandwidth; add it to the hardware JSON"
        )
    return link_bytes_per_rank(kind, size_bytes, ranks) / hardware.collective_bytes_per_s
