"""Workload: what one training step does.

A workload is the ordered list of forward ops of one step and the tensors they
produce. A tensor is *saved* when at least one op's backward reads it
(``bwd_readers`` non-empty); only saved tensors occupy the activation budget and
receive an action in a Plan. Unsaved tensors are transient: they matter only as
links in a recompute chain (for example the attention scores between QK^T and
softmax). The backward pass runs the ops in reverse order.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Mapping

from ._fields import (
    MAX_INT, Fields, check_int, check_json, check_names, check_text, parse_json_text, read_json_file, show,
    write_text_atomic,
)
from .errors import ValidationError
from .profile_trace import trace_fingerprint_part

WORKLOAD_FORMAT = "slackswap.workload/2"
"""Version 2 adds ``ops[].shape_inputs``. A workload none of whose ops has shape inputs is written as
version 1, byte for byte what version 1 wrote (so its fingerprint is unchanged and older slackswap
reads it); version-1 files load as workloads without shape inputs."""
WORKLOAD_FORMAT_V1 = "slackswap.workload/1"
MAX_OP_TIME_S = 1e6
"""Longest op accepted: beyond it the input is a unit mistake, and sums of such times could overflow."""


def backward_step_of(n_ops: int, op_index: int) -> int:
    """The backward step that runs op ``op_index``'s backward: the backward pass runs the ops in
    reverse, so step 0 is the last op's."""
    return n_ops - 1 - op_index


def op_of_backward_step(n_ops: int, step: int) -> int:
    """The index of the op whose backward runs at backward step ``step``."""
    return n_ops - 1 - step


@dataclass(frozen=True, slots=True, kw_only=True)
class Tensor:
    name: str
    size_bytes: int
    producer: str | None
    """Forward op whose output this is; None for a step input (always resident, never recomputed)."""
    bwd_readers: tuple[str, ...] = ()
    """Ops whose backward reads this tensor. Empty: transient, not saved for backward."""

    @property
    def is_saved(self) -> bool:
        return bool(self.bwd_readers)


@dataclass(frozen=True, slots=True, kw_only=True)
class Op:
    name: str
    layer: int
    """Layer index; -1 for ops before the first layer (embedding), L for ops after the last."""
    kind: str
    """Free-form category such as 'gemm', 'attention', 'norm', 'elementwise', 'loss'."""
    fwd_time_s: float
    bwd_time_s: float
    flops: float
    """Forward FLOPs (a multiply-add counts 2)."""
    bytes_accessed: float
    """Forward bytes read and written in device memory."""
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    shape_inputs: tuple[str, ...] = ()
    """Tensors the op reads only for their shape, dtype, device and strides (``empty_like``'s input,
    the ``self`` of ``new_zeros``): not dependencies. Rebuilding the op's outputs does not rebuild
    them; the runtime makes a stand-in of that shape (profiler/shape_only.py)."""


