"""Every measurement of gpu_validate goes through a Device, so the same script logic runs on a
CUDA GPU (events, streams, pinned memory, allocator statistics) and, for its dry run, on CPU
(wall clock, threads, pageable memory, memory figures reported as n/a)."""

from __future__ import annotations

import contextlib
import gc
import re
import threading
import time

import torch


def device_slug(name: str) -> str:
    """'NVIDIA H200' -> 'h200': a file-name-safe label for the results files and the measured
    hardware's name (the vendor left out, so names read like slackswap's presets: 'h200-measured')."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return slug.removeprefix("nvidia-") or "device"


class Device:
    """What gpu_validate needs from the machine. Times are seconds, sizes bytes."""

    kind = "abstract"
    name = "abstract"
    torch_device: torch.device

    @property
    def slug(self) -> str:
        return device_slug(self.name)

    # ---- time ------------------------------------------------------------------------------
    def mark(self, stream=None):
        """A point in time on ``stream`` (the current one by default); read with elapsed_s."""
        raise NotImplementedError

    def elapsed_s(self, start, end) -> float:
        """Seconds between two marks; synchronizes first."""
        raise NotImplementedError

    def synchronize(self) -> None:
        raise NotImplementedError

    # ---- concurrency -----------------------------------------------------------------------
    def run_side_by_side(self, background, foreground) -> float:
        """Start ``background()`` and, alongside it, ``foreground()``; return the seconds the
        foreground took. ``background`` must outlast it (the caller sizes it to)."""
        raise NotImplementedError

    # ---- memory ----------------------------------------------------------------------------
    pinned_host = False
    tracks_memory = False

    def host_buffer(self, size_bytes: int) -> torch.Tensor:
        return torch.empty(size_bytes, dtype=torch.uint8, pin_memory=self.pinned_host)

    def device_buffer(self, size_bytes: int) -> torch.Tensor:
        return torch.empty(size_bytes, dtype=torch.uint8, device=self.torch_device)

    def total_memory_bytes(self) -> int | None:
        return None

    def allocated_bytes(self) -> int | None:
        return None

    def max_allocated_bytes(self) -> int | None:
        return None

    def max_reserved_bytes(self) -> int | None:
        return None

    def reset_peak(self) -> None:
        pass

    def release_cached(self) -> None:
        pass

    def oom_errors(self) -> tuple[type[BaseException], ...]:
        return (MemoryError,)

    def describe(self) -> dict:
        return {"kind": self.kind, "name": self.name, "slug": self.slug, "torch": torch.__version__,
                "total_memory_bytes": self.total_memory_bytes(), "pinned_host_memory": self.pinned_host,
                "memory_statistics": self.tracks_memory}


class CudaDevice(Device):
    kind = "cuda"
    pinned_host = True
    tracks_memory = True

    def __init__(self, index: int = 0) -> None:
        self.torch_device = torch.device("cuda", index)
        torch.cuda.set_device(self.torch_device)
        self.name = torch.cuda.get_device_name(self.torch_device)
        self._streams = (torch.cuda.Stream(self.torch_device), torch.cuda.Stream(self.torch_device))

    def mark(self, stream=None):
        event = torch.cuda.Event(enable_timing=True)
        event.record(stream)
        return event

    def elapsed_s(self, start, end) -> float:
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.torch_device)

    def run_side_by_side(self, background, foreground) -> float:
        # Two side streams, both waiting for what the current stream has queued, so the two
        # directions' copies are in flight at the same time on the two copy engines.
        self.synchronize()
        back, fore = self._streams
        with torch.cuda.stream(back):
            background()
        with torch.cuda.stream(fore):
            start = self.mark(fore)
            foreground()
            end = self.mark(fore)
        seconds = self.elapsed_s(start, end)
        self.synchronize()
        return seconds

    def total_memory_bytes(self) -> int:
        return torch.cuda.get_device_properties(self.torch_device).total_memory

    def allocated_bytes(self) -> int:
        return torch.cuda.memory_allocated(self.torch_device)

    def max_allocated_bytes(self) -> int:
        return torch.cuda.max_memory_allocated(self.torch_device)

    def max_reserved_bytes(self) -> int:
        return torch.cuda.max_memory_reserved(self.torch_device)

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.torch_device)

    def release_cached(self) -> None:
        # Between configurations: drop what the last one left (a runtime's pinned pool can be tens of
        # GiB, and the host caching allocator would keep it), so each one's memory figures are its own.
        gc.collect()
        torch.cuda.empty_cache()
        if hasattr(torch._C, "_host_emptyCache"):
            torch._C._host_emptyCache()

    def oom_errors(self):
        return (torch.cuda.OutOfMemoryError, MemoryError)

    def describe(self) -> dict:
        props = torch.cuda.get_device_properties(self.torch_device)
        return {**super().describe(), "cuda": torch.version.cuda, "capability": f"{props.major}.{props.minor}",
                "multiprocessors": props.multi_processor_count}


class CpuDevice(Device):
    """The dry run's device: wall-clock marks, threads for side-by-side copies, pinned host memory
    only where torch has a pinned-memory backend (it has none on a CPU-only build)."""

    kind = "cpu"
    name = "cpu"

    def __init__(self) -> None:
        self.torch_device = torch.device("cpu")
        # One intra-op thread: the dry run checks logic, not speed, and on a shared machine torch's
        # spinning worker threads made its tiny steps 5-50x slower (measured on 2 busy cores).
        torch.set_num_threads(1)
        with contextlib.suppress(Exception):
            self.pinned_host = bool(torch.cuda.is_available())

    def mark(self, stream=None):
        return time.perf_counter()

    def elapsed_s(self, start, end) -> float:
        return end - start

    def synchronize(self) -> None:
        pass

    def run_side_by_side(self, background, foreground) -> float:
        # torch copies release the GIL, so two threads copy at the same time as two streams would.
        ready = threading.Barrier(2)

        def run_background():
            ready.wait()
            background()

        thread = threading.Thread(target=run_background)
        thread.start()
        ready.wait()
        start = time.perf_counter()
        foreground()
        seconds = time.perf_counter() - start
        thread.join()
        return seconds


def open_device(kind: str) -> Device:
    """'cuda' or 'cpu'. Raises RuntimeError with a one-line reason when CUDA is asked for and absent."""
    if kind == "cpu":
        return CpuDevice()
    if not torch.cuda.is_available():
        raise RuntimeError("needs a CUDA GPU (torch.cuda.is_available() is False): run with --dry-run to "
                           "check the script on CPU")
    return CudaDevice()
