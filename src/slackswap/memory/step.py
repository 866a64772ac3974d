"""Device memory of one simulated step: model states, activations, backward and the allocator.

The step simulator budgets saved activations only (docs/simulator.md). This module builds
the whole step's allocation trace from the simulation and replays it through the caching
allocator model (allocator.py), so a plan can be checked against the memory a device has.
The trace, in time order (frees before allocations at the same instant, as the simulator
handles endings before starts):

* from the start: the model states (model_states.py), the cuBLAS workspace, and step
  inputs that no backward reads (a saved step input is in the simulator's log);
* every saved tensor exactly when the simulator adds it to and removes it from the device;
* forward transients (tensors no backward reads): from their producer's start to the end of
  their last forward reader; in a recompute group, to the end of the group;
* backward: the gradient of each tensor an op reads that some op produced is allocated at the
  start of the first backward that reads the tensor (the first of its forward consumers to
  run backward) and freed when its producer's backward ends, having been consumed; weight
  gradients accumulate into the gradient buffers counted in the model states;
* workspaces per op class: the cuBLAS workspace (kept, like PyTorch's per handle and stream)
  and, in the backward of a fused attention op, FlashAttention's fp32 dQ accumulator.

docs/memory.md states each figure's source.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..hardware import Hardware
from ..plans import Plan
from ..timeline import Timeline
from ..workload import Workload
from .allocator import Allocation, AllocatorStats, replay
from .model_states import ModelStates

# PyTorch's default cuBLAS workspace (aten/src/ATen/cuda/CublasHandlePool.cpp,
# parseChosenWorkspaceSize without CUBLAS_WORKSPACE_CONFIG): ":4096:8" (32 MiB) on Hopper
# (sm90), ":4096:2:16:8" (8 MiB + 128 KiB) otherwise; allocated through the caching allocator
# for each cuBLAS handle and stream, and kept.
CUBLAS_WORKSPACE_HOPPER_BYTES = 4096 * 1024 * 8
CUBLAS_WORKSPACE_BYTES = 4096 * 1024 * 2 + 16 * 1024 * 8
_HOPPER_PREFIXES = ("h100", "h200", "gh200")
# FlashAttention-2's backward accumulates dQ in fp32 (flash_attn's mha_bwd allocates
# dq_accum as float32 shaped like Q): twice the bytes of a bf16 Q.
ATTENTION_BWD_WORKSPACE_PER_INPUT_BYTE = 2
_GEMM_KINDS = ("gemm", "bmm")


def cublas_workspace_bytes(hardware: Hardware) -> int:
    """The cuBLAS workspace PyTorch allocates on ``hardware`` (Hopper presets by name)."""
    return CUBLAS_WORKSPACE_HOPPER_BYTES if hardware.name.startswith(_HOPPER_PREFIXES) else CUBLAS_WORKSPACE_BYTES


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """Memory of one step on the device, in bytes (per rank under sharding)."""

    model_states: ModelStates | None
    """None when the workload does not record its parameters."""
    activation_peak_bytes: int
    """The simulator's peak of saved activations (what the activation budget bounds)."""
    allocator: AllocatorStats
    expandable_segments: bool

    @property
    def model_state_bytes(self) -> int | None:
        return None if self.model_states is None else self.model_states.total_bytes

    @property
    def allocated_peak_bytes(self) -> int:
        return self.allocator.allocated_peak_bytes

    @property
    def reserved_peak_bytes(self) -> int:
        return self.allocator.reserved_peak_bytes

    def summary(self) -> dict[str, Any]:
        """The figures `slackswap simulate --json` adds."""
        return {
            "model_state_bytes": self.model_state_bytes, "activation_peak_bytes": self.activation_peak_bytes,
            "allocated_peak_bytes": self.allocated_peak_bytes, "reserved_peak_bytes": self.reserved_peak_bytes,
            "fragmentation_bytes": self.allocator.fragmentation_bytes,
        }


def _layers_of(workload: Workload) -> int:
    model = workload.meta.get("model")
    layers = model.get("layers") if isinstance(model, dict) else None
    return layers if isinstance(layers, int) and not isinstance(layers, bool) and layers > 0 else 1


def _model_state_allocations(workload: Workload, states: ModelStates) -> list[Allocation]:
    """Each persistent state split into one allocation per layer (real models allocate a tensor
    per parameter; per-layer chunks keep the allocator's rounding of the same order)."""
    out = []
    chunks = _layers_of(workload)
    for label, total in (("parameters", states.parameter_bytes), ("gradients", states.gradient_bytes),
                         ("optimizer", states.optimizer_state_bytes), ("gathered", states.gathered_bytes)):
        if total <= 0:
            continue
        n = min(chunks, total) if label != "gathered" else 1
        base, extra = divmod(total, n)
        out.extend(Allocation("malloc", f"{label}/{c}", 0.0, base + (1 if c < extra else 0)) for c in range(n))
    return out


