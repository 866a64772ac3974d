"""The checkpoint backend: recompute through non-reentrant torch.utils.checkpoint with a
selective-checkpoint policy per aten op (RNG state preserved), swap through the replay
backend's SwapManager hooks around the checkpointed calls. See checkpoint_map.py for what it
runs and docs/runtime.md ("Backends") for when to use it.

* Each region (a module call, checkpoint_map.Region) gets its module's ``forward`` wrapped for
  the step: its k-th call of the step, when it is a region, runs as ``checkpoint(forward,
  use_reentrant=False, preserve_rng_state=True, context_fn=SAC contexts)``. Our
  saved_tensors_hooks stay ambient, never in ``context_fn`` (hooks there would be innermost and
  disable recompute): checkpoint saves the call's tensor arguments through them (kept or
  swapped), and everything saved inside the call goes to checkpoint.
* The forward recorder of the replay backend checks every op against the profile and runs the
  backward-step clock (autograd-node pre-hooks) that issues copies back on the plan's schedule;
  it records no recipes here. The ops checkpoint itself runs before the call (saving its
  inputs) are not model ops: the recorder is suspended for them.
* The manager counts what checkpoint holds as well: SAC's cached saved tensors from the call's
  forward until their last backward reader, and a region's rebuilt tensors from its trigger step
  (the first unpack) until their last reader.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from ..errors import CheckpointBackendError, PlanMismatchError
from ..hardware import DEFAULT_HARDWARE, get_hardware
from ..plans import Plan
from ..profile_trace import ModuleCall
from ..profiler.tracer import IGNORED_OPS
from ..schedule import backward_step_of
from ..workload import Workload
from .base import RuntimeBase
from .checkpoint_map import CheckpointMap, Region, build_checkpoint_map
from .paths import RECORDED_CHECKPOINT_PATH
from .replay import ForwardRecorder, RecordingMode
from .swap import SwapManager


class _SuspendableRecording(RecordingMode):
    """The replay recorder's dispatch mode, passing through ops while ``suspended``."""

    def __init__(self, recorder: ForwardRecorder) -> None:
        super().__init__(recorder)
        self.suspended = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.suspended > 0:
            return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)


class _RegionPolicy:
    """SAC policy of one region call: MUST_SAVE or PREFER_RECOMPUTE per aten op, by position."""

    def __init__(self, region: Region) -> None:
        self.region = region
        self.i = 0

    def __call__(self, ctx, func, *args, **kwargs) -> CheckpointPolicy:
        if func in IGNORED_OPS:  # the profile does not count them: recomputing costs nothing
            return CheckpointPolicy.PREFER_RECOMPUTE
        r = self.region
        aten = getattr(func, "overloadpacket", func).__name__
        if self.i >= len(r.recompute) or aten != r.aten[self.i]:
            raise PlanMismatchError(
                f"module call {r.call!r} ran {aten} as its op #{self.i}, the profile has "
                f"{r.aten[self.i] if self.i < len(r.aten) else 'no more ops'}: the model changed; profile again"
            )
        recompute = r.recompute[self.i]
        self.i += 1
        return CheckpointPolicy.PREFER_RECOMPUTE if recompute else CheckpointPolicy.MUST_SAVE


class CheckpointSwapManager(SwapManager):
    """SwapManager that also counts what checkpoint holds (it runs no groups itself)."""

    def __init__(self, workload: Workload, cmap: CheckpointMap, device: torch.device) -> None:
        super().__init__(workload, cmap.manager_plan, cmap.execution, device)
        self.cmap = cmap
        packed = {e.name for e in cmap.execution.pack_sequence}
        self.region_cached = {r.call: tuple(t for t in r.cached if t not in packed) for r in cmap.regions}
        self.triggers = {backward_step_of(self.n, r.trigger): r for r in cmap.regions}

    def _begin(self) -> None:
        super()._begin()
        self.region_held: dict[str, int] = {}
        """Saved tensors checkpoint holds now -> backward step after which they are released."""

    def begin_step(self) -> None:
        for name in self.region_held:
            self.stats.device_saved_bytes -= self.size[name]
        self.region_held = {}
        super().begin_step()

    def abandon_step(self) -> None:
        for name in self.region_held:
            self.stats.device_saved_bytes -= self.size[name]
        self.region_held = {}
        super().abandon_step()

    def region_forward_done(self, call: str) -> None:
        for name in self.region_cached.get(call, ()):
            if name not in self.region_held:
                self.region_held[name] = backward_step_of(self.n, self.last_reader[name])
                self._add(self.size[name])

    def begin_backward_step(self, step: int) -> None:
        self.track_backward_pass()
        while self.clock < step:
            k = self.clock + 1
            for name in [t for t, last in self.region_held.items() if last < k]:
                del self.region_held[name]
                self.stats.device_saved_bytes -= self.size[name]
            region = self.triggers.get(k)
            if region is not None:
                self.group_steps.append(k)
                for name in region.rebuilt:
                    if name not in self.region_held:
                        self.region_held[name] = backward_step_of(self.n, self.last_reader[name])
                        self._add(self.size[name])
                self.stats.recompute_ops += len(region.rerun)
                self.stats.step_recompute_ops += len(region.rerun)
            super().begin_backward_step(k)


