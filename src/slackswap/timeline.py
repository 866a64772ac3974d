"""Timeline: what the simulator saw during one training step."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ._fields import Fields, read_json_file, write_text_atomic
from .errors import ValidationError

TIMELINE_FORMAT = "slackswap.timeline/1"

STREAMS = ("compute", "d2h", "h2d")
EVENT_KINDS = ("forward", "backward", "recompute", "copy_out", "copy_in", "stall_copy", "stall_memory")


@dataclass(frozen=True, slots=True)
class Event:
    stream: str
    """'compute', 'd2h' or 'h2d'."""
    kind: str
    """One of EVENT_KINDS. Stalls are compute-stream spans spent waiting, named after the op that waited."""
    name: str
    """Op name for compute events, tensor name for copies."""
    start_s: float
    end_s: float
    size_bytes: int = 0
    """Bytes allocated by the op, or moved by the copy."""
    step: int = -1
    """Backward step of the event (-1 during the forward pass)."""

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True, kw_only=True)
class Timeline:
    workload_name: str
    hardware_name: str
    policy: str
    budget_bytes: int | None
    step_time_s: float
    ideal_step_time_s: float
    peak_memory_bytes: int
    d2h_bytes: int
    h2d_bytes: int
    recompute_time_s: float
    stall_copy_s: float
    """Compute idle, waiting for a copy back to finish."""
    stall_memory_s: float
    """Compute idle, waiting for memory to be freed."""
    events: tuple[Event, ...] = ()
    memory: tuple[tuple[float, int], ...] = ()
    """(time_s, bytes in use) after every change of the saved-activation memory."""

    @property
    def throughput_pct(self) -> float:
        return 100.0 * self.ideal_step_time_s / self.step_time_s if self.step_time_s > 0 else 100.0

    @property
    def stall_time_s(self) -> float:
        return self.stall_copy_s + self.stall_memory_s

    def summary(self) -> dict[str, Any]:
        """The figures `slackswap simulate --json` prints."""
        return {
            "workload": self.workload_name, "hardware": self.hardware_name, "policy": self.policy,
            "step_time_s": self.step_time_s, "ideal_step_time_s": self.ideal_step_time_s,
            "throughput_pct": self.throughput_pct, "peak_memory_bytes": self.peak_memory_bytes,
            "budget_bytes": self.budget_bytes, "d2h_bytes": self.d2h_bytes, "h2d_bytes": self.h2d_bytes,
            "recompute_time_s": self.recompute_time_s, "stall_time_s": self.stall_time_s,
            "stall_copy_s": self.stall_copy_s, "stall_memory_s": self.stall_memory_s,
        }

    def to_dict(self) -> dict[str, Any]:
        data = {"format": TIMELINE_FORMAT, **self.summary()}
        del data["throughput_pct"], data["stall_time_s"]
        data["events"] = [[e.stream, e.kind, e.name, e.start_s, e.end_s, e.size_bytes, e.step] for e in self.events]
        data["memory"] = [[t, b] for t, b in self.memory]
        return data

    def save(self, path) -> None:
        write_text_atomic(path, json.dumps(self.to_dict()) + "\n")

    @classmethod
    def from_dict(cls, data: Any) -> "Timeline":
        f = Fields(data, "timeline")
        fmt = f.str("format", default=TIMELINE_FORMAT)
        if fmt != TIMELINE_FORMAT:
            raise ValidationError(f"timeline.format is {fmt!r}, expected {TIMELINE_FORMAT!r}")
        budget = f.obj.get("budget_bytes")
        f.used.add("budget_bytes")
        if budget is not None:
            budget = f.int("budget_bytes", positive=True)
        events = [_event(row, i) for i, row in enumerate(f.list("events"))]
        memory = []
        for i, row in enumerate(f.list("memory")):
            if not (isinstance(row, list) and len(row) == 2):
                raise ValidationError(f"timeline.memory[{i}] must be [time_s, bytes]")
            point = Fields(dict(zip(("time_s", "bytes"), row)), f"timeline.memory[{i}]")
            memory.append((point.number("time_s"), point.int("bytes")))
        timeline = cls(
            workload_name=f.str("workload"), hardware_name=f.str("hardware"), policy=f.str("policy"),
            budget_bytes=budget, step_time_s=f.number("step_time_s"), ideal_step_time_s=f.number("ideal_step_time_s"),
            peak_memory_bytes=f.int("peak_memory_bytes"), d2h_bytes=f.int("d2h_bytes"), h2d_bytes=f.int("h2d_bytes"),
            recompute_time_s=f.number("recompute_time_s"), stall_copy_s=f.number("stall_copy_s"),
            stall_memory_s=f.number("stall_memory_s"), events=tuple(events), memory=tuple(memory),
        )
        f.no_extra()
        return timeline

    @classmethod
    def load(cls, path) -> "Timeline":
        return cls.from_dict(read_json_file(path, "timeline"))


_EVENT_FIELDS = ("stream", "kind", "name", "start_s", "end_s", "size_bytes", "step")


def _event(row: Any, i: int) -> Event:
    where = f"timeline.events[{i}]"
    if not (isinstance(row, list) and len(row) == len(_EVENT_FIELDS)):
        raise ValidationError(f"{where} must be [{', '.join(_EVENT_FIELDS)}]")
    f = Fields(dict(zip(_EVENT_FIELDS, row)), where)
    stream, kind = f.str("stream"), f.str("kind")
    if stream not in STREAMS:
        raise ValidationError(f"{where}.stream is {stream!r}: use one of {', '.join(STREAMS)}")
    if kind not in EVENT_KINDS:
        raise ValidationError(f"{where}.kind is {kind!r}: use one of {', '.join(EVENT_KINDS)}")
    start_s, end_s = f.number("start_s"), f.number("end_s")
    if end_s < start_s:
        raise ValidationError(f"{where} ends at {end_s!r} s, before it starts at {start_s!r} s")
    return Event(stream, kind, f.str("name"), start_s, end_s, f.int("size_bytes"), f.int("step", minimum=-1))
