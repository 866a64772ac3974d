"""Record one forward pass at aten level: ops, module calls, and every save for backward.

The tracer is three observers running together:

* module forward pre/post hooks keep a stack of module *calls* (a module called twice in
  one step gives two calls, ``path`` and ``path@1``);
* a TorchDispatchMode (below autograd, so it sees the same aten ops as selective
  checkpointing does) records each op with the storages it reads and creates;
* saved_tensors_hooks record each tensor autograd saves.

Tensors are identified by their *storage*: a view, a transpose or an in-place result is the
same tensor as its base, so a storage saved through several views counts once. An op that
writes into an existing storage (an in-place op, an ``out=`` argument: the schema marks the
argument as written) makes a new *version* of it: a new workload tensor of the same size,
produced by that op, so that rebuilding what a later op reads re-runs the writes too (a
dropout mask is ``empty_like``, then ``bernoulli_``, then ``div_``). Storages of parameters and
buffers are not activations and are left out. Autograd saves an op's inputs
just before the op reaches the dispatcher and its outputs just after, so each save is
attributed to the op before it (if it saved one of that op's outputs) or to the op after it
(if it saved one of that op's inputs); see ``_attribute_saves``. That guess is then checked
against the traced backward: the op whose autograd node unpacks a save is its reader.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from ..errors import ValidationError
from ..profile_trace import LOSS_CALL, ROOT_CALL, call_name, op_name, output_name, version_name
from .fsdp import FsdpUnits, local_tensor
from .shape_only import shape_only_argument

# Ops selective checkpointing never shows its policy (torch/utils/checkpoint.py SAC_IGNORED_OPS);
# the tracer skips them too, and so do the runtime's recorders, so that op positions agree.
IGNORED_OPS = frozenset({torch.ops.aten.detach.default, torch.ops.prim.device.default})


def storage_key(t: torch.Tensor) -> tuple:
    """What identifies a tensor's storage while it is alive: device and address. The profiler
    and the runtime name tensors by it, and tell parameters and buffers apart by it."""
    return (t.device.type, t.device.index, t.untyped_storage().data_ptr())


@dataclass
class OpRecord:
    index: int
    name: str
    func: Any
    aten: str
    call: str
    """Innermost module call that ran the op ('loss_fn' for ops outside the model)."""
    inputs: list[str]
    shape_inputs: list[str]
    """Tensors the op reads only for their metadata (profiler/shape_only.py): not in ``inputs``."""
    outputs: list[str]
    """Tensors the op made: versions of storages it wrote into (in place, ``out=``), then new storages.
    Views of existing storages are not new tensors."""
    touched: list[str]
    """Current tensor names of every storage the op wrote or returned, including views."""
    flops: float
    bytes_accessed: float
    is_view: bool
    out_refs: list[torch.Tensor] = field(default_factory=list)
    node: Any = None
    input_saves: int = 0
    output_saves: int = 0


@dataclass
class SaveRecord:
    storage: str | None
    """Workload tensor name, or None for a parameter or buffer."""
    nbytes: int
    call: str
    gap: int
    """Number of ops dispatched before this save."""
    prev_can_save_output: bool = True
    """False when the op before this save cannot have saved an output: a view, or an op whose
    outputs carry no autograd node."""
    reader: int = -1
    is_output: bool = False
    """True when saved right after its reader ran (an output save), False for an input save."""
    observed_reader: int = -1
    """Op whose autograd node unpacked this save in the traced backward (-1: never unpacked)."""


@dataclass
class Trace:
    ops: list[OpRecord]
    saves: list[SaveRecord]
    events: list[tuple]
    """('enter', call) and ('save', save_index) in the order they happened."""
    calls: dict[str, str | None]
    """Module call -> the call it ran inside (None at the top)."""
    call_args: dict[str, list[str | None]]
    """Module call -> storage name of each positional tensor argument (None: parameter or buffer)."""
    storage_nbytes: dict[str, int]
    step_inputs: list[str]
    stateful_args: dict[str, list[str]] = field(default_factory=dict)
    """Module call -> type names of its arguments that are neither tensors nor plain values."""


class _StorageIds:
    """Names storages. Every storage seen is kept alive for the traced step, so an address
    is never reused by another storage while the trace runs."""

    def __init__(self, model: torch.nn.Module, fsdp: FsdpUnits) -> None:
        self.names: dict[tuple, str] = {}
        self.nbytes: dict[str, int] = {}
        self.keep: list[Any] = []
        self.frozen: set[tuple] = set()
        for tensor in list(model.parameters()) + list(model.buffers()):
            self.frozen.add(storage_key(local_tensor(tensor)))
        self.fsdp = fsdp
        self.step_inputs: list[str] = []

    def lookup(self, t: torch.Tensor) -> str | None:
        """Name of ``t``'s storage; None for parameters, buffers and empty tensors. An unseen
        storage that is not a parameter is a step input."""
        if self.is_parameter(t):
            return None
        key = storage_key(t)
        name = self.names.get(key)
        if name is None:
            name = f"input{len(self.step_inputs)}"
            self._add(key, name, t)
            self.step_inputs.append(name)
        return name

    def is_parameter(self, t: torch.Tensor) -> bool:
        """Empty, a parameter or buffer, or a parameter FSDP gathered for this step."""
        return t.untyped_storage().nbytes() == 0 or storage_key(t) in self.frozen or self.fsdp.is_gathered(t)

    def _add(self, key: tuple, name: str, t: torch.Tensor) -> None:
        self.names[key] = name
        self.nbytes[name] = t.untyped_storage().nbytes()
        self.keep.append(t)

    def rename(self, key: tuple, name: str, t: torch.Tensor) -> None:
        """The storage at ``key`` now holds a new version, called ``name``."""
        self._add(key, name, t)


def _tensors(tree) -> list[torch.Tensor]:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


def written_tensors(func, args, kwargs) -> list[torch.Tensor]:
    """Tensor arguments the op writes into (in-place ``self``, ``out=``), in schema order."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return []
    written: list[torch.Tensor] = []
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = args[i] if i < len(args) and not arg.kwarg_only else kwargs.get(arg.name)
        written.extend(_tensors(value))
    return written


