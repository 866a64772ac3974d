"""The swap manager: saved_tensors_hooks that keep, swap or recompute every saved tensor as the
plan says, on the plan's schedule.

* Identity: tensors reach the pack hook in the order the profile recorded; each pack is matched
  to the next expected entry and its storage size is checked, so a model or batch that changed
  is a PlanMismatchError, not a wrong gradient. A storage is handled once however many views
  of it are saved.
* keep: the manager holds the tensor until autograd releases its last saved reference.
* swap: copied to a slot of one host buffer (pinned on CUDA), allocated on the first step,
  sized from the profile and reused every step. On CUDA, copies out run on a device-to-host
  stream after an event on the compute stream and the device tensor is held until the copy's
  event completes; copies back run on a host-to-device stream after the slot's copy out, and
  compute waits on the copy back's event before reading. The next step's copy out into a slot
  waits for the previous copy back from it. On CPU the same code runs with host-to-host copies.
* recompute: nothing is held. At the start of the backward step that the plan gives a
  recompute group, the group's ops are re-run from the forward recipes (replay.py), with no
  graph and with each random op's RNG state; the rebuilt tensors the plan keeps stay until
  their last reader is done, the rest are dropped when the group ends (docs/simulator.md).
* The clock: backward step k starts at the pre-hook of op n-1-k's autograd node (or, for nodes
  the recorder could not hook, at the first unpack of that step). At each step the manager runs
  the step's recompute group, then issues, in the plan's schedule order (``plan.schedule``, the
  simulator's order), the copies back whose start step has come, as long as they fit the plan's
  budget by the manager's count (a copy that does not fit waits for a later step, as the
  simulator's copy waits for memory).
  A tensor read before its copy back was issued is fetched at once: ``late_prefetches``.
* Failures (docs/runtime.md, Failures): when the host pool cannot be allocated, the tensors
  the plan swaps are kept on the device from then on (one RuntimeFallbackWarning, counted in the
  stats); a device out-of-memory in a copy back or a recompute is a RuntimeMemoryError naming
  the tensor and the bytes; ``abandon_step`` (called when the runtime's context exits with an
  exception) waits for copies in flight, forgets the step and releases the pool, and saved
  tensors of an abandoned step are refused at unpack rather than read from reused memory.
"""

from __future__ import annotations

import warnings
import weakref
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..errors import PlanMismatchError, RuntimeFallbackWarning, RuntimeMemoryError, RuntimeUsageError, StaleStepError
from ..memory.host import HOST_SLOT_ALIGN_BYTES
from ..plans import Action, Plan
from ..profiler.fsdp import FsdpUnits
from ..profiler.shape_only import stand_in
from ..profiler.tracer import storage_key
from ..schedule import backward_step_of, op_of_backward_step
from ..workload import Workload
from .mapping import ExecutionMap
from .replay import ShapeRef, TensorRef, output_sources, rng_state, set_rng_state

_ALIGN = HOST_SLOT_ALIGN_BYTES  # slot alignment in the host buffer (bytes); plans count the same


@dataclass
class RuntimeStats:
    steps: int = 0
    d2h_bytes: int = 0
    h2d_bytes: int = 0
    step_d2h_bytes: int = 0
    step_h2d_bytes: int = 0
    recompute_ops: int = 0
    step_recompute_ops: int = 0
    device_saved_bytes: int = 0
    """Saved bytes the manager holds on the device now (kept, swapping out, fetched back, rebuilt)."""
    peak_device_saved_bytes: int = 0
    step_peak_device_saved_bytes: int = 0
    late_prefetches: int = 0
    """Copies back issued only when the tensor was read (never, when the clock works)."""
    prefetch_waits: int = 0
    """Copies back issued after their planned step because the budget had no room at it."""
    host_pool_bytes: int = 0
    """Size of the host pool allocated now (0 before the first swap, after a failed allocation or a release)."""
    host_pool_allocations: int = 0
    host_pool_failures: int = 0
    """Host pool allocations that failed (at most 1: after it, this manager keeps the tensors the plan swaps)."""
    host_pool_releases: int = 0
    """Pools released because a step was abandoned (an exception left the runtime's context)."""
    fallback_kept_bytes: int = 0
    """Bytes the plan swaps that were kept on the device instead because the host pool was missing."""
    step_fallback_kept_bytes: int = 0
    fallback_kept_tensors: int = 0
    packs: int = 0
    fsdp_regathers: int = 0
    """FSDP2 units gathered by the runtime: a recompute group read their parameters in backward
    before FSDP gathered them for their own backward."""
    recorded_ops: int = 0
    """Forward ops the replay path's recorder (a dispatch mode) saw; 0 on the fast paths, which run none."""
    checkpointed_calls: int = 0
    """Module calls the checkpoint path ran under torch.utils.checkpoint."""
    region_recomputes: int = 0
    """Times the checkpoint path's checkpointed calls were re-run in backward."""


