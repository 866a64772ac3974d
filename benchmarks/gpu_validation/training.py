"""Timed training steps of one model and batch under different methods (plain, a slackswap plan,
a peer such as torch.utils.checkpoint), with memory figures and gradients compared to plain
training's. A step here is forward, loss and backward (what slackswap simulates); no optimizer
step, so every step starts from the same parameters and their gradients can be compared."""

from __future__ import annotations

import contextlib
import functools
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .device import Device


@dataclass
class Method:
    """``context()`` wraps each step, ``loss()`` runs the forward and returns the scalar loss;
    ``counters()`` reads cumulative counters (bytes copied, late prefetches; reported per timed
    step) and ``gauges()`` figures read once after the timed steps, when the method has them."""

    name: str
    loss: Callable[[], torch.Tensor]
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    counters: Callable[[], dict] | None = None
    gauges: Callable[[], dict] | None = None


@dataclass(frozen=True)
class StepSample:
    device_s: float
    host_s: float
    step_peak_bytes: int | None
    max_allocated_bytes: int | None
    max_reserved_bytes: int | None
    loss: float


@dataclass
class Gradients:
    tensors: list[torch.Tensor]
    loss: float


@dataclass
class Measured:
    samples: list[StepSample]
    counters_per_step: dict = field(default_factory=dict)
    gauges: dict = field(default_factory=dict)
    grad_max_abs_diff: float | None = None
    loss_abs_diff: float | None = None
    grads_bit_identical_deterministic: bool | None = None
    deterministic_max_abs_diff: float | None = None

    def _max(self, key):
        values = [getattr(s, key) for s in self.samples]
        return None if any(v is None for v in values) else max(values)

    def to_dict(self) -> dict:
        step_s = statistics.median(s.device_s for s in self.samples)
        host_s = statistics.median(s.host_s for s in self.samples)
        return {
            "steps": len(self.samples),
            "step_time_s": step_s,
            "step_time_min_s": min(s.device_s for s in self.samples),
            "host_time_s": host_s,
            "host_per_device": host_s / step_s,
            "step_peak_bytes": self._max("step_peak_bytes"),
            "max_allocated_bytes": self._max("max_allocated_bytes"),
            "max_reserved_bytes": self._max("max_reserved_bytes"),
            "loss": self.samples[-1].loss,
            **self.counters_per_step,
            **self.gauges,
            "grad_max_abs_diff": self.grad_max_abs_diff,
            "loss_abs_diff": self.loss_abs_diff,
            "grads_bit_identical_deterministic": self.grads_bit_identical_deterministic,
            "deterministic_grad_max_abs_diff": self.deterministic_max_abs_diff,
        }


@contextlib.contextmanager
def deterministic_algorithms():
    """torch.use_deterministic_algorithms for the block (warn_only: an op without a deterministic
    kernel warns instead of failing the run); CUBLAS_WORKSPACE_CONFIG is set before CUDA starts."""
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def compare(reference: Gradients, current: Gradients) -> tuple[float, bool]:
    """(max abs difference over every gradient element, bit-identical). The reference may live on
    the host: each tensor is brought to the current one's device for the comparison."""
    worst, same = 0.0, True
    for a, b in zip(reference.tensors, current.tensors, strict=True):
        a = a.to(b.device)
        same = same and torch.equal(a, b)
        worst = max(worst, (a.float() - b.float()).abs().max().item() if a.numel() else 0.0)
    return worst, same


class Trainer:
    def __init__(self, device: Device, model: nn.Module, seed: int = 0) -> None:
        self.device = device
        self.model = model
        self.seed = seed
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.reference: Gradients | None = None
        self.reference_deterministic: Gradients | None = None

    def step(self, method: Method) -> StepSample:
        dev = self.device
        self.model.zero_grad(set_to_none=False)
        torch.manual_seed(self.seed)  # the same dropout masks in every step and method
        dev.synchronize()
        base = dev.allocated_bytes()
        dev.reset_peak()
        host_start = time.perf_counter()
        start = dev.mark()
        with method.context():
            loss = method.loss()
            loss.backward()
        end = dev.mark()
        host_s = time.perf_counter() - host_start
        device_s = dev.elapsed_s(start, end)
        peak = dev.max_allocated_bytes()
        return StepSample(device_s, host_s, None if peak is None else peak - base, peak, dev.max_reserved_bytes(),
                          loss.detach().float().item())

    def gradients(self, loss: float) -> Gradients:
        return Gradients([p.grad.detach().clone() for p in self.params], loss)

    def measure(self, method: Method, *, warmup: int, steps: int, is_reference: bool = False) -> Measured:
        self.device.release_cached()
        for _ in range(warmup):
            self.step(method)
        before = method.counters() if method.counters else {}
        samples = [self.step(method) for _ in range(steps)]
        after = method.counters() if method.counters else {}
        result = Measured(samples, {k: (after[k] - before[k]) / steps for k in after},
                          method.gauges() if method.gauges else {})
        current = self.gradients(samples[-1].loss)
        with deterministic_algorithms():
            det = self.gradients(self.step(method).loss)
        if is_reference:
            # Kept on the host, so later configurations' device memory figures do not include them.
            self.reference, self.reference_deterministic = (
                Gradients([t.cpu() for t in g.tensors], g.loss) for g in (current, det))
        if self.reference is not None:
            result.grad_max_abs_diff, _ = compare(self.reference, current)
            result.loss_abs_diff = abs(current.loss - self.reference.loss)
            result.deterministic_max_abs_diff, result.grads_bit_identical_deterministic = compare(
                self.reference_deterministic, det)
        return result


@contextlib.contextmanager
def checkpoint_per_block(model: nn.Module):
    """torch.utils.checkpoint (non-reentrant) around every block of the model's first ModuleList."""
    blocks = next(m for m in model.modules() if isinstance(m, nn.ModuleList))
    for block in blocks:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
    try:
        yield
    finally:
        for block in blocks:
            del block.forward  # back to the class's forward


def peer_methods(device: Device, model: nn.Module, loss: Callable[[], torch.Tensor]) -> list[Method]:
    return [
        Method("torch.utils.checkpoint per block", loss, lambda: checkpoint_per_block(model)),
        Method(f"save_on_cpu(pin_memory={device.pinned_host})", loss,
               lambda: torch.autograd.graph.save_on_cpu(pin_memory=device.pinned_host)),
    ]


def runtime_method(name: str, runtime, loss: Callable[[], torch.Tensor]) -> Method:
    """A slackswap runtime (slackswap.apply) as a Method, with its swap manager's statistics."""
    def counters() -> dict:
        s = runtime.stats
        return {"d2h_bytes": s.d2h_bytes, "h2d_bytes": s.h2d_bytes, "late_prefetches": s.late_prefetches,
                "prefetch_waits": s.prefetch_waits, "recompute_ops": s.recompute_ops}

    def gauges() -> dict:
        return {"manager_peak_saved_bytes": runtime.stats.peak_device_saved_bytes}
    return Method(name, loss, lambda: runtime, counters, gauges)