class _Recorder(TorchDispatchMode):
    def __init__(self, tracer: "Tracer") -> None:
        super().__init__()
        self.tracer = tracer

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in IGNORED_OPS or self.tracer.fsdp.inside:
            return func(*args, **kwargs)
        return self.tracer.on_op(func, args, kwargs)


class Tracer:
    """Records one forward pass. Use :func:`trace_step`."""

    def __init__(self, model: torch.nn.Module, timer) -> None:
        self.model = model
        self.fsdp = FsdpUnits(model)
        self.ids = _StorageIds(model, self.fsdp)
        self.timer = timer
        self.ops: list[OpRecord] = []
        self.saves: list[SaveRecord] = []
        self.events: list[tuple] = []
        self.stack: list[str] = []
        self.call_counts: dict[str, int] = {}
        self.calls: dict[str, str | None] = {}
        self.call_args: dict[str, list[str | None]] = {}
        self.stateful_args: dict[str, list[str]] = {}
        """Module call -> type names of the arguments that are neither tensors nor plain values (a
        cache object the call may change: checkpoint cannot re-run such a call exactly)."""
        self.direct_ops: dict[str, int] = {}
        self.paths = {id(m): name for name, m in model.named_modules()}
        self.root_id = id(model)
        # Counted by identity: a submodule may be named like the root's call (Hugging Face's
        # LlamaForCausalLM has a submodule `model`), so call_counts cannot tell the two apart.
        self.root_calls = 0
        self.fwd_times: list[float] = []
        self.ops_before_model: list[str] = []
        self.running = threading.local()
        """``running.op``: the op whose autograd node runs now on this thread (set in backward)."""

    # ---- module calls ---------------------------------------------------------------------
    def on_enter(self, module, args) -> None:
        path = self.paths.get(id(module))
        if path is None:
            return
        path = path or ROOT_CALL
        k = self.call_counts.get(path, 0)
        self.call_counts[path] = k + 1
        if id(module) == self.root_id:
            self.root_calls += 1
            if self.root_calls == 1:
                self.ops_before_model = [op.aten for op in self.ops]
        call = call_name(path, k)
        self.calls[call] = self.stack[-1] if self.stack else None
        self.call_args[call] = [self.ids.lookup(a) for a in args if isinstance(a, torch.Tensor)]
        self.stack.append(call)
        self.events.append(("enter", call))

    def on_enter_kwargs(self, module, args, kwargs) -> None:
        """Per-module pre-hook (after on_enter, which has pushed the call): notes stateful arguments."""
        if self.paths.get(id(module)) is None or not self.stack:
            return
        kinds = sorted({type(x).__name__ for v in (*args, *kwargs.values()) for x in _stateful(v)})
        if kinds:
            self.stateful_args[self.stack[-1]] = kinds

    def on_exit(self, module, args, output) -> None:
        if self.paths.get(id(module)) is not None and self.stack:
            self.stack.pop()

    def current_call(self) -> str:
        return self.stack[-1] if self.stack else LOSS_CALL

    # ---- ops --------------------------------------------------------------------------------
    def _resolve_previous_node(self) -> None:
        # Autograd attaches an op's node to its outputs after the dispatcher returns, so the
        # node is read when the next op starts (before a later in-place op replaces it).
        if self.ops and self.ops[-1].node is None:
            prev = self.ops[-1]
            prev.node = next((t.grad_fn for t in prev.out_refs if t.grad_fn is not None), False)
            prev.out_refs = []

    def on_op(self, func, args, kwargs):
        self._resolve_previous_node()
        in_tensors = _tensors((args, kwargs))
        shaped = shape_only_argument(func, args)
        inputs: list[str] = []
        shape_inputs: list[str] = []
        for t in in_tensors:
            name = self.ids.lookup(t)
            names = shape_inputs if t is shaped else inputs
            if name is not None and name not in names:
                names.append(name)
        shape_inputs = [n for n in shape_inputs if n not in inputs]
        start = self.timer.start()
        out = func(*args, **kwargs)
        elapsed = self.timer.stop(start)
        out_tensors = _tensors(out)
        call = self.current_call()
        j = self.direct_ops.get(call, 0)
        self.direct_ops[call] = j + 1
        aten = str(func.overloadpacket.__name__) if hasattr(func, "overloadpacket") else str(func)
        index = len(self.ops)
        name_of_op = op_name(call, aten, j)
        outputs, touched = [], []
        for k, t in enumerate(written_tensors(func, args, kwargs)):
            # A write makes a new version of an activation storage (parameters and buffers stay out).
            if self.ids.is_parameter(t):
                continue
            if self.ids.lookup(t) is None:
                continue
            name = version_name(name_of_op, k)
            self.ids.rename(storage_key(t), name, t)
            outputs.append(name)
            touched.append(name)
        for i, t in enumerate(out_tensors):
            if self.ids.is_parameter(t):
                continue
            key = storage_key(t)
            name = self.ids.names.get(key)
            if name is None:
                name = output_name(name_of_op, i)
                self.ids._add(key, name, t)
                outputs.append(name)
            if name not in touched:
                touched.append(name)
        packet = getattr(func, "overloadpacket", None)
        flops = 0.0
        if packet in flop_registry:
            flops = float(flop_registry[packet](*args, **kwargs, out_val=out))
        is_view = bool(getattr(func, "is_view", False))
        moved = 0 if is_view else sum(t.nbytes for t in in_tensors) + sum(t.nbytes for t in out_tensors)
        self.ops.append(OpRecord(
            index=index, name=name_of_op, func=func, aten=aten, call=call, inputs=inputs, shape_inputs=shape_inputs,
            outputs=outputs, touched=touched,
            flops=flops, bytes_accessed=float(moved), is_view=is_view, out_refs=out_tensors,
        ))
        self.fwd_times.append(elapsed)
        return out

    # ---- saves ------------------------------------------------------------------------------
    def on_pack(self, t: torch.Tensor):
        name = self.ids.lookup(t)
        prev = self.ops[-1] if self.ops else None
        can = prev is not None and not prev.is_view and (
            prev.node not in (None, False) or any(r.grad_fn is not None for r in prev.out_refs))
        self.saves.append(SaveRecord(storage=name, nbytes=t.untyped_storage().nbytes(), call=self.current_call(),
                                     gap=len(self.ops), prev_can_save_output=can))
        self.events.append(("save", len(self.saves) - 1))
        return (len(self.saves) - 1, t)

    def on_unpack(self, packed):
        index, t = packed
        save = self.saves[index]
        running = getattr(self.running, "op", -1)
        if save.observed_reader < 0 and running >= 0:
            save.observed_reader = running
        return t

    def trace(self) -> Trace:
        _attribute_saves(self.ops, self.saves)
        for s in self.saves:
            # The backward says who really reads a save; the forward-order guess can credit an
            # input save of op X+1 to op X when X's output shares the storage (a view-like op).
            if s.observed_reader >= 0 and s.observed_reader != s.reader:
                s.reader = s.observed_reader
                s.is_output = s.reader < s.gap
        for op in self.ops:
            op.input_saves = op.output_saves = 0
        for s in self.saves:
            if s.reader >= 0:
                if s.is_output:
                    self.ops[s.reader].output_saves += 1
                else:
                    self.ops[s.reader].input_saves += 1
        return Trace(ops=self.ops, saves=self.saves, events=self.events, calls=self.calls,
                     call_args=self.call_args, storage_nbytes=self.ids.nbytes, step_inputs=self.ids.step_inputs,
                     stateful_args=self.stateful_args)


