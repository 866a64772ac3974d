"""A model of PyTorch's CUDA caching allocator, replaying allocations and frees.

The rules are read from PyTorch's ``c10/cuda/CUDACachingAllocator.cpp`` (docs/memory.md
lists them with the constants' names there) under the default configuration: no
``max_split_size_mb``, no ``roundup_power2_divisions``, no garbage-collection threshold.

* A request is rounded up to a multiple of 512 B (``kMinBlockSize``), at least 512 B.
* Rounded requests up to 1 MiB (``kSmallSize``) use the small pool, larger ones the large pool.
* A request takes the smallest free block of its pool *and stream* that fits (best fit; equal
  sizes: the lower address).
* With no such block the allocator reserves a new segment: 2 MiB (``kSmallBuffer``) for a
  small request, 20 MiB (``kLargeBuffer``) for a large one below 10 MiB (``kMinLargeAlloc``),
  otherwise the request rounded up to 2 MiB (``kRoundLarge``).
* The block found is split when the rest is worth keeping: in the small pool when at least
  512 B remain, in the large pool when more than 1 MiB remains; otherwise the whole block is
  handed out (and counts as allocated).
* A freed block merges with its free neighbours in the same segment. A block freed while
  another stream still uses it returns to the pool only once that stream's event has
  completed (``record_stream``; the allocator polls events at each allocation).
* When a new segment does not fit the device, every free, unsplit segment is released
  (``release_cached_blocks``) and the allocation is tried again; then it is out of memory.
* ``expandable_segments``: one segment per pool and stream that grows by mapping pages
  (2 MiB in the small pool, 20 MiB in the large pool) at its end; any free block may be split
  down to 512 B. On out of memory the free pages at the end of each segment are unmapped.

Segments get increasing addresses in the order they are reserved (cudaMalloc's addresses are
not known here), which only decides ties in best fit.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Iterable

from ..errors import ValidationError
from ..units import MiB

MIN_BLOCK_BYTES = 512  # kMinBlockSize
SMALL_SIZE_BYTES = 1 * MiB  # kSmallSize: largest small request
SMALL_BUFFER_BYTES = 2 * MiB  # kSmallBuffer: small-pool segment (and expandable page)
LARGE_BUFFER_BYTES = 20 * MiB  # kLargeBuffer: segment for 1-10 MiB requests (and expandable page)
MIN_LARGE_ALLOC_BYTES = 10 * MiB  # kMinLargeAlloc
ROUND_LARGE_BYTES = 2 * MiB  # kRoundLarge


def round_size(size_bytes: int) -> int:
    """A request rounded as the allocator rounds it (round_size)."""
    if size_bytes < MIN_BLOCK_BYTES:
        return MIN_BLOCK_BYTES
    return -(-size_bytes // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES


def segment_size(rounded_bytes: int) -> int:
    """Bytes reserved for a new segment serving a rounded request (get_allocation_size)."""
    if rounded_bytes <= SMALL_SIZE_BYTES:
        return SMALL_BUFFER_BYTES
    if rounded_bytes < MIN_LARGE_ALLOC_BYTES:
        return LARGE_BUFFER_BYTES
    return -(-rounded_bytes // ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES


class AllocatorOutOfMemory(Exception):
    """Raised inside the model when a request cannot be served within the device capacity."""

    def __init__(self, key: str, size_bytes: int, reserved_bytes: int, capacity_bytes: int) -> None:
        super().__init__(key)
        self.key = key
        self.size_bytes = size_bytes
        self.reserved_bytes = reserved_bytes
        self.capacity_bytes = capacity_bytes


@dataclass(slots=True, eq=False)
class _Block:
    segment: "_Segment"
    address: int
    size: int
    allocated: bool = False
    prev: "_Block | None" = None
    next: "_Block | None" = None


@dataclass(slots=True, eq=False)
class _Segment:
    small: bool
    stream: str
    base: int
    size: int
    """Bytes reserved (mapped, for an expandable segment)."""
    expandable: bool
    head: _Block | None = None


@dataclass(frozen=True, slots=True)
class AllocatorStats:
    """Peaks of one replay, in bytes, with the counts PyTorch's memory_stats also reports."""

    requested_peak_bytes: int
    """Largest sum of the live requests as asked (before rounding)."""
    allocated_peak_bytes: int
    """Largest sum of the live blocks (rounded and unsplit remainders included): memory_allocated."""
    reserved_peak_bytes: int
    """Largest sum of the segments: memory_reserved."""
    segments_reserved: int
    """Segments reserved (cudaMalloc calls, or page-mapping calls with expandable segments)."""
    segments_released: int
    out_of_memory: bool = False

    @property
    def fragmentation_bytes(self) -> int:
        """Reserved bytes above the allocated peak."""
        return self.reserved_peak_bytes - self.allocated_peak_bytes

    @property
    def fragmentation(self) -> float:
        """fragmentation_bytes as a fraction of the reserved peak."""
        return self.fragmentation_bytes / self.reserved_peak_bytes if self.reserved_peak_bytes else 0.0

    def to_dict(self) -> dict:
        return {
            "requested_peak_bytes": self.requested_peak_bytes, "allocated_peak_bytes": self.allocated_peak_bytes,
            "reserved_peak_bytes": self.reserved_peak_bytes, "fragmentation_bytes": self.fragmentation_bytes,
            "fragmentation": self.fragmentation, "segments_reserved": self.segments_reserved,
            "segments_released": self.segments_released, "out_of_memory": self.out_of_memory,
        }


