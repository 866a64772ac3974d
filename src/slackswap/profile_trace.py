"""The profiler's record of one forward pass, as the runtime reads it (pure Python, no torch).

A profiled Workload carries, in ``meta``, what the runtime needs besides the ops and tensors:
the module calls, each call's positional tensor arguments, the call that ran each op, and the
order in which calls were entered and tensors were saved for backward. This module is the
one place that writes and reads that record and parses the names the profiler gives:

* an op is ``'{call}/{aten}#{j}'``: the j-th aten op the module call ran directly
  (``'h.0.mlp.fc/addmm#3'``); a module called twice in a step gives the calls ``path``
  and ``path@1``; ops outside the model run in the call ``loss_fn``;
* a tensor an op makes is ``'{op}:{i}'`` (its i-th tensor output) or ``'{op}:w{k}'`` (the
  new version of the k-th tensor argument it writes into, in place or through ``out=``).

The record is part of the workload's fingerprint (``TRACE_KEYS``), so a plan made for one
trace is refused on another by check_plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

LOSS_CALL = "loss_fn"
"""The call of ops that ran outside the model (in the user's loss function)."""
ROOT_CALL = "model"
"""The call of the model itself (its module path is the empty string)."""
STORAGE_VERSIONS = 1
"""Trace version the runtime needs: in-place writes are tensor versions (profiler/tracer.py)."""
TRACE_KEYS = ("calls", "call_args", "op_calls", "save_trace", "storage_versions")
"""The keys of Workload.meta that hold the trace (in the workload's fingerprint)."""


# ---- names --------------------------------------------------------------------------------
def op_name(call: str, aten: str, j: int) -> str:
    return f"{call}/{aten}#{j}"


def aten_of(op: str) -> str:
    """'h.0.mlp.fc/addmm#3' -> 'addmm'."""
    return op.rsplit("/", 1)[-1].split("#")[0]


def output_name(op: str, i: int) -> str:
    """Name of the new storage an op creates as its i-th tensor output."""
    return f"{op}:{i}"


def version_name(op: str, k: int) -> str:
    """Name of the version of a storage that the k-th written argument of an op makes."""
    return f"{op}:w{k}"


@dataclass(frozen=True)
class TensorSource:
    """Where an op's tensor comes from: its ``index``-th tensor output, or (``written``) the
    ``index``-th tensor argument it writes into."""

    written: bool
    index: int


def tensor_source(tensor: str) -> TensorSource:
    """Parse a tensor name made by output_name or version_name."""
    suffix = tensor.rsplit(":", 1)[1]
    if suffix.startswith("w"):
        return TensorSource(True, int(suffix[1:]))
    return TensorSource(False, int(suffix))


@dataclass(frozen=True)
class ModuleCall:
    """A module call name split into its module path ('' for the model) and its count in the step."""

    path: str
    count: int

    @classmethod
    def parse(cls, call: str) -> "ModuleCall":
        path, _, k = call.partition("@")
        return cls("" if path == ROOT_CALL else path, int(k or 0))


def call_name(path: str, count: int) -> str:
    """The name of the ``count``-th call of the module at ``path`` in a step."""
    path = path or ROOT_CALL
    return path if count == 0 else f"{path}@{count}"


# ---- events ------------------------------------------------------------------------------
@dataclass(frozen=True)
class CallEntered:
    """A module call began."""

    call: str


@dataclass(frozen=True)
class TensorSaved:
    """Autograd saved a tensor for backward."""

    tensor: str | None
    """Workload tensor name; None for a parameter or a buffer."""
    reader: str
    """The op whose backward reads it through this save."""
    call: str
    """The module call running when it was saved."""
    is_output: bool
    """Saved right after the reader ran (one of its outputs), not just before (an input)."""


@dataclass(frozen=True)
class ProfileTrace:
    calls: Mapping[str, str | None]
    """Module call -> the call it ran inside (None at the top)."""
    call_args: Mapping[str, tuple[str | None, ...]]
    """Module call -> tensor name of each positional tensor argument (None: parameter or buffer)."""
    op_calls: tuple[str, ...]
    """The innermost module call that ran each op, by op index."""
    events: tuple[CallEntered | TensorSaved, ...]
    """Calls entered and tensors saved, in the order they happened."""
    storage_versions: int = STORAGE_VERSIONS

    @property
    def saves(self) -> tuple[TensorSaved, ...]:
        return tuple(e for e in self.events if isinstance(e, TensorSaved))

    def to_meta(self) -> dict[str, Any]:
        """The JSON form kept in Workload.meta (compact rows: a trace has one per save)."""
        rows: list[list] = []
        for e in self.events:
            if isinstance(e, CallEntered):
                rows.append(["enter", e.call])
            else:
                rows.append(["save", e.tensor, e.reader, e.call, "out" if e.is_output else "in"])
        return {
            "calls": dict(self.calls), "call_args": {k: list(v) for k, v in self.call_args.items()},
            "op_calls": list(self.op_calls), "save_trace": rows, "storage_versions": self.storage_versions,
        }

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any]) -> "ProfileTrace":
        """Read the trace from Workload.meta. Raises KeyError naming the first missing key and
        ValueError on a malformed row (the runtime turns both into a PlanMismatchError)."""
        for key in TRACE_KEYS[:4]:
            if key not in meta:
                raise KeyError(key)
        events: list[CallEntered | TensorSaved] = []
        for i, row in enumerate(meta["save_trace"]):
            if isinstance(row, list) and len(row) == 2 and row[0] == "enter":
                events.append(CallEntered(row[1]))
            elif isinstance(row, list) and len(row) == 5 and row[0] == "save" and row[4] in ("in", "out"):
                events.append(TensorSaved(row[1], row[2], row[3], row[4] == "out"))
            else:
                raise ValueError(f"meta.save_trace[{i}] is {row!r}")
        return cls(
            calls=dict(meta["calls"]), call_args={k: tuple(v) for k, v in meta["call_args"].items()},
            op_calls=tuple(meta["op_calls"]), events=tuple(events),
            storage_versions=meta.get("storage_versions", 0),
        )


def trace_fingerprint_part(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The trace keys present in ``meta``, for the workload's fingerprint (empty without a trace)."""
    return {k: meta[k] for k in TRACE_KEYS if k in meta}