def _attribute_saves(ops: list[OpRecord], saves: list[SaveRecord]) -> None:
    """Give each save its reader op: the op before the save when it saved one of that op's
    outputs (autograd saves outputs right after the op), else the op after (inputs are
    saved right before). A storage that is both, saved twice in a row, is the earlier op's
    output first and the later op's input second."""
    by_gap: dict[int, list[SaveRecord]] = {}
    for s in saves:
        by_gap.setdefault(s.gap, []).append(s)
    for gap, group in by_gap.items():
        before = ops[gap - 1] if gap > 0 else None
        after = ops[gap] if gap < len(ops) else None
        before_out = set(before.touched) if before else set()
        after_in = set(after.inputs) if after else set()
        input_phase = False
        given_before: set[str | None] = set()
        for s in group:
            in_before = before is not None and s.storage in before_out and s.prev_can_save_output
            in_after = after is not None and (s.storage in after_in or s.storage is None)
            if s.storage is None and after is None:
                in_after, in_before = False, before is not None
            if in_before and (not in_after or (not input_phase and s.storage not in given_before)):
                s.reader, s.is_output = before.index, True
                before.output_saves += 1
                given_before.add(s.storage)
            elif after is not None and (in_after or before is None):
                s.reader = after.index
                after.input_saves += 1
                input_phase = True
            else:
                # A save of a tensor neither op touches (a closure-held tensor): the op that
                # just ran is the one whose backward holds it.
                s.reader, s.is_output = before.index, True
                before.output_saves += 1