@dataclass(frozen=True, kw_only=True)
class Workload:
    name: str
    ops: tuple[Op, ...]
    tensors: tuple[Tensor, ...]
    meta: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)
    """Free-form description of how the workload was made (model config, source)."""

    def __post_init__(self) -> None:
        _validate(self)

    # ---- indices, computed once -------------------------------------------------
    @cached_property
    def op_index(self) -> dict[str, int]:
        return {op.name: i for i, op in enumerate(self.ops)}

    @cached_property
    def tensor_by_name(self) -> dict[str, Tensor]:
        return {t.name: t for t in self.tensors}

    @cached_property
    def saved_tensors(self) -> tuple[Tensor, ...]:
        """Saved tensors in order of production (step inputs first)."""
        order = {name: i for i, name in enumerate(self._production_order)}
        return tuple(sorted((t for t in self.tensors if t.is_saved), key=lambda t: order[t.name]))

    @cached_property
    def _production_order(self) -> tuple[str, ...]:
        names = [t.name for t in self.tensors if t.producer is None]
        for op in self.ops:
            names.extend(op.outputs)
        return tuple(names)

    @cached_property
    def last_fwd_use(self) -> dict[str, int]:
        """Index of the last forward op that produces or reads each tensor (-1: step input never read)."""
        last: dict[str, int] = {t.name: -1 for t in self.tensors}
        for i, op in enumerate(self.ops):
            for name in op.inputs + op.outputs:
                last[name] = i
        return last

    @cached_property
    def bwd_reads(self) -> dict[str, tuple[str, ...]]:
        """For each op, the saved tensors its backward reads, in production order."""
        reads: dict[str, list[str]] = {op.name: [] for op in self.ops}
        for t in self.saved_tensors:
            for reader in t.bwd_readers:
                reads[reader].append(t.name)
        return {k: tuple(v) for k, v in reads.items()}

    @cached_property
    def last_bwd_reader(self) -> dict[str, int]:
        """Op index of the last backward reader of each saved tensor (the smallest forward index)."""
        return {t.name: min(self.op_index[r] for r in t.bwd_readers) for t in self.saved_tensors}

    @cached_property
    def first_bwd_step(self) -> dict[str, int]:
        """Backward step of the first backward read of each saved tensor (backward runs the ops in
        reverse, so the reader with the largest forward index reads first)."""
        n = len(self.ops)
        return {t.name: backward_step_of(n, max(self.op_index[r] for r in t.bwd_readers))
                for t in self.saved_tensors}

    @cached_property
    def bwd_step_starts_s(self) -> tuple[float, ...]:
        """Start of each backward step after the forward pass ends, with no recompute and no stalls."""
        starts, now = [], 0.0
        for op in reversed(self.ops):
            starts.append(now)
            now += op.bwd_time_s
        return tuple(starts)

    @cached_property
    def size_bytes_of(self) -> dict[str, int]:
        return {t.name: t.size_bytes for t in self.tensors}

    @cached_property
    def saved_outputs(self) -> tuple[tuple[str, ...], ...]:
        """Per op index, the saved tensors it produces."""
        return tuple(tuple(o for o in op.outputs if self.tensor_by_name[o].is_saved) for op in self.ops)

    @cached_property
    def last_fwd_use_of_saved(self) -> tuple[tuple[str, ...], ...]:
        """Per op index, the saved tensors whose last forward use is that op."""
        out: list[list[str]] = [[] for _ in self.ops]
        for t in self.saved_tensors:
            i = self.last_fwd_use[t.name]
            if i >= 0:
                out[i].append(t.name)
        return tuple(tuple(names) for names in out)

    @cached_property
    def last_bwd_read_of(self) -> tuple[tuple[str, ...], ...]:
        """Per op index, the produced saved tensors whose last backward reader is that op."""
        out: list[list[str]] = [[] for _ in self.ops]
        for name, i in self.last_bwd_reader.items():
            if self.tensor_by_name[name].producer is not None:
                out[i].append(name)
        return tuple(tuple(names) for names in out)

    @cached_property
    def ideal_step_time_s(self) -> float:
        # Summed one op at a time in execution order, exactly as the simulator advances its
        # clock, so an all-keep simulation reports 100% to the last bit.
        now = 0.0
        for op in self.ops:
            now += op.fwd_time_s
        for op in reversed(self.ops):
            now += op.bwd_time_s
        return now

    @cached_property
    def saved_bytes(self) -> int:
        return sum(t.size_bytes for t in self.saved_tensors)

    @cached_property
    def fingerprint(self) -> str:
        """Hash of the workload's structure, sizes and FLOPs, not its times, and of the profiler's
        trace when it has one (the order the runtime sees saves in); plans record it to detect
        mismatches. Without the times, one plan fits every profile of one model and batch: each
        rank's, and the same profile projected onto another GPU by the roofline."""
        data = self.to_dict(include_meta=False)
        for op in data["ops"]:
            del op["fwd_time_s"], op["bwd_time_s"]
        trace = trace_fingerprint_part(self.meta)
        if trace:
            data["trace"] = trace
        payload = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    # ---- JSON -------------------------------------------------------------------
    def to_dict(self, *, include_meta: bool = True) -> dict[str, Any]:
        shaped = any(op.shape_inputs for op in self.ops)
        data: dict[str, Any] = {"format": WORKLOAD_FORMAT if shaped else WORKLOAD_FORMAT_V1, "name": self.name}
        if include_meta:
            data["meta"] = dict(self.meta)
        data["ops"] = []
        for op in self.ops:
            row: dict[str, Any] = {
                "name": op.name, "layer": op.layer, "kind": op.kind,
                "fwd_time_s": op.fwd_time_s, "bwd_time_s": op.bwd_time_s,
                "flops": op.flops, "bytes_accessed": op.bytes_accessed,
                "inputs": list(op.inputs), "outputs": list(op.outputs),
            }
            if op.shape_inputs:
                row["shape_inputs"] = list(op.shape_inputs)
            data["ops"].append(row)
        data["tensors"] = [
            {"name": t.name, "size_bytes": t.size_bytes, "producer": t.producer, "bwd_readers": list(t.bwd_readers)}
            for t in self.tensors
        ]
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def save(self, path) -> None:
        write_text_atomic(path, self.to_json() + "\n")

    @classmethod
    def from_dict(cls, data: Any) -> "Workload":
        top = Fields(data, "workload")
        fmt = top.str("format", default=WORKLOAD_FORMAT_V1)
        if fmt not in (WORKLOAD_FORMAT, WORKLOAD_FORMAT_V1):
            raise ValidationError(f"workload.format is {fmt!r}, expected {WORKLOAD_FORMAT!r}: export the workload again")
        name = top.str("name")
        meta = top.dict("meta", default={})
        ops = []
        for i, raw in enumerate(top.list("ops")):
            f = Fields(raw, f"workload.ops[{i}]")
            ops.append(Op(
                name=f.str("name"), layer=f.int("layer", minimum=-1), kind=f.str("kind", default="other"),
                fwd_time_s=f.number("fwd_time_s"), bwd_time_s=f.number("bwd_time_s"),
                flops=f.number("flops", default=0.0), bytes_accessed=f.number("bytes_accessed", default=0.0),
                inputs=f.str_list("inputs", default=[]), outputs=f.str_list("outputs", default=[]),
                # only version 2 has the field: in a version-1 file it is an unknown field (no_extra)
                shape_inputs=f.str_list("shape_inputs", default=[]) if fmt == WORKLOAD_FORMAT else (),
            ))
            f.no_extra()
        tensors = []
        for i, raw in enumerate(top.list("tensors")):
            f = Fields(raw, f"workload.tensors[{i}]")
            tensors.append(Tensor(
                name=f.str("name"), size_bytes=f.int("size_bytes", positive=True),
                producer=f.opt_str("producer"), bwd_readers=f.str_list("bwd_readers", default=[]),
            ))
            f.no_extra()
        top.no_extra()
        return cls(name=name, ops=tuple(ops), tensors=tuple(tensors), meta=meta)

    @classmethod
    def from_json(cls, text: str) -> "Workload":
        return cls.from_dict(parse_json_text(text, "workload"))

    @classmethod
    def load(cls, path) -> "Workload":
        return cls.from_dict(read_json_file(path, "workload"))


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond the float range
        return False


