"""Copy timing for planning: when swapped tensors can leave and come back.

Both checks model the simulator's streams: one device-to-host (D2H) copy at a time, in
production order, each starting when its tensor is made and the previous copy is done;
one host-to-device (H2D) copy at a time in backward. Each copy costs the per-copy
latency plus its bytes over the link bandwidth.
"""

from __future__ import annotations

import bisect
from typing import Iterable

from ..hardware import Hardware
from .common import Facts


def d2h_time_s(hardware: Hardware, size_bytes: int) -> float:
    return hardware.copy_latency_s + size_bytes / hardware.d2h_bytes_per_s


def d2h_finish_s(facts: Facts, hardware: Hardware, swapped: Iterable[str]) -> dict[str, float]:
    """When each swapped tensor's copy out ends, from the start of the step, if compute never waits."""
    order = facts.production_order
    free_at = 0.0
    ends: dict[str, float] = {}
    for name in sorted(swapped, key=order.__getitem__):
        start = max(free_at, facts.produced_at_s[name])
        free_at = ends[name] = start + d2h_time_s(hardware, facts.size[name])
    return ends


def h2d_hidden(facts: Facts, hardware: Hardware, swapped: Iterable[str], *, d2h_tail_s: float = 0.0) -> bool:
    """Can every copy back land before its first backward use?

    Copies run back to back from the start of backward, earliest first use first (the
    order that lands the most copies in time on one stream). While copies out still run
    (``d2h_tail_s`` into backward), the link runs at the duplex-slowed H2D rate.
    """
    return copies_back_land(facts, hardware, swapped, d2h_tail_s)


def copies_back_land(facts: Facts, hardware: Hardware, swapped: Iterable[str], d2h_tail_s: float,
                     ready_s: dict[str, float] | None = None) -> bool:
    """Walk the H2D stream from the start of backward, earliest first use first, each copy
    starting no earlier than ``ready_s[name]`` (its copy out's end, in backward time) and
    running at the duplex-slowed rate until ``d2h_tail_s``: does every copy land in time?"""
    full = hardware.h2d_bytes_per_s
    slow = full * hardware.duplex_h2d_factor
    now = 0.0
    for name in sorted(swapped, key=lambda n: (facts.first_use_s[n], n)):
        if ready_s is not None:
            now = max(now, ready_s[name])
        now += hardware.copy_latency_s
        size = float(facts.size[name])
        if now < d2h_tail_s:
            slow_part = min(size, (d2h_tail_s - now) * slow)
            now += slow_part / slow
            size -= slow_part
        now += size / full
        if now > facts.first_use_s[name]:
            return False
    return True


def round_trip_fits(facts: Facts, hardware: Hardware, swapped: Iterable[str],
                    *, out_deadline_s: float | None = None) -> bool:
    """Per-tensor slack windows: can every swapped tensor go out and come back in time?

    A tensor's window runs from the end of its producer to its first backward use. Copies
    out run FIFO in production order (d2h_finish_s) and must end by ``out_deadline_s``
    (from the step start; None: any time, spilling into backward); copies back run
    earliest-use first, each no earlier than its own copy out has ended, at the
    duplex-slowed rate while copies out are still running, and must land before first use.
    """
    swapped = list(swapped)
    if not swapped:
        return True
    ends = d2h_finish_s(facts, hardware, swapped)
    if out_deadline_s is not None and max(ends.values()) > out_deadline_s:
        return False
    forward_s = facts.forward_time_s
    tail_s = max(0.0, max(ends.values()) - forward_s)
    return copies_back_land(facts, hardware, swapped, tail_s, {n: end - forward_s for n, end in ends.items()})


class WindowBooking:
    """The swaps accepted so far, kept sorted for the two streams, so that trying one more
    tensor costs one pass over them instead of two sorts (the accepted-swap list of
    `slackswap` tries every candidate). ``fits(name)`` answers exactly what
    ``round_trip_fits(facts, hardware, booked + [name], out_deadline_s=...)`` answers."""

    def __init__(self, facts: Facts, hardware: Hardware, names: Iterable[str] = ()) -> None:
        self.facts = facts
        self.hardware = hardware
        self.by_made: list[tuple[int, str]] = []
        self.by_use: list[tuple[float, str]] = []
        for name in names:
            self.add(name)

    def _keys(self, name: str) -> tuple[tuple[int, str], tuple[float, str]]:
        return (self.facts.production_order[name], name), (self.facts.first_use_s[name], name)

    def add(self, name: str) -> None:
        made, use = self._keys(name)
        bisect.insort(self.by_made, made)
        bisect.insort(self.by_use, use)

    def fits(self, name: str, *, out_deadline_s: float | None) -> bool:
        facts, hw = self.facts, self.hardware
        made_key, use_key = self._keys(name)
        ends: dict[str, float] = {}
        free_at = 0.0
        latency = hw.copy_latency_s
        d2h = hw.d2h_bytes_per_s
        made_at, size = facts.produced_at_s, facts.size
        pos = bisect.bisect_left(self.by_made, made_key)
        for _, other in self.by_made[:pos] + [made_key] + self.by_made[pos:]:
            free_at = ends[other] = max(free_at, made_at[other]) + latency + size[other] / d2h
        if out_deadline_s is not None and free_at > out_deadline_s:
            return False
        forward_s = facts.forward_time_s
        tail_s = max(0.0, free_at - forward_s)
        full = hw.h2d_bytes_per_s
        slow = full * hw.duplex_h2d_factor
        first_use = facts.first_use_s
        now = 0.0
        pos = bisect.bisect_left(self.by_use, use_key)
        for _, other in self.by_use[:pos] + [use_key] + self.by_use[pos:]:
            now = max(now, ends[other] - forward_s) + latency
            left = float(size[other])
            if now < tail_s:
                slow_part = min(left, (tail_s - now) * slow)
                now += slow_part / slow
                left -= slow_part
            now += left / full
            if now > first_use[other]:
                return False
        return True