class WallTimer:
    def start(self):
        return time.perf_counter()

    def stop(self, start) -> float:
        return time.perf_counter() - start


class CudaTimer:
    """Times ops with CUDA events; values are resolved after the step synchronizes."""

    def start(self):
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def stop(self, start):
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return (start, ev)

    @staticmethod
    def resolve(value) -> float:
        if isinstance(value, tuple):
            return value[0].elapsed_time(value[1]) / 1e3
        return float(value)


def check_one_model_call(tracer: Tracer) -> None:
    """The runtime starts a step at the model's forward and follows one call of it: refuse, at
    profiling time, a loss_fn that the runtime could not follow."""
    calls = tracer.root_calls
    if calls == 0:
        raise ValidationError(
            "loss_fn never called the model itself (only its submodules, or nothing): the runtime starts each step "
            "at the model's forward; call model(...) in loss_fn, or profile the submodule you call"
        )
    if calls > 1:
        raise ValidationError(
            f"loss_fn called the model {calls} times in one step: slackswap profiles and runs one model call per "
            "step; call the model once (concatenate the inputs) or wrap the calls in one module and profile that"
        )
    if tracer.ops_before_model:
        raise ValidationError(
            f"loss_fn ran {len(tracer.ops_before_model)} tensor op(s) before calling the model (first: "
            f"aten.{tracer.ops_before_model[0]}): the runtime starts each step at the model's forward, so do that "
            "work in make_batch / your data pipeline or inside the model's forward"
        )


