"""Copy timing for planning: when swapped tensors can leave and come back.

Both checks model the simulator's streams: one device-to-host (D2H) copy at a time, in
production order, each starting when its tensor is made and the previous copy is done;
one host-to-device (H2D) copy at a time in backward. Each copy costs the per-copy
latency plus its bytes over the link bandwidth.
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
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
    """The swaps accepted so far, with both streams walked once for them, so that trying one more
    tensor walks only the copies it moves (the accepted-swap list of `slackswap` tries every
    candidate; a full walk per try made that quadratic in the model's size). ``fits(name)``
    answers what ``round_trip_fits(facts, hardware, booked + [name], out_deadline_s=...)``
    answers (tests/test_planners.py compares them).

    Inserting a copy can only delay the copies after it on either stream. The copy-out walk stops
    at the first copy that ends exactly when it did before (same start, same inputs after it: the
    same floats to the end). The copy-back walk stops there too once it is past every copy whose
    copy out moved, and past the slowed start of backward (the duplex tail) when the last copy out
    moved; or, in a busy stream where the delay does not die out, once the delay is smaller than
    the least slack left after it (a delay never grows past that point), with a margin of
    MARGIN_FRACTION of the step for the order of float roundings."""

    MARGIN_FRACTION = 1e-9

    def __init__(self, facts: Facts, hardware: Hardware, names: Iterable[str] = ()) -> None:
        self.facts = facts
        self.hardware = hardware
        self.margin_s = self.MARGIN_FRACTION * (facts.forward_time_s + max(facts.first_use_s.values(), default=0.0))
        self._build(list(names))

    def _keys(self, name: str) -> tuple[tuple[int, str], tuple[float, str]]:
        return (self.facts.production_order[name], name), (self.facts.first_use_s[name], name)

    def _build(self, names: list[str]) -> None:
        """Both streams walked in full for ``names``."""
        facts, hw = self.facts, self.hardware
        latency, d2h, made_at, size = hw.copy_latency_s, hw.d2h_bytes_per_s, facts.produced_at_s, facts.size
        self.by_made = sorted(self._keys(n)[0] for n in names)
        self.out_end_s: list[float] = []  # copy-out ends, in by_made order
        self.out_waits = bytearray()  # 1 where a copy out waits for its tensor, in by_made order
        free_at = 0.0
        for _, name in self.by_made:
            self.out_waits.append(made_at[name] > free_at)
            free_at = max(free_at, made_at[name]) + latency + size[name] / d2h
            self.out_end_s.append(free_at)
        self.end_of = {name: end for (_, name), end in zip(self.by_made, self.out_end_s)}
        self.out_transfer_s = [size[name] / d2h for _, name in self.by_made]  # in by_made order
        forward_s = facts.forward_time_s
        self.tail_s = max(0.0, free_at - forward_s) if names else 0.0  # the last copy out's run into backward
        self.by_use = sorted(self._keys(n)[1] for n in names)
        self.back_end_s: list[float] = []  # copy-back ends, in by_use order
        self.waits = bytearray()  # 1 where a copy back waits for its copy out, in by_use order
        now = 0.0
        for _, name in self.by_use:
            ready_s = self.end_of[name] - forward_s
            self.waits.append(ready_s > now)
            now = self._copy_back(now, ready_s, name, self.tail_s)
            self.back_end_s.append(now)
        # Per copy back in by_use order: its first use, and its bytes over the full H2D rate.
        self.use_s = [facts.first_use_s[name] for _, name in self.by_use]
        self.transfer_s = [float(size[name]) / hw.h2d_bytes_per_s for _, name in self.by_use]
        self.late = bytearray(map(operator.gt, self.back_end_s, self.use_s))
        self.slack_after = [math.inf] * (len(names) + 1)  # least (first use - landing) from each position on
        self._update_slack(len(names))

    def _update_slack(self, upto: int, start: int = 0, was_s: float = -math.inf) -> None:
        """slack_after after the landings on ``start`` .. ``upto - 1`` changed; ``was_s``: the least
        slack from ``start`` on before. A commit only delays landings (and adds one), so the least
        slack from ``start`` on can only shrink: each one before ``start`` (a least slack, not above
        the ones after it) becomes the smaller of what it was and the new one from ``start`` on."""
        slack_after = self.slack_after
        slack = list(map(operator.sub, self.use_s[start:upto], self.back_end_s[start:upto]))
        running = list(itertools.accumulate(reversed(slack), min, initial=slack_after[upto]))
        slack_after[start:upto] = running[:0:-1]
        now_s = slack_after[start]
        if now_s > was_s:  # not a shrink (or no record of it): from the start
            if start:
                self._update_slack(start)
            return
        above = bisect.bisect_right(slack_after, now_s, 0, start)
        slack_after[above:start] = [now_s] * (start - above)

    def _copy_back(self, now: float, ready_s: float, name: str, tail_s: float) -> float:
        """When the copy back of ``name`` lands: after ``now`` and its copy out (``ready_s``, in
        backward time), at the duplex-slowed rate until ``tail_s``."""
        hw = self.hardware
        full = hw.h2d_bytes_per_s
        slow = full * hw.duplex_h2d_factor
        now = max(now, ready_s) + hw.copy_latency_s
        left = float(self.facts.size[name])
        if now < tail_s:
            slow_part = min(left, (tail_s - now) * slow)
            now += slow_part / slow
            left -= slow_part
        return now + left / full

    def add(self, name: str) -> None:
        self._walk(name, None, commit=True)

    def fits(self, name: str, *, out_deadline_s: float | None) -> bool:
        return self._walk(name, out_deadline_s, commit=False)

    LOWER_BOUND_COPIES = 16

    def _clearly_late_before(self, pos: int, own_end: float, use_key: tuple[float, str]) -> bool:
        """Without a deadline the copy-out walk runs to the end of a busy stream, only to learn how
        far the last copy out now runs into backward (the duplex tail), and the copy-back walk then
        starts from the first copy back. Answered first from lower bounds: the last copy out ends no
        earlier than recorded, nor, when no copy out after the new one waits for its tensor, earlier
        than recorded plus the whole delay; every copy back before the new one is ready no earlier
        than recorded. A copy back among the first LOWER_BOUND_COPIES that lands clearly late even
        then is late in the exact walk too, which would answer no on reaching it (it answers yes
        only past the new copy); a landing only grows with its start, its ready time and the tail."""
        out_end = self.out_end_s
        forward_s = self.facts.forward_time_s
        margin = self.margin_s
        last_out_s = max(out_end[-1], own_end) if out_end else own_end
        if pos < len(out_end) and pos >= self.out_waits.rfind(1) + 1:
            delay = own_end - (out_end[pos - 1] if pos else 0.0)
            last_out_s = max(last_out_s, out_end[-1] + delay - margin)
        tail_s = max(0.0, last_out_s - forward_s)
        if tail_s <= self.tail_s:
            return False  # no later tail than recorded: the exact walk's own shortcuts answer
        first_use, end_of = self.facts.first_use_s, self.end_of
        now = 0.0
        for _, other in self.by_use[:min(bisect.bisect_left(self.by_use, use_key), self.LOWER_BOUND_COPIES)]:
            now = self._copy_back(now, end_of[other] - forward_s, other, tail_s)
            if now > first_use[other] + margin:
                return True
        return False

    def _walk(self, name: str, out_deadline_s: float | None, *, commit: bool) -> bool:
        facts, hw = self.facts, self.hardware
        made_key, use_key = self._keys(name)
        latency = hw.copy_latency_s
        d2h = hw.d2h_bytes_per_s
        made_at, size = facts.produced_at_s, facts.size
        # Copies out, FIFO in production order, from the new one until the delay dies out.
        by_made, out_end = self.by_made, self.out_end_s
        pos = bisect.bisect_left(by_made, made_key)
        free_at = out_end[pos - 1] if pos else 0.0
        out_waited = bytearray((made_at[name] > free_at,))
        free_at = own_end = max(free_at, made_at[name]) + latency + size[name] / d2h
        moved: dict[str, float] = {name: own_end}
        forward_s = facts.forward_time_s
        if out_deadline_s is None and not commit and self._clearly_late_before(pos, own_end, use_key):
            return False
        count = len(by_made)
        # From here on no recorded copy out waits for its tensor: the delay reaches the last one whole.
        plain_after = self.out_waits.rfind(1) + 1
        margin = self.margin_s
        i = pos
        last_out_s = None
        out_waits, out_transfer = self.out_waits, self.out_transfer_s
        stretch = 8
        while i < count:
            if i >= plain_after and i > pos and out_deadline_s is not None and not commit:
                late_by = out_end[-1] + (free_at - out_end[i - 1])
                if late_by > out_deadline_s + margin:
                    return False
                if late_by < min(out_deadline_s, forward_s) - margin:
                    # Every copy out still ends in forward, so no copy back waits for one and
                    # backward starts at the full rate: their exact ends do not matter.
                    last_out_s = -math.inf
                    break
            waited_at = out_waits.find(1, i, i + stretch)
            stretch_end = i + stretch if waited_at < 0 else waited_at
            stretch *= 2  # a delay often dies out within a few copies: walk a doubling stretch at a time
            if stretch_end > i:
                # Copies i .. stretch_end - 1 did not wait for their tensors, nor do they now (they
                # start later): each ends its latency and transfer after the one before (the
                # arithmetic of the step below without its branches), up to the first end as recorded.
                ends = list(itertools.accumulate(out_transfer[i:stretch_end], lambda t, x: t + latency + x,
                                                 initial=free_at))
                del ends[0]
                same = bytes(map(operator.eq, ends, out_end[i:stretch_end])).find(1)
                if same >= 0:
                    del ends[same:]
                # A check needs only the copies out that now end after forward: a copy back waits
                # for no other (moved.get below falls back to the recorded end, also in forward).
                keep = 0 if commit else bisect.bisect_right(ends, forward_s)
                moved.update(zip(map(operator.itemgetter(1), by_made[i + keep:i + len(ends)]), ends[keep:]))
                out_waited += bytes(len(ends))
                i += len(ends)
                if ends:
                    free_at = ends[-1]
                if same >= 0:
                    break
                continue
            # Copy i waited for its tensor: it ends as recorded unless the delay outlasts the wait.
            other = by_made[i][1]
            out_waited.append(made_at[other] > free_at)
            end = max(free_at, made_at[other]) + latency + out_transfer[i]
            if end == out_end[i]:
                out_waited.pop()
                break
            free_at = moved[other] = end
            i += 1
        if last_out_s is None:
            last_out_s = out_end[-1] if i < count else free_at
        if out_deadline_s is not None and last_out_s > out_deadline_s:
            return False
        # Copies back, earliest first use first, from the first one whose inputs changed.
        tail_s = max(0.0, last_out_s - forward_s)
        by_use, back_end, late, slack_after = self.by_use, self.back_end_s, self.late, self.slack_after
        at = bisect.bisect_left(by_use, use_key)
        # A copy out that moved changes its copy back only if that now waits for it: it is ready
        # after the copy before it landed (which can only land later than recorded). The moved
        # ends grow in made order (FIFO, the new copy's first): only those that end after forward
        # (ready in backward) are looked at.
        moved_names, moved_ends = list(moved), list(moved.values())
        moved_at = []
        for m in range(bisect.bisect_right(moved_ends, forward_s, 1), len(moved_ends)):
            other, ready_s = moved_names[m], moved_ends[m] - forward_s
            k = bisect.bisect_left(by_use, (facts.first_use_s[other], other))
            if ready_s > (back_end[k - 1] if k else 0.0):
                moved_at.append(k)
        last_moved = max(moved_at, default=-1)
        start = 0 if tail_s != self.tail_s else min(moved_at + [at])
        if not commit and late.find(1, 0, start) >= 0:
            return False
        settled_s = max(tail_s, self.tail_s)
        # From here on no recorded copy back waits for its copy out: past the changes and the
        # duplex tail, the new landings are the recorded ones plus one delay.
        plain_after = self.waits.rfind(1) + 1
        first_use, end_of, waits = facts.first_use_s, self.end_of, self.waits
        now = back_end[start - 1] if start else 0.0
        walked: list[float] = []
        waited = bytearray()
        j = start
        count = len(by_use)
        while True:
            if j == at and len(walked) == j - start:
                other = name  # the new copy goes before the recorded one at its place
            elif j < count:
                other = by_use[j][1]
            else:
                break
            ready_s = moved.get(other, end_of.get(other, 0.0)) - forward_s
            waited.append(ready_s > now)
            now = self._copy_back(now, ready_s, other, tail_s)
            if now > first_use[other] and not commit:
                return False
            walked.append(now)
            if other is name:
                continue
            j += 1
            if j > at and j > last_moved and (now >= settled_s or tail_s == self.tail_s):
                if now == back_end[j - 1]:
                    break  # the same landing as recorded, past every change: the rest is as recorded
                plain = j >= plain_after and back_end[j - 1] >= settled_s
                if not commit:
                    delay = now - back_end[j - 1]
                    if slack_after[j] > delay + self.margin_s:
                        return True  # the delay, which can only shrink, fits every later copy's slack
                    if plain and slack_after[j] < delay - self.margin_s:
                        return False  # the delay stays whole, and a later copy has less slack
                elif plain:
                    # No wait and no slowed start left: each copy lands its latency and transfer
                    # after the one before (the arithmetic of _copy_back, without its branches).
                    rest = list(itertools.accumulate(self.transfer_s[j:], lambda t, x: t + latency + x, initial=now))
                    walked += rest[1:]
                    waited += bytes(count - j)
                    j = count
                    break
        if not commit:
            return slack_after[j] >= 0
        by_made.insert(pos, made_key)
        out_end.insert(pos, own_end)
        self.out_transfer_s.insert(pos, size[name] / d2h)
        out_end[pos + 1:pos + len(moved)] = itertools.islice(moved.values(), 1, None)  # moved is in made order
        self.out_waits[pos:pos + len(moved) - 1] = out_waited
        end_of.update(moved)
        by_use.insert(at, use_key)
        self.use_s.insert(at, first_use[name])
        self.transfer_s.insert(at, float(size[name]) / hw.h2d_bytes_per_s)
        back_end[start:j] = walked
        late[start:j] = bytearray(map(operator.gt, walked, self.use_s[start:start + len(walked)]))
        waits[start:j] = waited
        was_s = slack_after[start]
        slack_after.insert(at, 0.0)
        self._update_slack(start + len(walked), start, was_s)
        self.tail_s = tail_s
        return True
