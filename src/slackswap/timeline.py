"""Timeline: what the simulator saw during one training step."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from ._fields import (
    MAX_INT, Fields, check_int, check_number, check_text, json_float, json_int, placed, read_json_file, show,
    write_text_atomic,
)
from .errors import ValidationError

TIMELINE_FORMAT = "slackswap.timeline/1"

STREAMS = ("compute", "d2h", "h2d")
EVENT_KINDS = ("forward", "backward", "recompute", "copy_out", "copy_in", "stall_copy", "stall_memory")
_EVENT_WHERE = "event"


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

    def __post_init__(self) -> None:
        # The simulator makes thousands per step: accept the plain valid case in one expression,
        # and let _check_event name the problem (or accept an int for a float) otherwise.
        if not (self.stream in STREAMS and self.kind in EVENT_KINDS and type(self.name) is str and self.name
                and self.name.isascii() and type(self.start_s) is float and type(self.end_s) is float
                and 0.0 <= self.start_s <= self.end_s < math.inf and type(self.size_bytes) is int
                and 0 <= self.size_bytes <= MAX_INT and type(self.step) is int and -1 <= self.step <= MAX_INT):
            _check_event(self, _EVENT_WHERE)

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

    def __post_init__(self) -> None:
        _check_timeline(self)

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
        """The timeline in ``data`` (JSON as ``to_dict`` writes it); the constructor checks the values."""
        f = Fields(data, "timeline")
        fmt = f.str("format", default=TIMELINE_FORMAT)
        if fmt != TIMELINE_FORMAT:
            raise ValidationError(f"timeline.format is {fmt!r}, expected {TIMELINE_FORMAT!r}")
        budget = f.obj.get("budget_bytes")
        f.used.add("budget_bytes")
        events = [_event(row, i) for i, row in enumerate(f.list("events"))]
        memory = []
        for i, row in enumerate(f.list("memory")):
            if not (isinstance(row, list) and len(row) == 2):
                raise ValidationError(f"timeline.memory[{i}] must be [time_s, bytes]")
            memory.append((json_float(row[0]), json_int(row[1])))
        values = {key: f.raw(key) for key in _TIMELINE_KEYS}
        f.no_extra()
        return cls(
            workload_name=values["workload"], hardware_name=values["hardware"], policy=values["policy"],
            budget_bytes=json_int(budget), events=tuple(events), memory=tuple(memory),
            **{key: json_int(values[key]) for key in _INT_KEYS},
            **{key: json_float(values[key]) for key in _SECONDS_KEYS},
        )

    @classmethod
    def load(cls, path) -> "Timeline":
        return cls.from_dict(read_json_file(path, "timeline"))


_EVENT_FIELDS = ("stream", "kind", "name", "start_s", "end_s", "size_bytes", "step")
_SECONDS_KEYS = ("step_time_s", "ideal_step_time_s", "recompute_time_s", "stall_copy_s", "stall_memory_s")
_INT_KEYS = ("peak_memory_bytes", "d2h_bytes", "h2d_bytes")
_TIMELINE_KEYS = ("workload", "hardware", "policy") + _SECONDS_KEYS + _INT_KEYS


def _event(row: Any, i: int) -> Event:
    where = f"timeline.events[{i}]"
    if not (isinstance(row, list) and len(row) == len(_EVENT_FIELDS)):
        raise ValidationError(f"{where} must be [{', '.join(_EVENT_FIELDS)}]")
    stream, kind, name, start_s, end_s, size_bytes, step = row
    try:
        return Event(stream, kind, name, json_float(start_s), json_float(end_s), json_int(size_bytes),
                     json_int(step))
    except ValidationError as exc:  # the constructor's message, placed in the file
        raise placed(exc, _EVENT_WHERE, where) from None


def _check_event(e: Event, where: str) -> None:
    """What an Event must hold, for the constructor and (through it) the loader."""
    if e.stream not in STREAMS:
        raise ValidationError(f"{where}.stream is {show(e.stream)}: use one of {', '.join(STREAMS)}")
    if e.kind not in EVENT_KINDS:
        raise ValidationError(f"{where}.kind is {show(e.kind)}: use one of {', '.join(EVENT_KINDS)}")
    check_text(e.name, f"{where}.name")
    check_number(e.start_s, f"{where}.start_s")
    check_number(e.end_s, f"{where}.end_s")
    if e.end_s < e.start_s:
        raise ValidationError(f"{where} ends at {e.end_s!r} s, before it starts at {e.start_s!r} s")
    check_int(e.size_bytes, f"{where}.size_bytes")
    check_int(e.step, f"{where}.step", minimum=-1)


def _check_timeline(t: Timeline) -> None:
    """What a Timeline must hold, for the constructor and the loader alike (named by the file's keys)."""
    for key, value in (("workload", t.workload_name), ("hardware", t.hardware_name), ("policy", t.policy)):
        check_text(value, f"timeline.{key}")
    if t.budget_bytes is not None:
        check_int(t.budget_bytes, "timeline.budget_bytes", minimum=1)
    for key in _SECONDS_KEYS:
        check_number(getattr(t, key), f"timeline.{key}")
    for key in _INT_KEYS:
        check_int(getattr(t, key), f"timeline.{key}")
    if not isinstance(t.events, tuple):
        raise ValidationError(f"timeline.events must be a tuple of Events, got {type(t.events).__name__}")
    for i, event in enumerate(t.events):
        if not isinstance(event, Event):
            raise ValidationError(f"timeline.events[{i}] must be an Event, got {show(event)}")
    if not isinstance(t.memory, tuple):
        raise ValidationError(f"timeline.memory must be a tuple of (time_s, bytes), got {type(t.memory).__name__}")
    if _plain_memory(t.memory):
        return
    for i, point in enumerate(t.memory):
        if not (isinstance(point, tuple) and len(point) == 2):
            raise ValidationError(f"timeline.memory[{i}] must be [time_s, bytes], got {show(point)}")
        check_number(point[0], f"timeline.memory[{i}].time_s")
        check_int(point[1], f"timeline.memory[{i}].bytes")


def _plain_memory(memory: tuple) -> bool:
    """True when every point passes the per-point checks of _check_timeline, tested a column at a
    time (the simulator makes thousands of points per step and planners simulate hundreds of
    steps); on False the per-point loop finds and names the first bad point."""
    if not memory:
        return True
    if set(map(type, memory)) != {tuple} or set(map(len, memory)) != {2}:
        return False
    times, sizes = zip(*memory)
    if not set(map(type, times)) <= {float, int} or set(map(type, sizes)) != {int}:
        return False
    try:
        finite = all(map(math.isfinite, times))
    except OverflowError:  # an integer beyond the float range: the loop names it
        return False
    return finite and min(times) >= 0 and min(sizes) >= 0 and max(sizes) <= MAX_INT