def _validate(w: Workload) -> None:
    """Check references, order (which rules out cycles) and numbers. One error, naming the field."""
    check_text(w.name, "workload.name")
    check_json(w.meta, "workload.meta")
    for key, kind in (("ops", Op), ("tensors", Tensor)):
        items = getattr(w, key)
        if not isinstance(items, tuple) or not all(isinstance(x, kind) for x in items):
            raise ValidationError(f"workload.{key} must be a tuple of slackswap.{kind.__name__}, got {show(items)}")
    if not w.ops:
        raise ValidationError("workload.ops is empty: a workload needs at least one op")
    op_pos: dict[str, int] = {}
    for i, op in enumerate(w.ops):
        check_text(op.name, f"workload.ops[{i}].name")
        where = f"workload.ops[{i}] ({op.name!r})"
        check_int(op.layer, f"{where}.layer", minimum=-1)
        check_text(op.kind, f"{where}.kind")
        check_names(op.inputs, f"{where}.inputs")
        check_names(op.outputs, f"{where}.outputs")
        check_names(op.shape_inputs, f"{where}.shape_inputs")
        if op.name in op_pos:
            raise ValidationError(f"{where}: duplicate op name; op names must be unique")
        op_pos[op.name] = i
        for key in ("fwd_time_s", "bwd_time_s", "flops", "bytes_accessed"):
            value = getattr(op, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value) or value < 0:
                raise ValidationError(f"{where}.{key} must be a finite number >= 0, got {show(value)}")
        for key in ("fwd_time_s", "bwd_time_s"):
            if getattr(op, key) > MAX_OP_TIME_S:
                raise ValidationError(
                    f"{where}.{key} is {getattr(op, key)!r} s, more than {MAX_OP_TIME_S:.0e} s (11.6 days) "
                    "for one op: times are in seconds"
                )
    tensors: dict[str, Tensor] = {}
    for i, t in enumerate(w.tensors):
        check_text(t.name, f"workload.tensors[{i}].name")
        where = f"workload.tensors[{i}] ({t.name!r})"
        if t.producer is not None:
            check_text(t.producer, f"{where}.producer")
        check_names(t.bwd_readers, f"{where}.bwd_readers")
        if t.name in tensors:
            raise ValidationError(f"{where}: duplicate tensor name; tensor names must be unique")
        tensors[t.name] = t
        if isinstance(t.size_bytes, bool) or not isinstance(t.size_bytes, int) or not 0 < t.size_bytes <= MAX_INT:
            raise ValidationError(f"{where}.size_bytes must be a positive integer at most 2**53, got {show(t.size_bytes)}")
        if t.producer is not None and t.producer not in op_pos:
            raise ValidationError(f"{where}.producer names unknown op {t.producer!r}")
        for reader in t.bwd_readers:
            if reader not in op_pos:
                raise ValidationError(f"{where}.bwd_readers names unknown op {reader!r}")
        if len(set(t.bwd_readers)) != len(t.bwd_readers):
            raise ValidationError(f"{where}.bwd_readers lists an op twice")
    produced_at: dict[str, int] = {name: -1 for name, t in tensors.items() if t.producer is None}
    for i, op in enumerate(w.ops):
        where = f"workload.ops[{i}] ({op.name!r})"
        for name in op.inputs:
            if name not in tensors:
                raise ValidationError(f"{where}.inputs names unknown tensor {name!r}")
            if name not in produced_at:
                raise ValidationError(
                    f"{where}.inputs reads {name!r} before any earlier op produces it "
                    "(ops must be in execution order; a cycle cannot be ordered)"
                )
        for name in op.shape_inputs:
            if name not in tensors:
                raise ValidationError(f"{where}.shape_inputs names unknown tensor {name!r}")
            if name not in produced_at:
                raise ValidationError(f"{where}.shape_inputs reads {name!r} before any earlier op produces it")
            if name in op.inputs:
                raise ValidationError(
                    f"{where} lists {name!r} in both inputs and shape_inputs: a tensor whose values the op reads "
                    "is an input only"
                )
        for name in op.outputs:
            if name not in tensors:
                raise ValidationError(f"{where}.outputs names unknown tensor {name!r}")
            if tensors[name].producer != op.name:
                raise ValidationError(f"{where}.outputs lists {name!r}, whose producer is {tensors[name].producer!r}")
            if name in produced_at:
                raise ValidationError(f"{where}.outputs produces {name!r} a second time")
            produced_at[name] = i
    for i, t in enumerate(w.tensors):
        where = f"workload.tensors[{i}] ({t.name!r})"
        if t.name not in produced_at:
            raise ValidationError(f"{where}.producer {t.producer!r} does not list it in its outputs")
        for reader in t.bwd_readers:
            op = w.ops[op_pos[reader]]
            if t.name not in op.inputs and t.name not in op.outputs:
                raise ValidationError(
                    f"{where}.bwd_readers names {reader!r}, which neither reads nor produces it in forward"
                )
