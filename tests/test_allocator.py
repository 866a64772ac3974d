"""The caching-allocator model (slackswap.memory.allocator) on hand-worked traces.

Every expected figure follows from the rules in docs/memory.md (read from PyTorch's
c10/cuda/CUDACachingAllocator.cpp); the comment above each assertion works it out.
"""

from __future__ import annotations

import pytest

from slackswap.errors import ValidationError
from slackswap.memory.allocator import Allocation, CachingAllocator, replay, round_size, segment_size

MiB = 1024**2


def malloc(key, size, stream="compute", t=0.0):
    return Allocation("malloc", key, t, size, stream)


def free(key, t=0.0, ready_s=None):
    return Allocation("free", key, t, ready_s=ready_s)


def test_rounding_and_segment_sizes():
    assert [round_size(n) for n in (1, 512, 513, 1000)] == [512, 512, 1024, 1024]
    assert segment_size(512) == segment_size(MiB) == 2 * MiB  # small pool: 2 MiB segments
    assert segment_size(MiB + 512) == segment_size(10 * MiB - 512) == 20 * MiB  # 1-10 MiB: 20 MiB
    assert segment_size(10 * MiB) == 10 * MiB and segment_size(10 * MiB + 512) == 12 * MiB  # rounded to 2 MiB


def test_small_pool_packs_requests_into_2_mib_segments():
    stats = replay([malloc("a", 1), malloc("b", MiB), malloc("c", MiB)])
    # a: 512 B in a new 2 MiB segment (split: 2 MiB - 512 remains). b: 1 MiB fits that remainder
    # and splits it (1 MiB - 512 B remains, >= 512). c: 1 MiB does not fit 1 MiB - 512: a second segment.
    assert stats.allocated_peak_bytes == 512 + 2 * MiB
    assert stats.requested_peak_bytes == 1 + 2 * MiB
    assert stats.reserved_peak_bytes == 4 * MiB and stats.segments_reserved == 2


def test_large_pool_20_mib_segments_and_2_mib_rounding():
    stats = replay([malloc("a", 3 * MiB), malloc("b", 17 * MiB), malloc("c", 12 * MiB + 1)])
    # a: 3 MiB < 10 MiB takes a 20 MiB segment, split (17 MiB > 1 MiB remains). b: 17 MiB is the
    # best fit, exactly. c: 12 MiB + 512 B rounds to a 14 MiB segment, split (2 MiB - 512 > 1 MiB).
    assert stats.reserved_peak_bytes == 34 * MiB
    assert stats.allocated_peak_bytes == 32 * MiB + 512


def test_a_large_remainder_of_at_most_1_mib_is_not_split_off():
    stats = replay([malloc("a", 11 * MiB)])
    # 11 MiB rounds to a 12 MiB segment; 1 MiB would remain, which is not more than 1 MiB: the
    # whole 12 MiB block is handed out and counts as allocated.
    assert (stats.requested_peak_bytes, stats.allocated_peak_bytes, stats.reserved_peak_bytes) == (
        11 * MiB, 12 * MiB, 12 * MiB)


def test_freed_neighbours_coalesce_and_serve_a_larger_request():
    stats = replay([
        malloc("a", 5 * MiB), malloc("b", 5 * MiB), malloc("c", 5 * MiB),  # one 20 MiB segment: a b c + 5 free
        free("a"), free("b"),  # a and b merge into one free 10 MiB block at the segment's start
        malloc("d", 9 * MiB),  # best fit: the 10 MiB block (the 5 MiB tail is too small); 1 MiB left: not split
    ])
    assert stats.reserved_peak_bytes == 20 * MiB and stats.segments_reserved == 1
    assert stats.allocated_peak_bytes == 15 * MiB  # c 5 MiB + d's whole 10 MiB block (a b c before: 15 MiB)


def test_best_fit_takes_the_smallest_block_that_fits():
    a = CachingAllocator()
    for key, size in (("x", 12 * MiB), ("y", 16 * MiB), ("z", 14 * MiB)):
        a.malloc(key, size)
    a.free("x")
    a.free("y")
    a.free("z")
    a.malloc("w", 13 * MiB)  # free 12, 14, 16 MiB segments: 14 is the best fit, 1 MiB left unsplit
    assert a.allocated == 14 * MiB and a.reserved == 42 * MiB


