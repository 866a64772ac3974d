"""Turn traces of one training step into a Workload (pure data; no torch needed here)."""

from __future__ import annotations

import re
import statistics
from typing import Any, Sequence

from ..hardware import Hardware
from ..profile_trace import CallEntered, ProfileTrace, TensorSaved
from ..workload import Op, Tensor, Workload

_GEMM = {"mm", "addmm", "bmm", "baddbmm", "matmul", "_scaled_mm", "convolution", "_convolution"}
_NORM = {"native_layer_norm", "layer_norm", "native_batch_norm", "_fused_rms_norm", "rsqrt", "_native_batch_norm_legit"}
_LOSS = {"nll_loss_forward", "nll_loss2d_forward", "_log_softmax", "log_softmax", "mse_loss", "cross_entropy_loss"}
_LAYER_RE = re.compile(r"(?:^|\.)(\d+)(?:\.|$|@)")


def op_kind(aten: str, is_view: bool) -> str:
    if is_view:
        return "view"
    if aten in _GEMM:
        return "gemm"
    if "attention" in aten:
        return "attention"
    if aten in _NORM:
        return "norm"
    if aten in _LOSS:
        return "loss"
    if aten in {"embedding", "index_select", "gather"}:
        return "embedding"
    return "elementwise"


def call_layer(call: str) -> int | None:
    """The repeated-block index in a module call path ('h.3.attn' -> 3), or None."""
    m = _LAYER_RE.search(call.split("@")[0])
    return int(m.group(1)) if m else None


def build_workload(trace, fwd_times_s: Sequence[float], bwd_times_s: Sequence[float], *, name: str,
                   meta: dict[str, Any]) -> Workload:
    ops = trace.ops
    readers: dict[str, list[int]] = {}
    extra_inputs: dict[int, list[str]] = {}
    produced_at: dict[str, int] = {n: -1 for n in trace.step_inputs}
    for op in ops:
        for o in op.outputs:
            produced_at[o] = op.index
    for s in trace.saves:
        if s.storage is None:
            continue
        op = ops[s.reader]
        if s.storage not in op.inputs and s.storage not in op.outputs:
            if produced_at.get(s.storage, len(ops)) >= op.index:
                continue  # cannot happen for a real save; keep the workload well formed
            extra_inputs.setdefault(op.index, []).append(s.storage)
        bucket = readers.setdefault(s.storage, [])
        if s.reader not in bucket:
            bucket.append(s.reader)

    layers = [call_layer(op.call) for op in ops]
    known = [l for l in layers if l is not None]
    last_layer = max(known) + 1 if known else 0
    first_layered = next((i for i, l in enumerate(layers) if l is not None), len(ops))

    wl_ops = []
    for op in ops:
        layer = layers[op.index]
        if layer is None:
            layer = -1 if op.index < first_layered else last_layer
        inputs = list(op.inputs) + [n for n in extra_inputs.get(op.index, []) if n not in op.inputs]
        wl_ops.append(Op(
            name=op.name, layer=layer, kind=op_kind(op.aten, op.is_view),
            fwd_time_s=float(fwd_times_s[op.index]), bwd_time_s=float(bwd_times_s[op.index]),
            flops=float(op.flops), bytes_accessed=float(op.bytes_accessed),
            inputs=tuple(inputs), outputs=tuple(op.outputs),
            shape_inputs=tuple(n for n in op.shape_inputs if n not in inputs),
        ))
    tensors = [
        Tensor(name=n, size_bytes=trace.storage_nbytes[n], producer=None,
               bwd_readers=tuple(ops[i].name for i in sorted(readers.get(n, []))))
        for n in trace.step_inputs
    ]
    for op in ops:
        for o in op.outputs:
            tensors.append(Tensor(name=o, size_bytes=trace.storage_nbytes[o], producer=op.name,
                                  bwd_readers=tuple(ops[i].name for i in sorted(readers.get(o, [])))))
    meta = dict(meta)
    meta.update(profile_trace(trace).to_meta())
    meta["op_saves"] = [[op.input_saves, op.output_saves] for op in ops]
    if trace.stateful_args:
        meta["stateful_call_args"] = {k: list(v) for k, v in trace.stateful_args.items()}
    return Workload(name=name, ops=tuple(wl_ops), tensors=tuple(tensors), meta=meta)