_PLAIN = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size,
          torch.layout, torch.memory_format)


def _stateful(value, depth: int = 0):
    """The objects in ``value`` (an argument) that are neither tensors nor plain values."""
    if isinstance(value, (torch.Tensor, *_PLAIN)) or depth > 4:
        return []
    if isinstance(value, (tuple, list)):
        return [x for v in value for x in _stateful(v, depth + 1)]
    if isinstance(value, dict):
        return [x for v in value.values() for x in _stateful(v, depth + 1)]
    return [value]


def run_traced(model, batch, loss_fn, *, timer) -> tuple[Trace, list[float], torch.Tensor]:
    """Run forward (traced) and backward (nodes timed). Returns the trace, the per-op
    forward times (seconds, or CUDA event pairs) and backward times."""
    tracer = Tracer(model, timer)
    pre = torch.nn.modules.module.register_module_forward_pre_hook(tracer.on_enter)
    post = torch.nn.modules.module.register_module_forward_hook(tracer.on_exit)
    kw_hooks = [m.register_forward_pre_hook(tracer.on_enter_kwargs, with_kwargs=True) for m in model.modules()]
    tracer.fsdp.install()
    try:
        with torch.autograd.graph.saved_tensors_hooks(tracer.on_pack, tracer.on_unpack):
            with _Recorder(tracer):
                loss = loss_fn(model, batch)
    finally:
        tracer.fsdp.remove()
        pre.remove()
        post.remove()
        for h in kw_hooks:
            h.remove()
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.requires_grad:
        raise ValidationError("loss_fn(model, batch) must return a scalar tensor that requires grad")
    check_one_model_call(tracer)
    # Time each op's autograd node (found in _resolve_previous_node) during backward.
    tracer._resolve_previous_node()
    bwd_marks: dict[int, list] = {}
    seen_nodes: set[int] = set()
    handles = []
    for op in tracer.ops:
        node = op.node
        if not node or id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        op.node = node
        marks: list = []
        bwd_marks[op.index] = marks

        def pre_hook(grad_outputs, marks=marks, index=op.index):
            tracer.running.op = index
            marks.append(timer.start())

        def post_hook(grad_inputs, grad_outputs, marks=marks):
            marks.append(timer.stop(marks.pop()))
            tracer.running.op = -1

        handles.append(node.register_prehook(pre_hook))
        handles.append(node.register_hook(post_hook))
    loss.backward()
    for h in handles:
        h.remove()
    bwd_times = [bwd_marks.get(op.index, [0.0])[-1] if bwd_marks.get(op.index) else 0.0 for op in tracer.ops]
    for op in tracer.ops:
        op.node = None
    return tracer.trace(), tracer.fwd_times, bwd_times
