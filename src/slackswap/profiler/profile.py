"""profile_model: measured Workload of one training step."""

from __future__ import annotations

import hashlib
import warnings
import weakref
from typing import Any, Callable

import torch

from ..errors import ProfileNoiseWarning, ValidationError
from ..hardware import Hardware, get_hardware
from ..workload import Workload
from ..memory.parameters import parameter_meta
from .build import build_workload, call_layer, median_times, project_onto
from .model_support import check_not_capturing, unwrap_model
from .tracer import CudaTimer, WallTimer, run_traced

_LAST_PROFILE: "weakref.WeakKeyDictionary[torch.nn.Module, Workload]" = weakref.WeakKeyDictionary()


def model_signature(model: torch.nn.Module) -> str:
    """Hash of the module tree and every parameter and buffer's name, shape and dtype.
    A plan records it (in the workload name) so a changed model is refused before a step."""
    h = hashlib.sha256()
    for name, module in model.named_modules():
        h.update(f"m:{name}:{type(module).__name__};".encode())
    for name, p in model.named_parameters():
        h.update(f"p:{name}:{tuple(p.shape)}:{p.dtype};".encode())
    for name, b in model.named_buffers():
        h.update(f"b:{name}:{tuple(b.shape)}:{b.dtype};".encode())
    return h.hexdigest()[:10]


def workload_name(model: torch.nn.Module) -> str:
    return f"{type(model).__name__}-{model_signature(model)}"


def workload_for(model: torch.nn.Module) -> Workload | None:
    """The workload the last profile_model call measured for this model object (or the model a
    DistributedDataParallel or torch.compile wrapper holds), if any."""
    return _LAST_PROFILE.get(unwrap_model(model, "slackswap"))


MAX_SPREAD = 0.5
"""Largest (slowest / fastest - 1) of the repeated steps' times profile accepts without a warning.
A threshold, not a measurement: with a step 1.5x another, the medians no longer describe one machine."""


def warn_if_noisy(fwd_runs: list[list[float]], bwd_runs: list[list[float]], max_spread: float) -> None:
    """ProfileNoiseWarning when the repeated steps' total times disagree by more than ``max_spread``."""
    totals = [sum(f) + sum(b) for f, b in zip(fwd_runs, bwd_runs)]
    if len(totals) < 2 or min(totals) <= 0:
        return
    spread = max(totals) / min(totals) - 1
    if spread > max_spread:
        warnings.warn(
            f"profile: the {len(totals)} repeated steps took {min(totals) * 1e3:.3f} to {max(totals) * 1e3:.3f} ms "
            f"(spread {spread * 100:.0f} %, more than {max_spread * 100:.0f} %): the machine was busy, so the median "
            "op times may not describe it; profile again on an idle machine or with more repeats",
            ProfileNoiseWarning, stacklevel=3,
        )


def _devices(model: torch.nn.Module) -> list[int]:
    return sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})


def profile_model(
    model: torch.nn.Module,
    batch: Any,
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
    *,
    hardware: str | Hardware | None = None,
    warmup: int = 1,
    repeats: int = 3,
    max_spread: float = MAX_SPREAD,
) -> Workload:
    """Measure ``warmup + repeats`` steps of ``loss_fn(model, batch).backward()``.

    Times are medians over the ``repeats`` steps after warm-up (CUDA events on a GPU, wall
    clock on CPU). With ``hardware`` (a preset name or Hardware) the times are replaced by
    roofline estimates on that hardware; the measured ones stay in ``meta``. The model's
    parameters, gradients, buffers and the RNG streams are restored afterwards. A
    ProfileNoiseWarning says when the slowest repeated step took more than ``1 + max_spread``
    times the fastest.
    """
    if not isinstance(model, torch.nn.Module):
        raise ValidationError(f"profile needs a torch.nn.Module, got {type(model).__name__}")
    model = unwrap_model(model, "profile")
    check_not_capturing("profile")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValidationError(f"warmup must be an integer >= 0, got {warmup!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValidationError(f"repeats must be an integer >= 1, got {repeats!r}")
    if isinstance(max_spread, bool) or not isinstance(max_spread, (int, float)) or not max_spread > 0:
        raise ValidationError(f"max_spread must be a number above 0 (0.5: warn when a repeated step takes 1.5x "
                              f"another), got {max_spread!r}")
    hw = get_hardware(hardware) if isinstance(hardware, str) else hardware
    on_cuda = any(p.device.type == "cuda" for p in model.parameters())
    timer = CudaTimer() if on_cuda else WallTimer()

    grads = {p: p.grad for p in model.parameters()}
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    traces, fwd_runs, bwd_runs = [], [], []
    try:
        with torch.random.fork_rng(devices=_devices(model)):
            start_state = torch.random.get_rng_state()
            cuda_states = [torch.cuda.get_rng_state(d) for d in _devices(model)]
            for run in range(warmup + repeats):
                # Every run draws the same random numbers, so dropout masks (and the saved
                # tensors' structure) are the same in every run.
                torch.random.set_rng_state(start_state)
                for d, s in zip(_devices(model), cuda_states):
                    torch.cuda.set_rng_state(s, d)
                for p in model.parameters():
                    p.grad = None
                trace, fwd, bwd = run_traced(model, batch, loss_fn, timer=timer)
                if on_cuda:
                    torch.cuda.synchronize()
                    fwd = [CudaTimer.resolve(v) for v in fwd]
                    bwd = [CudaTimer.resolve(v) for v in bwd]
                if run >= warmup:
                    traces.append(trace)
                    fwd_runs.append(fwd)
                    bwd_runs.append(bwd)
    finally:
        for p, g in grads.items():
            p.grad = g
        with torch.no_grad():
            for name, b in model.named_buffers():
                b.copy_(buffers[name])

    warn_if_noisy(fwd_runs, bwd_runs, max_spread)
    first = traces[0]
    shape = [op.name for op in first.ops]
    for other in traces[1:]:
        if [op.name for op in other.ops] != shape:
            raise ValidationError(
                "the model ran different ops in two profiled steps: make the forward deterministic "
                "in structure (same ops every step) before profiling"
            )
    meta = {
        "source": "slackswap.profiler",
        "model": type(model).__name__,
        "model_signature": model_signature(model),
        "device": "cuda" if on_cuda else "cpu",
        # planning for another GPU projects the times by the roofline (build.timed_for)
        "device_name": torch.cuda.get_device_name(_devices(model)[0]) if on_cuda else "cpu",
        "times": "measured, median over repeats",
        "warmup": warmup,
        "repeats": repeats,
    }
    trainable = [(call_layer(name), p.numel()) for name, p in model.named_parameters() if p.requires_grad]
    if trainable:
        meta.update(parameter_meta(trainable))
    workload = build_workload(first, median_times(fwd_runs), median_times(bwd_runs),
                              name=workload_name(model), meta=meta)
    if hw is not None:
        workload = project_onto(workload, hw)
    _LAST_PROFILE[model] = workload
    return workload
