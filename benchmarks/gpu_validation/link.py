"""The host link as the simulator models it: per-direction bandwidth of pinned copies, the fixed
cost of each copy, and how much each direction slows while the other is busy (duplex factors)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from .device import Device

KiB, MiB = 1024, 1024**2
FULL_SIZES_BYTES = tuple(64 * KiB * 4**i for i in range(7))  # 64 KiB, 256 KiB, ... 256 MiB
DRY_SIZES_BYTES = (64 * KiB, 256 * KiB, 1 * MiB)


@dataclass(frozen=True)
class CopySample:
    size_bytes: int
    h2d_s_per_copy: float
    d2h_s_per_copy: float

    @property
    def h2d_bytes_per_s(self) -> float:
        return self.size_bytes / self.h2d_s_per_copy

    @property
    def d2h_bytes_per_s(self) -> float:
        return self.size_bytes / self.d2h_s_per_copy


def _copies(dst, src, count: int):
    def run():
        for _ in range(count):
            dst.copy_(src, non_blocking=True)
    return run


def time_per_copy_s(device: Device, dst, src, count: int, repeats: int) -> float:
    """Median over ``repeats`` of the time of ``count`` back-to-back copies, per copy; the first
    batch warms the copy path up and is not counted."""
    samples = []
    for r in range(repeats + 1):
        device.synchronize()
        start = device.mark()
        _copies(dst, src, count)()
        end = device.mark()
        if r:
            samples.append(device.elapsed_s(start, end) / count)
    return statistics.median(samples)


def measure_copies(device: Device, sizes_bytes, repeats: int) -> list[CopySample]:
    """Each size alone in each direction. Small sizes repeat so a sample moves at least the largest size."""
    largest = max(sizes_bytes)
    host, dev = device.host_buffer(largest), device.device_buffer(largest)
    result = []
    for size in sizes_bytes:
        count = max(1, min(256, largest // size))
        h, d = host[:size], dev[:size]
        result.append(CopySample(size, time_per_copy_s(device, d, h, count, repeats),
                                 time_per_copy_s(device, h, d, count, repeats)))
    return result


@dataclass(frozen=True)
class Duplex:
    size_bytes: int
    h2d_alone_bytes_per_s: float
    d2h_alone_bytes_per_s: float
    h2d_with_d2h_bytes_per_s: float
    d2h_with_h2d_bytes_per_s: float

    @property
    def h2d_factor(self) -> float:
        return self.h2d_with_d2h_bytes_per_s / self.h2d_alone_bytes_per_s

    @property
    def d2h_factor(self) -> float:
        return self.d2h_with_h2d_bytes_per_s / self.d2h_alone_bytes_per_s


def measure_duplex(device: Device, alone: CopySample, count: int, repeats: int) -> Duplex:
    """Each direction timed while the other direction runs three times as many copies of the same
    size on another stream (so it is busy for the whole measurement); median of ``repeats``."""
    size = alone.size_bytes
    host_in, dev_in = device.host_buffer(size), device.device_buffer(size)
    host_out, dev_out = device.host_buffer(size), device.device_buffer(size)
    h2d = _copies(dev_in, host_in, count)
    d2h = _copies(host_out, dev_out, count)
    h2d_busy = _copies(dev_in, host_in, 3 * count)
    d2h_busy = _copies(host_out, dev_out, 3 * count)
    h2d_s = statistics.median(device.run_side_by_side(d2h_busy, h2d) for _ in range(repeats))
    d2h_s = statistics.median(device.run_side_by_side(h2d_busy, d2h) for _ in range(repeats))
    return Duplex(size, alone.h2d_bytes_per_s, alone.d2h_bytes_per_s, count * size / h2d_s, count * size / d2h_s)


def copy_latency_s(samples: list[CopySample]) -> float:
    """Fixed cost per copy: the smallest copy's time minus its bytes at the largest copy's rate
    (the simulator charges latency + bytes / bandwidth per copy), averaged over the two
    directions; at least 0."""
    small, large = min(samples, key=lambda s: s.size_bytes), max(samples, key=lambda s: s.size_bytes)
    h2d = small.h2d_s_per_copy - small.size_bytes / large.h2d_bytes_per_s
    d2h = small.d2h_s_per_copy - small.size_bytes / large.d2h_bytes_per_s
    return max(0.0, (h2d + d2h) / 2)


@dataclass(frozen=True)
class LinkResult:
    samples: list[CopySample]
    duplex: Duplex
    copy_latency_s: float

    @property
    def largest(self) -> CopySample:
        return max(self.samples, key=lambda s: s.size_bytes)

    def to_dict(self) -> dict:
        d = self.duplex
        return {
            "sizes": [{"size_bytes": s.size_bytes, "h2d_s_per_copy": s.h2d_s_per_copy,
                       "d2h_s_per_copy": s.d2h_s_per_copy, "h2d_bytes_per_s": s.h2d_bytes_per_s,
                       "d2h_bytes_per_s": s.d2h_bytes_per_s} for s in self.samples],
            "duplex": {"size_bytes": d.size_bytes, "h2d_alone_bytes_per_s": d.h2d_alone_bytes_per_s,
                       "d2h_alone_bytes_per_s": d.d2h_alone_bytes_per_s,
                       "h2d_with_d2h_bytes_per_s": d.h2d_with_d2h_bytes_per_s,
                       "d2h_with_h2d_bytes_per_s": d.d2h_with_h2d_bytes_per_s,
                       "h2d_factor": d.h2d_factor, "d2h_factor": d.d2h_factor},
            "copy_latency_s": self.copy_latency_s,
        }


def measure_link(device: Device, sizes_bytes, repeats: int) -> LinkResult:
    samples = measure_copies(device, sizes_bytes, repeats)
    largest = max(samples, key=lambda s: s.size_bytes)
    duplex = measure_duplex(device, largest, count=4, repeats=repeats)
    return LinkResult(samples, duplex, copy_latency_s(samples))