class CachingAllocator:
    """The allocator's state: segments, free blocks by pool and stream, live blocks by key."""

    def __init__(self, *, expandable_segments: bool = False, capacity_bytes: int | None = None) -> None:
        self.expandable = bool(expandable_segments)
        self.capacity = capacity_bytes
        # (small, stream) -> sorted [(size, address, id(block))] of free blocks, and the blocks.
        self._free: dict[tuple[bool, str], list[tuple[int, int, int]]] = {}
        self._free_blocks: dict[int, _Block] = {}
        self._segments: list[_Segment] = []
        self._expandable: dict[tuple[bool, str], _Segment] = {}
        self._live: dict[str, tuple[_Block, int]] = {}
        self._pending: list[tuple[float, int, str]] = []  # (ready_s, order, key) of deferred frees
        self._order = 0
        self._next_base = 0
        self.requested = self.allocated = self.reserved = 0
        self.requested_peak = self.allocated_peak = self.reserved_peak = 0
        self.segments_reserved = self.segments_released = 0

    # ---- free lists ---------------------------------------------------------------------
    def _insert_free(self, block: _Block) -> None:
        seg = block.segment
        bisect.insort(self._free.setdefault((seg.small, seg.stream), []), (block.size, block.address, id(block)))
        self._free_blocks[id(block)] = block

    def _remove_free(self, block: _Block) -> None:
        seg = block.segment
        entries = self._free[(seg.small, seg.stream)]
        i = bisect.bisect_left(entries, (block.size, block.address, id(block)))
        del entries[i]
        del self._free_blocks[id(block)]

    def _best_fit(self, small: bool, stream: str, size: int) -> _Block | None:
        entries = self._free.get((small, stream))
        if not entries:
            return None
        i = bisect.bisect_left(entries, (size, -1, -1))
        return self._free_blocks[entries[i][2]] if i < len(entries) else None

    # ---- segments -------------------------------------------------------------------------
    def _fits_device(self, extra: int) -> bool:
        return self.capacity is None or self.reserved + extra <= self.capacity

    def _reserve(self, nbytes: int) -> None:
        self.reserved += nbytes
        self.reserved_peak = max(self.reserved_peak, self.reserved)
        self.segments_reserved += 1

    def _new_segment(self, small: bool, stream: str, size: int) -> _Block | None:
        nbytes = segment_size(size)
        if not self._fits_device(nbytes):
            return None
        seg = _Segment(small, stream, self._next_base, nbytes, expandable=False)
        self._next_base += nbytes
        seg.head = _Block(seg, seg.base, nbytes)
        self._segments.append(seg)
        self._reserve(nbytes)
        return seg.head

    def _grow_expandable(self, small: bool, stream: str, size: int) -> _Block | None:
        """Map pages at the end of the pool's segment so that its free tail holds ``size``."""
        page = SMALL_BUFFER_BYTES if small else LARGE_BUFFER_BYTES
        seg = self._expandable.get((small, stream))
        if seg is None:
            seg = _Segment(small, stream, self._next_base, 0, expandable=True)
            # The address space reserved is far larger than any device; space segments apart.
            self._next_base += 1 << 50
            self._segments.append(seg)
            self._expandable[(small, stream)] = seg
        tail = self._tail(seg)
        have = tail.size if tail is not None and not tail.allocated else 0
        add = -(-(size - have) // page) * page
        if not self._fits_device(add):
            return None
        self._reserve(add)
        seg.size += add
        if have:
            self._remove_free(tail)
            tail.size += add
            return tail
        block = _Block(seg, seg.base + seg.size - add, add, prev=tail)
        if tail is None:
            seg.head = block
        else:
            tail.next = block
        return block

    @staticmethod
    def _tail(seg: _Segment) -> _Block | None:
        block = seg.head
        while block is not None and block.next is not None:
            block = block.next
        return block

    def _release_cached(self) -> None:
        """release_cached_blocks: give back every free, unsplit segment; with expandable
        segments, unmap the whole free pages at the end of each segment."""
        for seg in list(self._segments):
            head = seg.head
            if seg.expandable:
                tail = self._tail(seg)
                if tail is None or tail.allocated:
                    continue
                page = SMALL_BUFFER_BYTES if seg.small else LARGE_BUFFER_BYTES
                start = -(-(tail.address - seg.base) // page) * page + seg.base
                drop = seg.base + seg.size - start
                if drop <= 0:
                    continue
                self._remove_free(tail)
                tail.size -= drop
                seg.size -= drop
                self.reserved -= drop
                self.segments_released += 1
                if tail.size:
                    self._insert_free(tail)
                elif tail.prev is None:
                    seg.head = None
                else:
                    tail.prev.next = None
                continue
            if head is not None and not head.allocated and head.next is None:
                self._remove_free(head)
                self._segments.remove(seg)
                self.reserved -= seg.size
                self.segments_released += 1

    # ---- public operations -------------------------------------------------------------------
    def malloc(self, key: str, size_bytes: int, *, stream: str = "compute", now_s: float = 0.0) -> None:
        """Allocate ``size_bytes`` for ``key`` on ``stream``; raises AllocatorOutOfMemory."""
        if key in self._live:
            raise ValidationError(f"allocation {key!r} is already live: free it before allocating it again")
        self._process_events(now_s)
        size = round_size(size_bytes)
        small = size <= SMALL_SIZE_BYTES
        block = self._best_fit(small, stream, size)
        if block is not None:
            self._remove_free(block)
        else:
            grow = self._grow_expandable if self.expandable else self._new_segment
            block = grow(small, stream, size)
            if block is None:
                self._release_cached()
                block = grow(small, stream, size)
            if block is None:
                raise AllocatorOutOfMemory(key, size_bytes, self.reserved, int(self.capacity or 0))
        remaining = block.size - size
        split = remaining >= MIN_BLOCK_BYTES if (small or self.expandable) else remaining > SMALL_SIZE_BYTES
        if split:
            rest = _Block(block.segment, block.address + size, remaining, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self._insert_free(rest)
        block.allocated = True
        self._live[key] = (block, size_bytes)
        self.requested += size_bytes
        self.allocated += block.size
        self.requested_peak = max(self.requested_peak, self.requested)
        self.allocated_peak = max(self.allocated_peak, self.allocated)

    def free(self, key: str, *, ready_s: float | None = None, now_s: float = 0.0) -> None:
        """Free ``key``. With ``ready_s`` later than ``now_s`` (another stream's event), the block
        stays unavailable until the first allocation at or after ``ready_s``."""
        if key not in self._live:
            raise ValidationError(f"free of {key!r}, which is not allocated")
        if ready_s is not None and ready_s > now_s:
            self._pending.append((ready_s, self._order, key))
            self._order += 1
            return
        self._release(key)

    def _process_events(self, now_s: float) -> None:
        if not self._pending:
            return
        due = sorted(p for p in self._pending if p[0] <= now_s)
        if due:
            self._pending = [p for p in self._pending if p[0] > now_s]
            for _, _, key in due:
                self._release(key)

    def _release(self, key: str) -> None:
        block, requested = self._live.pop(key)
        self.requested -= requested
        self.allocated -= block.size
        block.allocated = False
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated and id(neighbour) in self._free_blocks:
                self._remove_free(neighbour)
                if neighbour is block.prev:
                    neighbour.size += block.size
                    neighbour.next = block.next
                    if block.next is not None:
                        block.next.prev = neighbour
                    block = neighbour
                else:
                    block.size += neighbour.size
                    block.next = neighbour.next
                    if neighbour.next is not None:
                        neighbour.next.prev = block
        self._insert_free(block)

    def stats(self, *, out_of_memory: bool = False) -> AllocatorStats:
        return AllocatorStats(
            requested_peak_bytes=self.requested_peak, allocated_peak_bytes=self.allocated_peak,
            reserved_peak_bytes=self.reserved_peak, segments_reserved=self.segments_reserved,
            segments_released=self.segments_released, out_of_memory=out_of_memory,
        )


@dataclass(frozen=True, slots=True)
class Allocation:
    """One step of an allocation trace: ``malloc`` of ``size_bytes`` on ``stream``, or ``free``
    (returned to the pool at ``ready_s`` when another stream still uses the block)."""

    kind: str
    key: str
    time_s: float = 0.0
    size_bytes: int = 0
    stream: str = "compute"
    ready_s: float | None = None


def replay(
    trace: Iterable[Allocation], *, expandable_segments: bool = False, capacity_bytes: int | None = None,
) -> AllocatorStats:
    """Replay ``trace`` in order through a fresh allocator. With ``capacity_bytes``, a request
    that cannot be served stops the replay and the stats say ``out_of_memory``."""
    allocator = CachingAllocator(expandable_segments=expandable_segments, capacity_bytes=capacity_bytes)
    for step in trace:
        if step.kind == "malloc":
            try:
                allocator.malloc(step.key, step.size_bytes, stream=step.stream, now_s=step.time_s)
            except AllocatorOutOfMemory:
                return allocator.stats(out_of_memory=True)
        elif step.kind == "free":
            allocator.free(step.key, ready_s=step.ready_s, now_s=step.time_s)
        else:
            raise ValidationError(f"allocation trace step kind {step.kind!r}: use 'malloc' or 'free'")
    return allocator.stats()