@dataclass
class _State:
    name: str
    action: Action
    size: int
    handles: int = 0
    storage: object = None  # KEEP: the saved storage; SWAP: device bytes during copy out
    d2h_event: object = None
    restored: torch.Tensor | None = None  # SWAP: device bytes after copy back
    h2d_event: object = None
    counted: int = 0  # bytes this state adds to device_saved_bytes


class _Handle:
    __slots__ = ("state", "tensor", "offset", "shape", "stride", "dtype", "reader", "__weakref__")


class SwapManager:
    def __init__(self, workload: Workload, plan: Plan, emap: ExecutionMap, device: torch.device) -> None:
        self.workload = workload
        self.plan = plan
        self.emap = emap
        self.device = device
        self.cuda = device.type == "cuda"
        self.n = len(workload.ops)
        self.size = {t.name: t.size_bytes for t in workload.tensors}
        self.saved = {t.name for t in workload.saved_tensors}
        self.last_reader = workload.last_bwd_reader
        self.expected = emap.pack_sequence
        self.budget = plan.budget_bytes
        self.stats = RuntimeStats()
        self.groups = {op_of_backward_step(self.n, g.step): tuple(workload.op_index[op] for op in g.ops)
                       for g in plan.schedule.recompute_groups}
        self.sources = {i: output_sources(workload.ops[i].outputs) for i in emap.group_ops}
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
        self.pool_error: str | None = None
        """Why the host pool could not be allocated; set once, after which swaps are kept."""
        self.slot_h2d_event: dict[str, object] = {}
        # Each copy back is issued at the step the simulation starts it, in the simulator's order.
        self.h2d_order = [c.tensor for c in plan.schedule.copy_backs]
        self.issue_step = {c.tensor: c.start_step for c in plan.schedule.copy_backs}
        if self.cuda:
            self.d2h_stream = torch.cuda.Stream(device)
            self.h2d_stream = torch.cuda.Stream(device)
        self.param_keys: set[tuple] = set()
        self.fsdp = FsdpUnits()  # the runtime sets the model's fully_shard units
        self.busy = False  # the manager's own ops are not forward ops of the model
        self.recipes: dict[int, object] = {}
        self._begin()

    # ---- step boundaries ------------------------------------------------------------------
    def _begin(self) -> None:
        self.generation = getattr(self, "generation", 0) + 1  # clock hooks of older steps' graphs ignore this one
        self.pos = 0
        self.states: dict[str, _State] = {}
        self.issued: set[str] = set()
        self.h2d_next = 0
        self.clock = -1
        self.pending_d2h: list[_State] = []
        self.rebuilt: dict[str, object] = {}
        self.recipes = {}
        # This step's schedule as run, for checks against the plan: the backward step at which
        # each copy back was issued, and the steps whose recompute group ran.
        self.copy_in_steps: dict[str, int] = {}
        self.group_steps: list[int] = []
        self.waiting: set[str] = set()
        self.pass_end_queued = False
        self.pass_done = False

    def begin_step(self) -> None:
        """Called when the model's forward starts: a new step."""
        if self.cuda:
            self._poll(wait=True)
        self.stats.steps += 1
        self.stats.step_d2h_bytes = 0
        self.stats.step_h2d_bytes = 0
        self.stats.step_recompute_ops = 0
        self.stats.step_fallback_kept_bytes = 0
        # What an earlier step still counts (a backward that never ran) is gone with its graph.
        for name in list(self.rebuilt):
            self._drop_rebuilt(name)
        for state in self.states.values():
            self._uncount(state)
        self.stats.step_peak_device_saved_bytes = self.stats.device_saved_bytes
        self._begin()

    def holds_saved_tensors(self) -> bool:
        """Whether a graph still holds a saved tensor of this step (a handle the pack hook gave)."""
        return any(state.handles > 0 for state in self.states.values())

    def abandon_step(self) -> None:
        """Forget the running step after an exception: wait for the copies in flight, stop counting
        what the step holds, release the host pool (the next step allocates it again). Handles of
        the abandoned step left in a graph are refused at unpack (StaleStepError)."""
        if self.cuda:
            for state in self.states.values():
                for event in (state.d2h_event, state.h2d_event):
                    if event is not None:
                        event.synchronize()
        for name in list(self.rebuilt):
            self._drop_rebuilt(name)
        for state in self.states.values():
            self._uncount(state)
            state.storage = None
            state.restored = None
        self._begin()
        self.slot_h2d_event = {}
        if self.pool is not None:
            self.pool = None
            self.stats.host_pool_bytes = 0
            self.stats.host_pool_releases += 1

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

    def _present(self, name: str) -> bool:
        state = self.states.get(name)
        return name in self.rebuilt or (state is not None and state.counted > 0)

    def _drop_rebuilt(self, name: str) -> None:
        if self.rebuilt.pop(name, None) is not None:
            self.stats.device_saved_bytes -= self.size[name]

    # ---- hooks ---------------------------------------------------------------------------
    def pack(self, t: torch.Tensor):
        storage = t.untyped_storage()
        if storage.nbytes() == 0 or storage_key(t) in self.param_keys or self.fsdp.is_gathered(t):
            return t.detach()
        if torch._C._current_autograd_node() is not None:
            raise RuntimeUsageError(
                "a backward pass saved tensors under slackswap.apply (backward(create_graph=True) or "
                "torch.autograd.grad(..., create_graph=True)): the runtime does not run double backward; compute "
                "higher-order gradients outside the 'with slackswap.apply' block"
            )
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
        self.busy = True
        try:
            state = self.states.get(entry.name)
            if state is None:
                state = _State(entry.name, entry.action, self.size[entry.name])
                self.states[entry.name] = state
                if entry.action is Action.SWAP and self._host_pool() is None:
                    state.action = Action.KEEP  # the fallback: same bytes, never copied (bit-identical)
                    self.stats.fallback_kept_bytes += state.size
                    self.stats.step_fallback_kept_bytes += state.size
                    self.stats.fallback_kept_tensors += 1
                if state.action is Action.SWAP:
                    self._copy_out(state, t)
                elif state.action is Action.KEEP:
                    state.storage = storage
                    self._count(state, state.size)
            h = _Handle()
            h.state, h.reader = state, entry.reader
            h.offset, h.shape, h.stride, h.dtype = t.storage_offset(), tuple(t.shape), t.stride(), t.dtype
            h.tensor = t.detach() if state.action is Action.KEEP else None
            state.handles += 1
            weakref.finalize(h, SwapManager._release, weakref.ref(self), state)
            if self.cuda:
                self._poll(wait=False)
        finally:
            self.busy = False
        return h

    def unpack(self, h):
        if isinstance(h, torch.Tensor):
            return h
        state = h.state
        if state.action is Action.KEEP:
            # Holds its tensor itself, so it is right even in a graph of an abandoned step.
            if self.states.get(state.name) is state:
                self.begin_backward_step(backward_step_of(self.n, h.reader))
            return h.tensor
        if self.states.get(state.name) is not state:
            raise StaleStepError(
                f"slackswap runtime: backward reached saved tensor {state.name!r} ({state.action.value}) of a step "
                "that was abandoned by an exception or replaced by a newer forward: run backward on the graph of "
                "the latest forward only (one model call per step: a loss_fn that calls the model twice is not "
                "supported), and redo the forward after an error"
            )
        self.busy = True
        try:
            self.begin_backward_step(backward_step_of(self.n, h.reader))
            storage = self._storage(state.name, {}, reading=True)
            with torch.no_grad():
                return torch.empty(0, dtype=h.dtype, device=storage.device).set_(storage, h.offset, h.shape, h.stride)
        finally:
            self.busy = False

    @staticmethod
    def _release(manager_ref, state: _State) -> None:
        manager = manager_ref()
        if manager is None or manager.states.get(state.name) is not state:
            return
        state.handles -= 1
        if state.handles == 0:
            manager._uncount(state)
            state.storage = None
            state.restored = None
            manager._drop_rebuilt(state.name)

    # ---- the backward clock ------------------------------------------------------------------
    def track_backward_pass(self) -> None:
        """Restart the clock when a backward pass over a retained graph begins after one ended
        (``backward(retain_graph=True)`` then ``backward()``): the groups rebuild their tensors
        again; kept and fetched-back tensors are still held by the graph's handles. The end of a
        pass is learnt from a callback autograd runs when the pass finishes."""
        if self.pass_done:
            self.pass_done = False
            self.clock = -1
            for name in list(self.rebuilt):
                self._drop_rebuilt(name)
        if not self.pass_end_queued:
            manager, generation = weakref.ref(self), self.generation

            def pass_ended() -> None:
                m = manager()
                if m is not None and m.generation == generation:
                    m.pass_end_queued = False
                    m.pass_done = True

            try:
                torch.autograd.Variable._execution_engine.queue_callback(pass_ended)
                self.pass_end_queued = True
            except RuntimeError:
                pass  # a saved tensor read outside a backward pass (grad_fn._saved_*): no pass to track

    def begin_backward_step(self, step: int) -> None:
        """Backward step ``step`` starts (or has started): catch up every step up to it."""
        self.track_backward_pass()
        if step <= self.clock:
            return
        was_busy, self.busy = self.busy, True
        try:
            while self.clock < step:
                self.clock += 1
                k = self.clock
                for name in [n for n in self.rebuilt if backward_step_of(self.n, self.last_reader[n]) < k]:
                    self._drop_rebuilt(name)  # its last reader is done (the handle may outlive it)
                reader = op_of_backward_step(self.n, k)
                if reader in self.groups:
                    self.group_steps.append(k)
                    self.run_group(reader)
                self._prefetch(k)
        finally:
            self.busy = was_busy

    def _prefetch(self, step: int) -> None:
        while self.h2d_next < len(self.h2d_order):
            name = self.h2d_order[self.h2d_next]
            if self.issue_step[name] > step:
                return
            state = self.states.get(name)
            if state is not None and state.action is Action.SWAP and name not in self.issued:
                if self.budget is not None and self.stats.device_saved_bytes + state.size > self.budget:
                    if name not in self.waiting:
                        self.waiting.add(name)
                        self.stats.prefetch_waits += 1
                    return  # waits for memory, like the simulator's in-order copy stream
                self._fetch(state)
            self.h2d_next += 1

    # ---- recompute ------------------------------------------------------------------------
    def _storage(self, name: str, temps: dict, *, reading: bool = False):
        """The device storage of tensor ``name`` now: made by the running group, rebuilt earlier,
        kept, or swapped (fetched now if its copy back was not issued yet)."""
        if name in temps:
            return temps[name]
        if name in self.rebuilt:
            return self.rebuilt[name]
        state = self.states.get(name)
        if state is not None and state.action is Action.KEEP and state.storage is not None:
            return state.storage
        if state is not None and state.action is Action.SWAP:
            if name not in self.issued:
                if reading:
                    self.stats.late_prefetches += 1
                self._fetch(state)
            if self.cuda:
                torch.cuda.current_stream(self.device).wait_event(state.h2d_event)
            return state.restored.untyped_storage()
        raise RuntimeError(
            f"slackswap runtime: tensor {name!r} is needed at backward step {self.clock} but is not on the "
            "device; the plan's recompute groups and the runtime disagree (please report this)"
        )

    def run_group(self, reader: int) -> None:
        """Re-run the recompute group before op ``reader``'s backward (docs/simulator.md, Recompute)."""
        temps: dict[str, object] = {}
        owned: list[str] = []
        ops = self.workload.ops
        for i in self.groups[reader]:
            recipe = self.recipes.get(i)
            if recipe is None:
                raise RuntimeError(f"slackswap runtime: no forward record of {ops[i].name!r} to recompute it")
            flat = []
            for pos, item in enumerate(recipe.flat):
                if isinstance(item, TensorRef):
                    storage = self._storage(item.name, temps)
                    if pos in recipe.written and item.name not in temps:
                        with self._naming_oom(item.name, f"copying it for the in-place re-run of {ops[i].name!r}"):
                            storage = storage.clone()  # never write into a tensor something else still holds
                    with torch.no_grad():
                        item = torch.empty(0, dtype=item.dtype, device=storage.device).set_(
                            storage, item.offset, item.shape, item.stride)
                elif isinstance(item, ShapeRef):
                    item = stand_in(item.shape, item.stride, item.dtype, item.device)
                elif isinstance(item, torch.Tensor) and self.fsdp.regather(item):  # FSDP freed it after forward
                    self.stats.fsdp_regathers += 1
                flat.append(item)
            args, kwargs = tree_unflatten(flat, recipe.spec)
            made = [name for name, _, _ in self.sources[i]]
            target = next((name for name in made if name in self.saved), made[0] if made else ops[i].name)
            with self._naming_oom(target, f"rebuilding it (re-running {ops[i].name!r})"), torch.no_grad():
                if recipe.rng is None:
                    out = recipe.func(*args, **kwargs)
                else:
                    device, state = recipe.rng
                    current = rng_state(device)
                    set_rng_state(device, state)
                    try:
                        out = recipe.func(*args, **kwargs)
                    finally:
                        set_rng_state(device, current)
            out_tensors = [x for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor)]
            for name, kind, k in self.sources[i]:
                t = flat[recipe.written[k]] if kind == "written" else out_tensors[k]
                temps[name] = t.untyped_storage()
                if name in self.saved and not self._present(name):
                    self._add(self.size[name])
                    owned.append(name)
            self.stats.recompute_ops += 1
            self.stats.step_recompute_ops += 1
        for name in owned:
            if self.plan.actions[name] is Action.RECOMPUTE and self.last_reader[name] <= reader:
                self.rebuilt[name] = temps[name]
            else:
                self.stats.device_saved_bytes -= self.size[name]

    # ---- failures -----------------------------------------------------------------------
    @contextmanager
    def _naming_oom(self, name: str, doing: str):
        """Turn torch's device out-of-memory into a RuntimeMemoryError that names the planned tensor."""
        try:
            yield
        except torch.OutOfMemoryError as exc:
            size = self.size.get(name, 0)
            held = self.stats.device_saved_bytes
            budget = "the plan has no budget" if self.budget is None else f"the plan's budget is {self.budget} bytes"
            raise RuntimeMemoryError(
                f"slackswap runtime: device out of memory at backward step {self.clock} for saved tensor {name!r} "
                f"({size} bytes) while {doing}; the manager holds {held} bytes of saved tensors on the device and "
                f"{budget}: leave room for weights, gradients, workspaces and fragmentation by planning with a "
                "smaller budget",
                tensor=name, size_bytes=size, held_bytes=held, budget_bytes=self.budget,
            ) from exc

    def _fetch(self, state: _State) -> None:
        with self._naming_oom(state.name, "copying it back"):
            self._copy_in(state)

    def _host_pool(self) -> torch.Tensor | None:
        """The host pool, or None when it cannot be allocated: then say so once and keep swaps."""
        if self.pool is not None or self.pool_error is not None:
            return self.pool
        try:
            return self._pool()
        except RuntimeError as exc:  # torch.OutOfMemoryError and CUDA host-allocation errors alike
            first_line = (str(exc).strip().splitlines() or [""])[0][:200]
            self.pool_error = f"{type(exc).__name__}: {first_line}"
            self.stats.host_pool_failures += 1
            budget = "" if self.budget is None else f" over the plan's budget of {self.budget} bytes"
            warnings.warn(
                f"slackswap runtime: could not allocate the {'pinned ' if self.cuda else ''}host pool of "
                f"{self.pool_bytes} bytes for {len(self.slots)} swapped tensors ({self.pool_error}); keeping those "
                f"tensors on the device instead (up to {self.pool_bytes} bytes{budget}; gradients are unchanged) "
                "for the rest of this runtime: free host memory (pinned memory counts against ulimit -l) and call "
                "slackswap.apply again",
                RuntimeFallbackWarning, stacklevel=2,
            )
            return None

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
            state.storage = src  # held until the copy out completes
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
                state.storage = None
                if state.restored is None:
                    self._uncount(state)
            else:
                still.append(state)
        self.pending_d2h = still

    def _copy_in(self, state: _State) -> None:
        self.issued.add(state.name)
        self.copy_in_steps[state.name] = self.clock
        src = self._slot(state.name)
        if self.cuda:
            if state.storage is not None:
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