def profile_trace(trace) -> ProfileTrace:
    """The tracer's record in the form the runtime reads (slackswap.profile_trace)."""
    ops = trace.ops
    events = []
    for kind, value in trace.events:
        if kind == "enter":
            events.append(CallEntered(value))
        else:
            s = trace.saves[value]
            events.append(TensorSaved(s.storage, ops[s.reader].name, s.call, s.is_output))
    return ProfileTrace(calls=dict(trace.calls), call_args={k: tuple(v) for k, v in trace.call_args.items()},
                        op_calls=tuple(op.call for op in ops), events=tuple(events))


def median_times(runs: Sequence[Sequence[float]]) -> list[float]:
    return [statistics.median(values) for values in zip(*runs)]


def roofline_time_s(hardware: Hardware, kind: str, flops: float, bytes_accessed: float) -> float:
    """Time of an op on ``hardware``: the larger of its compute and memory time (roofline)."""
    rate = hardware.achieved_attention_flops_per_s if kind == "attention" else hardware.achieved_gemm_flops_per_s
    return max(flops / rate, bytes_accessed / hardware.achieved_hbm_bytes_per_s)


# Backward of a matrix multiply or attention does twice the forward FLOPs (one product for the
# input gradient, one for the weight gradient: Narayanan et al., arXiv 2104.04473, sec. 5.1);
# elementwise backward reads and writes about twice the bytes. We use 2x for every op with a backward.
BACKWARD_TO_FORWARD = 2.0


def project_onto(workload: Workload, hardware: Hardware) -> Workload:
    """The same workload with each op's times replaced by its roofline time on ``hardware``.
    Ops that had no measured backward (no autograd node) keep a zero backward time."""
    ops = []
    for op in workload.ops:
        fwd = roofline_time_s(hardware, op.kind, op.flops, op.bytes_accessed)
        bwd = BACKWARD_TO_FORWARD * fwd if op.bwd_time_s > 0 else 0.0
        ops.append(Op(name=op.name, layer=op.layer, kind=op.kind, fwd_time_s=fwd, bwd_time_s=bwd, flops=op.flops,
                      bytes_accessed=op.bytes_accessed, inputs=op.inputs, outputs=op.outputs,
                      shape_inputs=op.shape_inputs))
    meta = dict(workload.meta)
    meta["times"] = f"roofline on {hardware.name} (measured times in meta.measured_*)"
    meta["measured_fwd_time_s"] = [op.fwd_time_s for op in workload.ops]
    meta["measured_bwd_time_s"] = [op.bwd_time_s for op in workload.ops]
    return Workload(name=workload.name, ops=tuple(ops), tensors=workload.tensors, meta=meta)


_GPU_MODEL = re.compile(r"\b(G?[A-Z]\d{2,4})\b")
"""A GPU model in a device name ('A100' in 'NVIDIA A100-SXM4-80GB', 'GH200')."""


def timed_for(workload: Workload, hardware: Hardware) -> Workload:
    """``workload`` with times that describe ``hardware``.

    A profile timed on a CPU, or on a GPU whose model does not appear in ``hardware``'s name or
    description, is projected onto ``hardware`` by the roofline (project_onto); its measured times
    stay in meta. Built-in workloads, projected profiles and profiles timed on that GPU are
    returned as they are."""
    meta = workload.meta
    if meta.get("source") != "slackswap.profiler" or not str(meta.get("times", "")).startswith("measured"):
        return workload
    if meta.get("device") == "cuda":
        models = _GPU_MODEL.findall(str(meta.get("device_name", "")).upper())
        described = f"{hardware.name} {hardware.description}".upper()
        if not models or any(m in described for m in models):
            return workload
    return project_onto(workload, hardware)