def test_expandable_segments_reuse_what_fixed_segments_cannot():
    trace = [malloc("a", 12 * MiB), free("a"), malloc("b", 14 * MiB)]
    # Fixed segments: a's 12 MiB segment is too small for b, so b reserves 14 MiB more: 26 MiB.
    assert replay(trace).reserved_peak_bytes == 26 * MiB
    # Expandable: a maps one 20 MiB page; b fits the freed 20 MiB: 20 MiB.
    assert replay(trace, expandable_segments=True).reserved_peak_bytes == 20 * MiB


def test_expandable_segments_grow_by_whole_pages_at_the_end():
    trace = [malloc("a", 30 * MiB), malloc("b", 15 * MiB)]
    # a maps two 20 MiB pages (10 MiB free at the end); b needs 5 MiB more: one more page, 60 MiB.
    # Fixed segments: 30 MiB + 16 MiB (15 rounded up to 2 MiB) = 46 MiB.
    assert replay(trace, expandable_segments=True).reserved_peak_bytes == 60 * MiB
    assert replay(trace).reserved_peak_bytes == 46 * MiB
    stats = replay(trace, expandable_segments=True)
    assert stats.allocated_peak_bytes == 45 * MiB  # any remainder of at least 512 B is split off


def test_blocks_are_reused_only_on_their_own_stream():
    trace = [malloc("a", 4 * MiB, stream="h2d"), free("a"), malloc("b", 4 * MiB)]
    # a's 20 MiB segment belongs to the h2d stream; b on compute reserves another 20 MiB.
    assert replay(trace).reserved_peak_bytes == 40 * MiB


def test_a_free_waits_for_the_other_streams_event():
    trace = [
        malloc("x", 12 * MiB, t=0.0),
        free("x", t=1.0, ready_s=2.0),  # another stream reads x until 2.0 s (record_stream)
        malloc("y", 12 * MiB, t=1.5),  # x's block is not back yet: a second 12 MiB segment
        free("y", t=1.6),
        malloc("z", 12 * MiB, t=2.0),  # events polled: x's block is back, z gets one of the two
    ]
    stats = replay(trace)
    assert stats.reserved_peak_bytes == 24 * MiB and stats.allocated_peak_bytes == 24 * MiB
    # The same trace with the event already complete at the free reuses x's block for y.
    assert replay([*trace[:1], free("x", t=1.0), *trace[2:]]).reserved_peak_bytes == 12 * MiB


def test_out_of_memory_releases_cached_segments_first():
    trace = [malloc("a", 12 * MiB), free("a"), malloc("b", 14 * MiB)]
    # 12 + 14 > 24 MiB: the free, unsplit 12 MiB segment is released, then 14 MiB fits.
    stats = replay(trace, capacity_bytes=24 * MiB)
    assert not stats.out_of_memory and stats.segments_released == 1 and stats.reserved_peak_bytes == 14 * MiB
    stats = replay([*trace, malloc("c", 12 * MiB)], capacity_bytes=24 * MiB)
    assert stats.out_of_memory  # 14 MiB live + 12 MiB > 24 MiB and nothing cached
    # Expandable: a maps one 20 MiB page, which b reuses once a is freed: 20 MiB fit a 20 MiB device.
    assert replay(trace, expandable_segments=True, capacity_bytes=20 * MiB).reserved_peak_bytes == 20 * MiB


def test_expandable_out_of_memory_unmaps_the_free_tail():
    a = CachingAllocator(expandable_segments=True, capacity_bytes=40 * MiB)
    a.malloc("x", 30 * MiB)  # two 20 MiB pages
    a.free("x")
    a.malloc("s", 2 * MiB, stream="other")  # another stream's segment: one 20 MiB page; 60 > 40 ...
    # ... so the first segment's free pages are unmapped (40 MiB released) and the page mapped.
    assert a.reserved == 20 * MiB and a.segments_released == 1


def test_bad_traces_are_refused():
    with pytest.raises(ValidationError, match="not allocated"):
        replay([free("ghost")])
    with pytest.raises(ValidationError, match="already live"):
        replay([malloc("a", 1), malloc("a", 1)])
