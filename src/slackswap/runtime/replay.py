"""Forward-pass recorder: names storages as the profile does, records what recompute needs,
and gives the swap manager a backward-step clock.

A TorchDispatchMode sees every aten op of the forward pass (below autograd, as the profiler
saw them) and checks each against the profile: a different op at a position is a
PlanMismatchError before any gradient exists. For the ops some recompute group re-runs it
keeps a *recipe*: the op, its non-tensor arguments, and for each tensor argument either the
workload tensor it views (storage name, offset, shape, stride, dtype: no reference is held,
so the memory is freed as planned), for an argument read only for its metadata (the profile's
shape inputs: ``empty_like``'s) that metadata, or, for parameters, buffers and step inputs, the
tensor itself; for ops that draw random numbers, the RNG state they drew from. Replaying a group
(SwapManager.run_group) rebuilds exactly the plan's tensors, bit for bit.

The clock: the autograd node of op i (read from its outputs when the next op starts, as the
profiler does) gets a pre-hook that tells the manager backward step n-1-i begins. Node pre-hooks
run before the node unpacks its saved tensors, so a group is rebuilt, and copies back issued,
before the step that needs them. The last op's node is read only after the forward ends, so
its step is started by the first unpack of the backward instead (same step, same work).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..errors import PlanMismatchError
from ..profile_trace import aten_of, tensor_source
from ..profiler.tracer import IGNORED_OPS, storage_key, written_tensors
from ..schedule import backward_step_of


@dataclass(frozen=True)
class TensorRef:
    """A tensor argument that is a view of workload tensor ``name``'s storage."""

    name: str
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True)
class ShapeRef:
    """A tensor argument the op reads only for its metadata (Op.shape_inputs): replayed on a stand-in
    of this shape, stride, dtype and device (profiler/shape_only.py), so nothing rebuilds it."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device


@dataclass
class Recipe:
    func: Any
    flat: list
    """Flattened (args, kwargs): TensorRef, ShapeRef, a held tensor, or a plain value."""
    spec: Any
    written: tuple[int, ...]
    """Positions in ``flat`` of the tensors the op writes into."""
    rng: tuple[torch.device, torch.Tensor] | None


def output_sources(op_outputs: tuple[str, ...]) -> list[tuple[str, str, int]]:
    """(name, 'out' | 'written', index) for each tensor an op makes, from the profile's names
    ('…:3' is its 4th tensor output, '…:w0' the version of the first tensor it writes into)."""
    sources = [(name, tensor_source(name)) for name in op_outputs]
    return [(name, "written" if src.written else "out", src.index) for name, src in sources]


def rng_state(device: torch.device) -> torch.Tensor:
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def set_rng_state(device: torch.device, state: torch.Tensor) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


def _device_of(flat: list) -> torch.device:
    for x in flat:
        if isinstance(x, torch.Tensor):
            return x.device
        if isinstance(x, torch.device):
            return x
    return torch.device("cpu")


def clock_hook(manager_ref, step: int, generation: int):
    """Autograd-node pre-hook: backward step ``step`` of step ``generation`` begins."""

    def hook(grads):
        manager = manager_ref()
        if manager is not None and manager.generation == generation:
            manager.begin_backward_step(step)

    return hook


class ForwardRecorder:
    """Per-step state of the forward pass; ``mode()`` gives the dispatch mode that feeds it."""

    def __init__(self, workload, emap, manager, frozen_keys: set[tuple]) -> None:
        self.workload = workload
        self.n = len(workload.ops)
        self.aten = [aten_of(op.name) for op in workload.ops]
        self.sources = [output_sources(op.outputs) for op in workload.ops]
        self.profiled_inputs = {i: frozenset(workload.ops[i].inputs) for i in emap.group_ops}
        self.shape_inputs = {i: frozenset(workload.ops[i].shape_inputs) for i in emap.group_ops}
        self.group_ops = emap.group_ops
        self.random_ops = emap.random_ops
        self.manager = manager
        self.frozen = frozen_keys
        self.i = self.n  # no step running until begin_step
        self.names: dict[tuple, str] = {}
        self.pending: tuple[int, list] | None = None
        self.hooked: set[int] = set()

    def begin_step(self) -> None:
        self.i = 0
        self.names = {}
        self.pending = None
        self.hooked = set()

    # ---- the clock --------------------------------------------------------------------------
    def resolve_pending(self) -> None:
        """Hook the autograd node of the op that ran last (autograd attaches it after the op returns)."""
        if self.pending is None:
            return
        i, refs = self.pending
        self.pending = None
        for ref in refs:
            t = ref()
            node = t.grad_fn if t is not None else None
            if node is not None:
                if id(node) not in self.hooked:
                    self.hooked.add(id(node))
                    step = backward_step_of(self.n, i)
                    # A weak reference: a node outliving the step (a graph the user keeps) must not
                    # keep the manager and its host pool alive.
                    node.register_prehook(clock_hook(weakref.ref(self.manager), step, self.manager.generation))
                return

    # ---- ops --------------------------------------------------------------------------------
    def on_op(self, func, args, kwargs):
        i = self.i
        self.i += 1
        self.manager.stats.recorded_ops += 1
        self.resolve_pending()
        aten = str(func.overloadpacket.__name__) if hasattr(func, "overloadpacket") else str(func)
        if aten != self.aten[i]:
            self.i = self.n
            raise PlanMismatchError(
                f"forward op #{i} is {aten}, the profile has {self.workload.ops[i].name!r}: the model or its "
                "inputs changed since profiling; profile again and make a new plan"
            )
        recipe = self._record(i, func, args, kwargs) if i in self.group_ops else None
        out = func(*args, **kwargs)
        out_tensors = [x for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor)]
        written = written_tensors(func, args, kwargs) if any(k == "written" for _, k, _ in self.sources[i]) else []
        for name, kind, k in self.sources[i]:
            t = written[k] if kind == "written" else out_tensors[k]
            self.names[storage_key(t)] = name
        if recipe is not None:
            self.manager.recipes[i] = recipe
        self.pending = (i, [weakref.ref(t) for t in out_tensors])
        return out

    def _record(self, i: int, func, args, kwargs) -> Recipe:
        flat, spec = tree_flatten((args, kwargs))
        written_ids = {id(t) for t in written_tensors(func, args, kwargs)}
        items, written = [], []
        for pos, x in enumerate(flat):
            if not isinstance(x, torch.Tensor):
                items.append(x)
                continue
            if id(x) in written_ids:
                written.append(pos)
            key = storage_key(x)
            parameter = key in self.frozen or x.untyped_storage().nbytes() == 0 or self.manager.fsdp.is_gathered(x)
            name = None if parameter else self.names.get(key)
            if name is not None and name in self.shape_inputs[i] and name not in self.profiled_inputs[i]:
                # Read for its metadata only: no reference, no name to rebuild, a stand-in at replay.
                items.append(ShapeRef(tuple(x.shape), tuple(x.stride()), x.dtype, x.device))
                continue
            if name is not None and name not in self.profiled_inputs[i]:
                # A stale name: ``names`` holds no storage alive, so a storage it named may have been
                # freed and its address reused by a tensor no recorded op made (the 0-dim tensor
                # torch builds for ``x[..., 0] = 2``, a step input in the profile). The profile
                # says which tensors this op reads; one it does not list is not that activation.
                name = None
            if name is None:
                # A parameter, a buffer or a step input: on the device for the whole step anyway.
                # Detached: the replay runs without a graph, and a view of a parameter (w.t())
                # would hold its autograd node, whose clock hook leads back to the manager.
                items.append(x.detach())
            else:
                items.append(TensorRef(name, x.storage_offset(), tuple(x.shape), tuple(x.stride()), x.dtype))
        rng = None
        if i in self.random_ops:
            device = _device_of(flat)
            rng = (device, rng_state(device))
        return Recipe(func, items, spec, tuple(written), rng)


class RecordingMode(TorchDispatchMode):
    def __init__(self, recorder: ForwardRecorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        r = self.recorder
        if r.i >= r.n or func in IGNORED_OPS or r.manager.busy or r.manager.fsdp.inside:
            return func(*args, **kwargs)
        return r.on_op(func, args, kwargs)
