"""Non-decreasing step functions on 0..cap held as their runs, for the knapsack of selection.py.

A staircase is ``(starts, values)``: ``values[i]`` holds from ``starts[i]`` up to the next start
(``starts[0]`` is 0). The knapsack's table over 4,000 byte units has a few dozen to a few hundred
runs on the built-in models, so adding one bundle of items walks the runs instead of every unit;
on models of hundreds of layers it fills up, and the knapsack goes on with the per-unit table
(``to_table``, ``add_to_table``), which computes the same values.
"""

from __future__ import annotations

import bisect
import math

Staircase = tuple[list[int], list[float]]


def value_at(stairs: Staircase, b: int) -> float:
    starts, values = stairs
    return values[bisect.bisect_right(starts, b) - 1]


def shifted(stairs: Staircase, w: int, c: float, cap: int, ceiling: float = math.inf) -> Staircase:
    """b -> stairs(max(0, b - w)) + c on 0..cap (the value ``stairs(b - w) + c`` as one addition),
    values over ``ceiling`` as infinity."""
    starts, values = stairs
    moved = [0] + [s + w for s in starts[1:] if s + w <= cap]
    moved_values = [v + c for v in values[:len(moved)]]
    if moved_values[-1] > ceiling:
        over = bisect.bisect_right(moved_values, ceiling)
        del moved[over + 1:], moved_values[over + 1:]
        moved_values[over] = math.inf
    return moved, moved_values


def held_from(stairs: Staircase, low: int) -> Staircase:
    """``stairs`` with its value at ``low`` held from 0 up to ``low`` too: the same from ``low`` on,
    for a caller that reads nothing below it."""
    starts, values = stairs
    i = bisect.bisect_right(starts, low) - 1
    if i <= 0:
        return stairs
    return [0] + starts[i + 1:], values[i:]


def lower_envelope(a: Staircase, b: Staircase) -> Staircase:
    """b -> min(a(b), b(b)), taking ``a``'s value unless ``b``'s is strictly lower (as ``if new <
    old: table[b] = new`` does); equal neighbouring runs are merged."""
    sa, va = a
    sb, vb = b
    end = sa[-1] + sb[-1] + 1  # past every start
    ends_a = sa[1:]  # each run's end: the next run's start, ``end`` for the last
    ends_a.append(end)
    ends_b = sb[1:]
    ends_b.append(end)
    x, y = va[0], vb[0]
    last = y if y < x else x
    starts, values = [0], [last]
    i = j = 0
    next_a, next_b = ends_a[0], ends_b[0]
    while True:
        if next_a < next_b:
            at = next_a
            i += 1
            next_a = ends_a[i]
        elif next_b < next_a:
            at = next_b
            j += 1
            next_b = ends_b[j]
        elif next_a == end:
            return starts, values
        else:
            at = next_a
            i += 1
            j += 1
            next_a, next_b = ends_a[i], ends_b[j]
        x, y = va[i], vb[j]
        v = y if y < x else x
        if v != last:
            starts.append(at)
            values.append(v)
            last = v


def to_table(stairs: Staircase, cap: int) -> list[float]:
    """The value at every unit 0..cap."""
    starts, values = stairs
    table: list[float] = []
    for i, v in enumerate(values):
        end = starts[i + 1] if i + 1 < len(starts) else cap + 1
        table.extend([v] * (end - starts[i]))
    return table


def add_to_table(table: list[float], w: int, c: float, low: int = 0, ceiling: float = math.inf) -> None:
    """``table`` (in place) -> min(table(b), table(max(0, b - w)) + c), every read from the table
    before the change (one bundle of a 0-1 knapsack); the new value only where strictly lower.
    Only at ``low`` and above: below it the table is left as it was, for a caller that reads
    nothing there. And only where the new value is at most ``ceiling``: a value over it is left
    as it was, for a caller to whom every value over it is the same (the table must be
    non-decreasing from ``low - w`` on, exact up to ``ceiling`` and over it beyond)."""
    cap = len(table) - 1
    stop = max(w, low - 1)  # the first loop's last unit is stop + 1
    if ceiling < math.inf and stop < cap:
        # Units whose shorter value plus c is over the ceiling start at `over` + w.
        over = bisect.bisect_right(table, ceiling, max(0, stop + 1 - w), cap - w + 1, key=lambda v: v + c)
        top = min(cap, over - 1 + w)
    else:
        top = cap
    if top > stop:
        for b, shorter, current in zip(range(top, stop, -1), table[top - w:stop - w:-1], table[top:stop:-1]):
            if shorter + c < current:
                table[b] = shorter + c
    base = table[0] + c  # the bundle alone covers every need up to w
    if base <= ceiling:
        for b in range(min(w, cap), max(0, low - 1), -1):
            if base < table[b]:
                table[b] = base


def value_of(stairs_or_table: Staircase | list[float], b: int) -> float:
    if isinstance(stairs_or_table, list):
        return stairs_or_table[b]
    return value_at(stairs_or_table, b)
