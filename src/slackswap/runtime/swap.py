"""The swap manager: saved_tensors_hooks that keep or swap every tensor saved outside a
checkpoint region, on the plan's schedule.

* Identity: tensors reach the pack hook in the order the ExecutionMap predicts from the
  profile; each pack is matched to the next expected entry and its storage size is checked,
  so a model or batch that changed is a PlanMismatchError, not a wrong gradient.
* A storage is copied once however many views of it are saved.
* Swapped storages go to slots of one host buffer (pinned on CUDA), allocated on the first
  step, sized from the profile and reused every step.
* On CUDA: copies out run on a device-to-host stream after an event on the compute stream
  (the tensor is ready); the device tensor is held until the copy's event completes. Copies
  back run on a host-to-device stream, after the slot's copy out; compute waits on the copy
  back's event before reading; the next step's copy out into a slot waits for the previous
  copy back from it. On CPU the same code runs with plain host-to-host copies.
* Prefetch: each backward read of a tensor the manager holds marks a backward step (step k
  is the backward of op n-1-k); on every new step the manager issues the copies back of all
  swapped tensors whose ``prefetch_step`` has come, in the simulator's order. A tensor read
  before its copy back was issued is fetched at once and counted in ``late_prefetches``.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch

from ..errors import PlanMismatchError
from ..plans import Action, Plan
from ..schedule import first_use_step
from ..workload import Workload
from .mapping import ExecutionMap

_ALIGN = 64  # slot alignment in the host buffer (bytes)


@dataclass
class RuntimeStats:
    steps: int = 0
    d2h_bytes: int = 0
    h2d_bytes: int = 0
    step_d2h_bytes: int = 0
    step_h2d_bytes: int = 0
    device_saved_bytes: int = 0
    """Saved bytes the manager holds on the device now (kept, swapping out, fetched back, SAC-cached)."""
    peak_device_saved_bytes: int = 0
    step_peak_device_saved_bytes: int = 0
    late_prefetches: int = 0
    host_pool_bytes: int = 0
    host_pool_allocations: int = 0
    packs: int = 0


@dataclass
class _State:
    name: str
    action: Action
    size: int
    handles: int = 0
    device: torch.Tensor | None = None  # KEEP: the saved tensor; SWAP: source bytes during copy out
    d2h_event: object = None
    restored: torch.Tensor | None = None  # SWAP: device bytes after copy back
    h2d_event: object = None
    counted: int = 0  # bytes this state adds to device_saved_bytes


class _Handle:
    __slots__ = ("state", "tensor", "offset", "shape", "stride", "dtype", "clock_op", "region", "__weakref__")


class SwapManager:
    def __init__(self, workload: Workload, plan: Plan, emap: ExecutionMap, device: torch.device) -> None:
        self.workload = workload
        self.plan = plan
        self.emap = emap
        self.device = device
        self.cuda = device.type == "cuda"
        self.n = len(workload.ops)
        self.size = {t.name: t.size_bytes for t in workload.tensors}
        self.expected = emap.pack_sequence
        self.stats = RuntimeStats()
        swapped: list[str] = []
        for e in self.expected:
            if e.action is Action.SWAP and e.name not in swapped:
                swapped.append(e.name)
        self.slots: dict[str, tuple[int, int]] = {}
        offset = 0
        for name in swapped:
            self.slots[name] = (offset, self.size[name])
            offset += -(-self.size[name] // _ALIGN) * _ALIGN
        self.pool_bytes = offset
        self.pool: torch.Tensor | None = None
        self.slot_h2d_event: dict[str, object] = {}
        production = {t.name: i for i, t in enumerate(workload.saved_tensors)}
        self.h2d_order = sorted(swapped, key=lambda s: (plan.prefetch_step.get(s, 0), first_use_step(workload, s),
                                                        production.get(s, 0)))
        self.rebuilt_release: list[tuple[int, str]] = []
        if self.cuda:
            self.d2h_stream = torch.cuda.Stream(device)
            self.h2d_stream = torch.cuda.Stream(device)
        self.param_keys: set[tuple] = set()
        self._begin()

    # ---- step boundaries ------------------------------------------------------------------
    def _begin(self) -> None:
        self.pos = 0
        self.states: dict[str, _State] = {}
        self.issued: set[str] = set()
        self.h2d_next = 0
        self.clock = -1
        self.pending_d2h: list[_State] = []
        self.region_bytes: dict[str, int] = {}
        self.region_handles: dict[str, int] = {}
        self.rebuilt_release = []

    def begin_step(self) -> None:
        """Called when the model's forward starts: a new step."""
        if self.cuda:
            self._poll(wait=True)
        self.stats.steps += 1
        self.stats.step_d2h_bytes = 0
        self.stats.step_h2d_bytes = 0
        # Tensors of an earlier step still counted (a region without tensor arguments, or a
        # backward that never ran) are gone once their graph is: stop counting them.
        self.stats.device_saved_bytes -= sum(self.size[n] for _, n in self.rebuilt_release)
        self.stats.device_saved_bytes -= sum(self.region_bytes.values())
        self.stats.step_peak_device_saved_bytes = self.stats.device_saved_bytes
        self._begin()

    # ---- accounting -------------------------------------------------------------------------
    def _add(self, nbytes: int) -> None:
        s = self.stats
        s.device_saved_bytes += nbytes
        s.peak_device_saved_bytes = max(s.peak_device_saved_bytes, s.device_saved_bytes)
        s.step_peak_device_saved_bytes = max(s.step_peak_device_saved_bytes, s.device_saved_bytes)

    def _count(self, state: _State, nbytes: int) -> None:
        state.counted += nbytes
        self._add(nbytes)

    def _uncount(self, state: _State) -> None:
        self.stats.device_saved_bytes -= state.counted
        state.counted = 0

    def region_forward(self, call: str) -> None:
        """SAC caches the region's MUST_SAVE outputs on the device during its forward."""
        region = self.emap.region_of(call)
        cached = sum(self.size[n] for n in region.cached)
        self.region_bytes[call] = self.region_bytes.get(call, 0) + cached
        self._add(cached)

    def _region_recompute(self, call: str) -> None:
        """The region recomputes (its arguments are being read): its cached tensors and the
        rebuilt ones are on the device until the backward step of their last reader."""
        region = self.emap.region_of(call)
        self.stats.device_saved_bytes -= self.region_bytes.pop(call, 0)
        for name in region.cached + region.rebuilt:
            if name not in self.workload.last_bwd_reader:
                continue  # an unsaved tensor SAC cached is used by the recompute and dropped
            self._add(self.size[name])
            self.rebuilt_release.append((self.n - 1 - self.workload.last_bwd_reader[name], name))

    def _region_done(self, call: str) -> None:
        """Checkpoint dropped the region's arguments: its frame, and every tensor it rebuilt, is gone."""
        region = self.emap.region_of(call)
        mine = set(region.cached + region.rebuilt)
        keep = []
        for last_step, name in self.rebuilt_release:
            if name in mine:
                self.stats.device_saved_bytes -= self.size[name]
            else:
                keep.append((last_step, name))
        self.rebuilt_release = keep

    # ---- hooks ---------------------------------------------------------------------------
    def pack(self, t: torch.Tensor):
        storage = t.untyped_storage()
        if storage.nbytes() == 0 or (t.device.type, t.device.index, storage.data_ptr()) in self.param_keys:
            return t.detach()
        if self.pos >= len(self.expected):
            raise PlanMismatchError(
                f"the model saved more tensors for backward than the profiled one ({len(self.expected)}): "
                "the model or its inputs changed since profiling; profile again and make a new plan"
            )
        entry = self.expected[self.pos]
        self.pos += 1
        self.stats.packs += 1
        if storage.nbytes() != self.size[entry.name]:
            raise PlanMismatchError(
                f"saved tensor #{self.pos - 1} ({entry.name!r}) has {storage.nbytes()} bytes, the profile "
                f"has {self.size[entry.name]}: the model or batch shape changed since profiling; profile again"
            )
        state = self.states.get(entry.name)
        if state is None:
            state = _State(entry.name, entry.action, self.size[entry.name])
            self.states[entry.name] = state
            if entry.action is Action.SWAP:
                self._copy_out(state, t)
            else:
                self._count(state, state.size)
        h = _Handle()
        h.state, h.clock_op, h.region = state, entry.clock_op, entry.region
        h.offset, h.shape, h.stride, h.dtype = t.storage_offset(), tuple(t.shape), t.stride(), t.dtype
        h.tensor = t.detach() if entry.action is Action.KEEP else None
        state.handles += 1
        if entry.region is not None:
            self.region_handles[entry.region] = self.region_handles.get(entry.region, 0) + 1
        weakref.finalize(h, SwapManager._release, weakref.ref(self), state, entry.region)
        if self.cuda:
            self._poll(wait=False)
        return h

    def unpack(self, h):
        if isinstance(h, torch.Tensor):
            return h
        self._tick(h.clock_op)
        if h.region is not None and h.region in self.region_bytes:
            self._region_recompute(h.region)
        state = h.state
        if state.action is Action.KEEP:
            return h.tensor
        if state.name not in self.issued:
            self.stats.late_prefetches += 1
            self._copy_in(state)
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_event(state.h2d_event)
        with torch.no_grad():
            out = torch.empty(0, dtype=h.dtype, device=self.device)
            out.set_(state.restored.untyped_storage(), h.offset, h.shape, h.stride)
        return out

    @staticmethod
    def _release(manager_ref, state: _State, region: str | None) -> None:
        manager = manager_ref()
        if manager is None:
            return
        if region is not None and manager.states.get(state.name) is state:
            manager.region_handles[region] -= 1
            if manager.region_handles[region] == 0:
                manager._region_done(region)
        state.handles -= 1
        if state.handles == 0:
            manager._uncount(state)
            state.device = None
            state.restored = None

    # ---- copies ------------------------------------------------------------------------
    def _pool(self) -> torch.Tensor:
        if self.pool is None:
            self.pool = torch.empty(self.pool_bytes, dtype=torch.uint8, pin_memory=self.cuda)
            self.stats.host_pool_bytes = self.pool_bytes
            self.stats.host_pool_allocations += 1
        return self.pool

    def _slot(self, name: str) -> torch.Tensor:
        offset, size = self.slots[name]
        return self._pool()[offset:offset + size]

    def _copy_out(self, state: _State, t: torch.Tensor) -> None:
        with torch.no_grad():
            src = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())
        dst = self._slot(state.name)
        self._count(state, state.size)
        if self.cuda:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.d2h_stream):
                self.d2h_stream.wait_event(ready)
                previous_read = self.slot_h2d_event.get(state.name)
                if previous_read is not None:
                    self.d2h_stream.wait_event(previous_read)
                dst.copy_(src, non_blocking=True)
                state.d2h_event = torch.cuda.Event()
                state.d2h_event.record(self.d2h_stream)
            state.device = src  # held until the copy out completes
            self.pending_d2h.append(state)
        else:
            dst.copy_(src)
            self._uncount(state)
        self.stats.d2h_bytes += state.size
        self.stats.step_d2h_bytes += state.size

    def _poll(self, *, wait: bool) -> None:
        still = []
        for state in self.pending_d2h:
            if wait:
                state.d2h_event.synchronize()
            if state.d2h_event.query():
                state.device = None
                if state.restored is None:
                    self._uncount(state)
            else:
                still.append(state)
        self.pending_d2h = still

    def _copy_in(self, state: _State) -> None:
        self.issued.add(state.name)
        src = self._slot(state.name)
        if self.cuda:
            if state.device is not None:
                self._poll(wait=False)
            dst = torch.empty(state.size, dtype=torch.uint8, device=self.device)
            allocated = torch.cuda.Event()
            allocated.record(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.h2d_stream):
                self.h2d_stream.wait_event(allocated)
                self.h2d_stream.wait_event(state.d2h_event)
                dst.copy_(src, non_blocking=True)
                state.h2d_event = torch.cuda.Event()
                state.h2d_event.record(self.h2d_stream)
            dst.record_stream(self.h2d_stream)
            self.slot_h2d_event[state.name] = state.h2d_event
        else:
            dst = src.clone()
        state.restored = dst
        self._uncount(state)  # a swap-out still in flight stops counting once the copy back owns the bytes
        self._count(state, state.size)
        self.stats.h2d_bytes += state.size
        self.stats.step_h2d_bytes += state.size

    def _tick(self, op_index: int) -> None:
        step = self.n - 1 - op_index
        if step <= self.clock:
            return
        self.clock = step
        if self.rebuilt_release:
            keep = []
            for last_step, name in self.rebuilt_release:
                if last_step < step:
                    self.stats.device_saved_bytes -= self.size[name]
                else:
                    keep.append((last_step, name))
            self.rebuilt_release = keep
        while self.h2d_next < len(self.h2d_order):
            name = self.h2d_order[self.h2d_next]
            if self.plan.prefetch_step.get(name, 0) > step:
                break
            self.h2d_next += 1
            state = self.states.get(name)
            if state is not None and name not in self.issued:
                self._copy_in(state)