def wrap_regions(model: torch.nn.Module, regions, wrap) -> list:
    """Replace, for the step, the forward of each module with a region by ``wrap(forward, path,
    {k: region of its k-th call})``; returns what unwrap_regions needs to undo it."""
    by_path: dict[str, dict[int, Region]] = {}
    for region in regions:
        call = ModuleCall.parse(region.call)
        by_path.setdefault(call.path, {})[call.count] = region
    wrapped = []
    for path, by_count in by_path.items():
        module = model.get_submodule(path) if path else model
        wrapped.append((module, "forward" in module.__dict__, module.__dict__.get("forward")))
        module.forward = wrap(module.forward, path, by_count)
    return wrapped


def unwrap_regions(wrapped: list) -> None:
    for module, had, previous in wrapped:
        if had:
            module.forward = previous
        else:
            del module.forward


class RegionWrapping:
    """Installs ``self._wrap`` around the module calls of ``self.checkpoint_map.regions`` for the
    runtime's lifetime and counts calls per step; shared by the checkpoint backend and the
    checkpoint fast path."""

    def _install(self) -> None:
        self._calls.clear()
        self._wrapped = wrap_regions(self.model, self.checkpoint_map.regions, self._wrap)

    def _uninstall(self) -> None:
        unwrap_regions(self._wrapped)
        self._wrapped = []

    def _on_step(self) -> None:
        self._calls.clear()


class CheckpointRuntime(RegionWrapping, RuntimeBase):
    """Context manager returned by ``apply_plan(..., backend="checkpoint")``; same surface as PlanRuntime."""

    path = RECORDED_CHECKPOINT_PATH
    path_reason = 'backend="checkpoint"'

    def __init__(self, model: torch.nn.Module, plan: Plan, workload: Workload, hardware=None) -> None:
        hw = get_hardware(hardware if hardware is not None else DEFAULT_HARDWARE)
        self.checkpoint_map = build_checkpoint_map(workload, plan, hw)
        if not self.checkpoint_map.faithful:
            raise CheckpointBackendError(self.checkpoint_map.refusal())
        cmap = self.checkpoint_map
        super().__init__(model, plan, workload, cmap.execution,
                         lambda device: CheckpointSwapManager(workload, cmap, device))
        self._calls: dict[str, int] = {}
        self._wrapped: list = []

    @property
    def simulated_plan(self) -> Plan:
        return self.checkpoint_map.simulated_plan

    def _recording_mode(self) -> RecordingMode:
        return _SuspendableRecording(self.recorder)

    def _wrap(self, forward, path: str, regions: dict[int, Region]):
        calls, recorder, mode, manager = self._calls, self.recorder, self._mode, self.manager

        def inner(*args, **kwargs):
            # checkpoint's own ops (saving the inputs, RNG state) ran with the recorder suspended.
            mode.suspended -= 1
            try:
                return forward(*args, **kwargs)
            finally:
                mode.suspended += 1

        def run(*args, **kwargs):
            # Only forward calls of the step count; checkpoint's recompute calls ``inner`` itself,
            # and a call made while another region recomputes is not a new call.
            if not torch.is_grad_enabled() or recorder.i >= recorder.n:
                return forward(*args, **kwargs)
            k = calls.get(path, 0)
            calls[path] = k + 1
            region = regions.get(k)
            if region is None:
                return forward(*args, **kwargs)
            policy = _RegionPolicy(region)
            mode.suspended += 1
            try:
                out = checkpoint(inner, *args, use_reentrant=False, preserve_rng_state=True,
                                 context_fn=lambda: create_selective_checkpoint_contexts(policy), **kwargs)
            finally:
                mode.suspended -= 1
            manager.region_forward_done(region.call)
            return out

        return run