def step_allocations(
    workload: Workload, hardware: Hardware, timeline: Timeline, tensor_log: list,
    states: ModelStates | None = None,
) -> list[Allocation]:
    """The step's allocation trace (see the module docstring), in replay order."""
    w = workload
    timed: list[tuple[float, int, int, Allocation]] = []
    seq = 0

    opened: dict[str, float] = {}

    def add(time_s: float, alloc: Allocation) -> None:
        # Frees come before allocations at the same instant, except the free of something allocated
        # at that very instant (a zero-length span: profiled ops without a backward take 0 s), which
        # comes after them.
        nonlocal seq
        if alloc.kind == "free":
            rank = 2 if time_s <= opened.get(alloc.key, float("-inf")) else 0
        else:
            opened[alloc.key] = time_s
            rank = 1
        timed.append((time_s, rank, seq, alloc))
        seq += 1

    start: list[Allocation] = []
    if states is not None:
        start.extend(_model_state_allocations(w, states))
    if any(op.kind in _GEMM_KINDS for op in w.ops):
        start.append(Allocation("malloc", "cublas-workspace", 0.0, cublas_workspace_bytes(hardware)))
    start.extend(Allocation("malloc", f"input/{t.name}", 0.0, t.size_bytes)
                 for t in w.tensors if t.producer is None and not t.is_saved)

    generation: dict[str, int] = {}
    for time_s, name, added in tensor_log:
        if added:
            generation[name] = generation.get(name, 0) + 1
        key = f"saved/{name}#{generation[name]}"
        add(time_s, Allocation("malloc", key, time_s, w.size_bytes_of[name]) if added else Allocation("free", key, time_s))

    fwd_end: dict[int, float] = {}
    group_end: dict[int, float] = {}
    bwd_span: dict[int, tuple[float, float]] = {}
    compute = [e for e in timeline.events if e.stream == "compute" and e.kind in ("forward", "recompute", "backward")]
    for e in compute:
        i = w.op_index[e.name]
        if e.kind == "forward":
            fwd_end[i] = e.end_s
        elif e.kind == "recompute":
            group_end[e.step] = max(group_end.get(e.step, 0.0), e.end_s)
        else:
            bwd_span[i] = (e.start_s, e.end_s)
    transient = {t.name for t in w.tensors if not t.is_saved and t.producer is not None}
    consumers: dict[str, int] = {}  # tensor -> largest forward index reading it (first in backward)
    for i, op in enumerate(w.ops):
        for name in op.inputs:
            consumers[name] = i
    recomputed = 0
    for e in compute:
        i = w.op_index[e.name]
        op = w.ops[i]
        if e.kind == "forward":
            for name in op.outputs:
                if name in transient:
                    add(e.start_s, Allocation("malloc", f"transient/{name}", e.start_s, w.size_bytes_of[name]))
                    end = fwd_end[max(i, w.last_fwd_use[name])]
                    add(end, Allocation("free", f"transient/{name}", end))
        elif e.kind == "recompute":
            for name in op.outputs:
                if name in transient:
                    recomputed += 1
                    key = f"transient/{name}@{recomputed}"
                    add(e.start_s, Allocation("malloc", key, e.start_s, w.size_bytes_of[name]))
                    add(group_end[e.step], Allocation("free", key, group_end[e.step]))
        else:
            for name in op.inputs:
                t = w.tensor_by_name[name]
                if t.producer is None or consumers[name] != i:
                    continue  # no gradient, or allocated by an earlier backward
                producer_end = bwd_span[w.op_index[t.producer]][1]
                add(e.start_s, Allocation("malloc", f"grad/{name}", e.start_s, t.size_bytes))
                add(producer_end, Allocation("free", f"grad/{name}", producer_end))
            if op.kind == "attention" and op.inputs:
                size = ATTENTION_BWD_WORKSPACE_PER_INPUT_BYTE * w.size_bytes_of[op.inputs[0]]
                add(e.start_s, Allocation("malloc", f"workspace/{op.name}", e.start_s, size))
                add(e.end_s, Allocation("free", f"workspace/{op.name}", e.end_s))
    timed.sort(key=lambda x: (x[0], x[1], x[2]))
    return start + [a for _, _, _, a in timed]


def device_memory(
    workload: Workload, hardware: Hardware, plan: Plan, *, states: ModelStates | None = None,
    expandable_segments: bool = False, budget_bytes: int | None = None, capacity_bytes: int | None = None,
) -> tuple[Timeline, DeviceMemory]:
    """Simulate ``plan`` and replay the whole step's memory through the allocator model."""
    from ..sim import simulate

    log: list = []
    timeline = simulate(workload, hardware, plan, budget_bytes, tensor_log=log)
    trace = step_allocations(workload, hardware, timeline, log, states)
    stats = replay(trace, expandable_segments=expandable_segments, capacity_bytes=capacity_bytes)
    return timeline, DeviceMemory(states, timeline.peak_memory_bytes, stats, expandable_segments)


__all__ = [
    "CUBLAS_WORKSPACE_BYTES", "CUBLAS_WORKSPACE_HOPPER_BYTES", "DeviceMemory", "cublas_workspace_bytes",
    "device_memory", "step_allocations",
]
