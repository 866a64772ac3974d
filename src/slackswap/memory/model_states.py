"""Model states: parameters, gradients and optimizer states per rank, in bytes.

The accounting is the ZeRO paper's (Rajbhandari et al., "ZeRO: Memory Optimizations Toward
Training Trillion Parameter Models", SC 2020, sec. 3.1 and 5): with mixed-precision Adam a
model of P parameters holds 2P bytes of 16-bit parameters, 2P of 16-bit gradients and
K = 12 bytes per parameter of optimizer state (fp32 master weights, momentum and variance),
16P in all. Over N data-parallel ranks, ZeRO stage 1 shards the optimizer state
(4P + 12P/N per rank), stage 2 also the gradients (2P + 14P/N), stage 3 also the parameters
(16P/N). FSDP's full sharding is stage 3 (Zhao et al., "PyTorch FSDP", VLDB 2023); PyTorch
FSDP2 with a bf16 compute dtype keeps fp32 sharded parameters and gradients instead of bf16
ones plus an fp32 master copy, which is the same 16P/N.

Stage 3 and FSDP also hold, for a moment, whole parameters and gradients of the unit being
computed: ``gathered_bytes`` counts the unit in use, the next one prefetched (FSDP2's
default forward and backward prefetch of one unit) and one unit's unsharded gradient before
its reduce-scatter, each at the compute precision.

A shard is ceil(P / N) elements: FSDP pads its flat parameters to a multiple of N.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import UnknownNameError, ValidationError
from ..workload import Workload
from ..workloads.spec import TransformerSpec
from .parameters import ParameterCount, transformer_parameters

# Bytes per parameter: (parameters, gradients, fp32 master copy, one optimizer state element).
PRECISIONS: dict[str, tuple[int, int, int, int]] = {
    "fp32": (4, 4, 0, 4),
    "bf16": (2, 2, 0, 2),  # pure bf16: torch optimizers keep their states in the parameter dtype
    "bf16-mixed": (2, 2, 4, 4),  # bf16 compute copies, fp32 master weights and states (ZeRO sec. 3.1)
}
# Optimizer state elements per parameter: momentum buffer for SGD with momentum; first and
# second moments for Adam and AdamW (torch.optim keeps them as tensors shaped like the parameter).
OPTIMIZERS: dict[str, int] = {"sgd": 0, "sgd-momentum": 1, "adam": 2, "adamw": 2}
# What each sharding shards: (optimizer states, gradients, parameters).
SHARDINGS: dict[str, tuple[bool, bool, bool]] = {
    "none": (False, False, False),  # plain data parallel (DDP): every rank holds everything
    "zero1": (True, False, False),
    "zero2": (True, True, False),
    "zero3": (True, True, True),
    "fsdp": (True, True, True),
}
GATHERED_UNITS = 2
"""Units whose whole parameters are resident at once under stage 3 / FSDP: the one computing
and the one prefetched (FSDP2 prefetches one unit ahead in forward and backward)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelStates:
    """Per-rank bytes of a model's states under one optimizer, precision and sharding."""

    parameter_count: int
    optimizer: str
    precision: str
    sharding: str
    ranks: int
    parameter_bytes: int
    gradient_bytes: int
    optimizer_state_bytes: int
    """Optimizer states and, under bf16-mixed, the fp32 master weights (the ZeRO paper's K term)."""
    gathered_bytes: int = 0
    """Whole parameters and gradients of the units in use under stage 3 / FSDP (transient)."""

    @property
    def persistent_bytes(self) -> int:
        return self.parameter_bytes + self.gradient_bytes + self.optimizer_state_bytes

    @property
    def total_bytes(self) -> int:
        return self.persistent_bytes + self.gathered_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "parameter_count": self.parameter_count, "optimizer": self.optimizer, "precision": self.precision,
            "sharding": self.sharding, "ranks": self.ranks, "parameter_bytes": self.parameter_bytes,
            "gradient_bytes": self.gradient_bytes, "optimizer_state_bytes": self.optimizer_state_bytes,
            "gathered_bytes": self.gathered_bytes, "persistent_bytes": self.persistent_bytes,
            "total_bytes": self.total_bytes,
        }


def parameter_count_of(source: Workload | TransformerSpec | ParameterCount | int) -> ParameterCount:
    """Parameter count of a built-in model spec, a workload (built-in or profiled) or a plain count."""
    if isinstance(source, ParameterCount):
        return source
    if isinstance(source, TransformerSpec):
        return transformer_parameters(source)
    if isinstance(source, int) and not isinstance(source, bool):
        if source <= 0:
            raise ValidationError(f"parameter count must be a positive integer, got {source}")
        return ParameterCount(total=source, largest_unit=source)
    if not isinstance(source, Workload):
        raise ValidationError(
            f"model states need a Workload, a TransformerSpec or a parameter count, got {type(source).__name__}"
        )
    meta = source.meta
    if meta.get("kind") == "transformer" and isinstance(meta.get("model"), dict):
        return transformer_parameters(TransformerSpec.from_dict(meta["model"]))
    count = meta.get("parameter_count")
    if isinstance(count, int) and not isinstance(count, bool) and count > 0:
        unit = meta.get("largest_unit_parameter_count", count)
        if isinstance(unit, bool) or not isinstance(unit, int) or not 0 < unit <= count:
            unit = count
        return ParameterCount(total=count, largest_unit=unit)
    raise ValidationError(
        f"workload {source.name!r} does not record its parameter count (meta.parameter_count): "
        "profile the model again with this version of slackswap, or give the count"
    )


def _choice(value: Any, allowed: dict, what: str) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise UnknownNameError(f"unknown {what} {value!r}: choose one of {', '.join(allowed)}")
    return value


def model_states(
    source: Workload | TransformerSpec | ParameterCount | int,
    *,
    optimizer: str = "adam",
    precision: str = "bf16-mixed",
    ranks: int = 1,
    sharding: str = "fsdp",
) -> ModelStates:
    """Per-rank model-state bytes of ``source`` (see the module docstring for the accounting).

    ``ranks`` is the number of data-parallel ranks the states are sharded over; ``sharding``
    is 'none', 'zero1', 'zero2', 'zero3' or 'fsdp' and matters only when ``ranks`` > 1.
    """
    optimizer = _choice(optimizer, OPTIMIZERS, "optimizer")
    precision = _choice(precision, PRECISIONS, "precision")
    sharding = _choice(sharding, SHARDINGS, "sharding")
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ValidationError(f"shard count must be an integer >= 1, got {ranks!r}")
    count = parameter_count_of(source)
    p = count.total
    shard = -(-p // ranks)  # ceil: shards are padded to equal size
    param_b, grad_b, master_b, state_b = PRECISIONS[precision]
    per_param_optimizer = master_b + OPTIMIZERS[optimizer] * state_b
    if ranks == 1:
        sharding = "none"
    opt_sharded, grad_sharded, param_sharded = SHARDINGS[sharding]
    gathered = 0
    if param_sharded:
        unit = min(count.largest_unit, p)
        gathered = GATHERED_UNITS * unit * param_b + unit * grad_b
    return ModelStates(
        parameter_count=p, optimizer=optimizer, precision=precision, sharding=sharding, ranks=ranks,
        parameter_bytes=(shard if param_sharded else p) * param_b,
        gradient_bytes=(shard if grad_sharded else p) * grad_b,
        optimizer_state_bytes=(shard if opt_sharded else p) * per_param_optimizer,
        gathered_bytes=gathered,
    )
