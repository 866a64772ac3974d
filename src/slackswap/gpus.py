"""Hardware: one GPU and its host link, as the simulator and the roofline see them, and the
single-GPU presets.

Every constant in PRESETS cites its source; docs/hardware.md discusses the choices.
Bandwidths are decimal bytes per second, as vendors and nvbandwidth quote them.
Node presets (slackswap.nodes) are built from these; ``slackswap.hardware`` resolves a name of
either kind and is where users import from.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from ._fields import Fields, check_int, check_names, check_text, read_json_file, show, write_text_atomic
from .errors import ValidationError
from .units import GB

HARDWARE_FORMAT = "slackswap.hardware/1"
_MIN_FRACTION = 1e-3
_MAX_COPY_LATENCY_S = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Hardware:
    name: str
    description: str = ""
    peak_flops_per_s: float
    """Dense bf16 tensor-core peak."""
    gemm_efficiency: float
    """Achieved fraction of peak for matrix multiplies (and the default for other compute-bound ops)."""
    attention_efficiency: float
    """Achieved fraction of peak for fused (flash) attention kernels."""
    hbm_bytes_per_s: float
    hbm_efficiency: float
    """Achieved fraction of HBM bandwidth for memory-bound ops."""
    hbm_capacity_bytes: int
    d2h_bytes_per_s: float
    """Device-to-host copy bandwidth from pinned memory, one direction alone."""
    h2d_bytes_per_s: float
    """Host-to-device copy bandwidth from pinned memory, one direction alone."""
    copy_latency_s: float
    """Fixed cost of each copy (launch and DMA setup), added before its bytes move."""
    duplex_h2d_factor: float = 1.0
    """H2D bandwidth is multiplied by this while a D2H copy is in flight (1.0 = full duplex)."""
    duplex_d2h_factor: float = 1.0
    """D2H bandwidth is multiplied by this while an H2D copy is in flight."""
    collective_bytes_per_s: float | None = None
    """Bus bandwidth of ring collectives between the GPUs of a tensor-parallel group (NVLink or
    NVSwitch), as nccl-tests report it (busbw); None: no GPU-to-GPU link is described."""
    sources: tuple[str, ...] = ()
    pinned_host_bytes: int | None = None
    """Pinned host memory the swaps of one GPU may use; None: unlimited (docs/memory.md, Host memory)."""

    def __post_init__(self) -> None:
        check_text(self.name, "hardware.name")
        if not isinstance(self.description, str):
            raise ValidationError(f"hardware.description must be a string, got {show(self.description)}")
        check_names(self.sources, "hardware.sources")
        check_int(self.hbm_capacity_bytes, "hardware.hbm_capacity_bytes", minimum=1)
        if self.pinned_host_bytes is not None:
            check_int(self.pinned_host_bytes, "hardware.pinned_host_bytes", minimum=1)
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in ("name", "description", "sources", "pinned_host_bytes") or (
                    f.name == "collective_bytes_per_s" and value is None):
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value in (float("inf"), float("-inf")):
                raise ValidationError(f"hardware.{f.name} must be a finite number, got {value!r}")
            if value <= 0 and f.name != "copy_latency_s":
                raise ValidationError(f"hardware.{f.name} must be positive, got {value!r}")
            if value < 0:
                raise ValidationError(f"hardware.{f.name} must be zero or positive, got {value!r}")
        for key in ("gemm_efficiency", "attention_efficiency", "hbm_efficiency", "duplex_h2d_factor", "duplex_d2h_factor"):
            if getattr(self, key) > 1:
                raise ValidationError(f"hardware.{key} is a fraction and must be at most 1, got {getattr(self, key)!r}")
            # Sanity floors keep every derived time finite (a size over a rate of 1e-300 is inf).
            if getattr(self, key) < _MIN_FRACTION:
                raise ValidationError(
                    f"hardware.{key} is {getattr(self, key)!r}; a fraction below {_MIN_FRACTION} is a typo: use 0.001 to 1"
                )
        for key in ("peak_flops_per_s", "hbm_bytes_per_s", "d2h_bytes_per_s", "h2d_bytes_per_s",
                    "collective_bytes_per_s"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise ValidationError(f"hardware.{key} is {getattr(self, key)!r}; it must be at least 1 per second")
        if self.copy_latency_s > _MAX_COPY_LATENCY_S:
            raise ValidationError(
                f"hardware.copy_latency_s is {self.copy_latency_s!r} s; copy latencies are microseconds "
                f"(6e-6), at most {_MAX_COPY_LATENCY_S} s"
            )

    @property
    def achieved_gemm_flops_per_s(self) -> float:
        return self.peak_flops_per_s * self.gemm_efficiency

    @property
    def achieved_attention_flops_per_s(self) -> float:
        return self.peak_flops_per_s * self.attention_efficiency

    @property
    def achieved_hbm_bytes_per_s(self) -> float:
        return self.hbm_bytes_per_s * self.hbm_efficiency

    def replace(self, **changes: Any) -> "Hardware":
        return dataclasses.replace(self, **changes)

    def without_duplex_slowdown(self) -> "Hardware":
        return self.replace(duplex_h2d_factor=1.0, duplex_d2h_factor=1.0)

    def to_dict(self) -> dict[str, Any]:
        data = {"format": HARDWARE_FORMAT}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue  # an unset optional field (pinned_host_bytes) stays out of the file
            data[f.name] = list(value) if isinstance(value, tuple) else value
        return data

    def save(self, path) -> None:
        write_text_atomic(path, json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def from_dict(cls, data: Any) -> "Hardware":
        f = Fields(data, "hardware")
        fmt = f.str("format", default=HARDWARE_FORMAT)
        if fmt != HARDWARE_FORMAT:
            raise ValidationError(f"hardware.format is {fmt!r}, expected {HARDWARE_FORMAT!r}")
        kwargs: dict[str, Any] = {"name": f.str("name"), "description": f.obj.get("description", "")}
        f.used.add("description")
        if not isinstance(kwargs["description"], str):
            raise ValidationError("hardware.description must be a string")
        for key in ("peak_flops_per_s", "gemm_efficiency", "attention_efficiency", "hbm_bytes_per_s",
                    "hbm_efficiency", "d2h_bytes_per_s", "h2d_bytes_per_s"):
            kwargs[key] = f.number(key, positive=True)
        kwargs["hbm_capacity_bytes"] = f.int("hbm_capacity_bytes", positive=True)
        kwargs["copy_latency_s"] = f.number("copy_latency_s")
        kwargs["duplex_h2d_factor"] = f.number("duplex_h2d_factor", positive=True, default=1.0)
        kwargs["duplex_d2h_factor"] = f.number("duplex_d2h_factor", positive=True, default=1.0)
        if f.obj.get("collective_bytes_per_s") is not None:
            kwargs["collective_bytes_per_s"] = f.number("collective_bytes_per_s", positive=True)
        f.used.add("collective_bytes_per_s")
        kwargs["sources"] = f.str_list("sources", default=[])
        if f.obj.get("pinned_host_bytes") is not None:
            kwargs["pinned_host_bytes"] = f.int("pinned_host_bytes", positive=True)
        f.used.add("pinned_host_bytes")
        f.no_extra()
        return cls(**kwargs)

    @classmethod
    def load(cls, path) -> "Hardware":
        return cls.from_dict(read_json_file(path, "hardware"))


# One parametrization for every preset and every model (see docs/hardware.md):
# - gemm_efficiency 0.60: between Megatron's 54.2% end-to-end MFU on A100 (Korthikanti et al.,
#   arXiv 2205.05198) and the ~70% that large bf16 GEMMs reach; reproduce sweeps 0.5-0.7.
# - attention_efficiency 0.50: FlashAttention-2 reaches 0.55 of peak forward and 0.45 backward
#   on A100 (FlashAttention-2 paper; flash-attention issue #477 for the FLOP convention).
# - hbm_efficiency 0.80: achieved/peak HBM bandwidth of streaming kernels (Calculon's A100 tables
#   give 0.9 above 100 MB; 0.8 covers the mid-sized elementwise ops of a layer).
# - copy_latency_s 6 us: 5-7 us per cudaMemcpyAsync call (DualPath, arXiv 2602.21548 sec. 5.2).
_EFFICIENCY = dict(gemm_efficiency=0.60, attention_efficiency=0.50, hbm_efficiency=0.80, copy_latency_s=6e-6)

_PCIE4 = dict(
    # PCIe 4.0 x16 is 31.5 GB/s per direction in theory; nvbandwidth measures 24.8-26 GB/s one way at a
    # time on A100 (nvbandwidth issues #11, #53; NVIDIA forum thread 352186): we use 24 GB/s.
    d2h_bytes_per_s=24 * GB, h2d_bytes_per_s=24 * GB,
    # With both directions busy, H2D fell to 11-13 GB/s while D2H held ~24 GB/s (nvbandwidth #11, #53).
    duplex_h2d_factor=0.5, duplex_d2h_factor=1.0,
    # 8x A100 SXM4 on NVSwitch (NVLink 3, 300 GB/s per direction): nccl-tests measured ~200 GB/s
    # all-reduce bus bandwidth on eight GPUs (nccl-tests issue #149).
    collective_bytes_per_s=200 * GB,
)
_PCIE5 = dict(
    # PCIe 5.0 x16 is 63 GB/s per direction in theory; ~50 GB/s is the planning figure for copy-engine
    # transfers on H100 (nvbandwidth #24 measured 53 GB/s D2H, 35 GB/s H2D with SM copies).
    d2h_bytes_per_s=50 * GB, h2d_bytes_per_s=50 * GB,
    # Assumed: A100's measured halving. The PCIe 5.0 logs found disagree with it (H2D at 51 of ~55 GB/s
    # while D2H runs in nvbandwidth #53's thread, 0.93 in one HGX B300 log), each a single system;
    # reproduce's sensitivity table shows 0.25 to 1.0.
    duplex_h2d_factor=0.5, duplex_d2h_factor=1.0,
)

PRESETS: dict[str, Hardware] = {
    "a100-40gb-pcie4": Hardware(
        name="a100-40gb-pcie4", description="NVIDIA A100 40GB (HBM2) on a PCIe 4.0 x16 host link",
        # A100 datasheet: 312 TFLOP/s dense bf16, 1555 GB/s HBM2, 40 GB.
        peak_flops_per_s=312e12, hbm_bytes_per_s=1555 * GB, hbm_capacity_bytes=40 * 10**9,
        **_EFFICIENCY, **_PCIE4,
        sources=("NVIDIA A100 datasheet", "nvbandwidth issues #11, #53", "DualPath arXiv 2602.21548",
                 "nccl-tests issue #149"),
    ),
    "a100-80gb-pcie4": Hardware(
        name="a100-80gb-pcie4", description="NVIDIA A100 80GB (HBM2e) on a PCIe 4.0 x16 host link",
        # A100 datasheet: 312 TFLOP/s dense bf16, 2039 GB/s HBM2e (SXM4), 80 GB.
        peak_flops_per_s=312e12, hbm_bytes_per_s=2039 * GB, hbm_capacity_bytes=80 * 10**9,
        **_EFFICIENCY, **_PCIE4,
        sources=("NVIDIA A100 datasheet", "nvbandwidth issues #11, #53", "DualPath arXiv 2602.21548",
                 "nccl-tests issue #149"),
    ),
    "h100-pcie5": Hardware(
        name="h100-pcie5", description="NVIDIA H100 PCIe 80GB (HBM2e) on a PCIe 5.0 x16 host link",
        # H100 PCIe datasheet: 756 TFLOP/s dense bf16, 2000 GB/s HBM2e, 80 GB.
        peak_flops_per_s=756e12, hbm_bytes_per_s=2000 * GB, hbm_capacity_bytes=80 * 10**9,
        **_EFFICIENCY, **_PCIE5,
        # H100 PCIe cards pair up over NVLink bridges: all_reduce_perf measured 116 GB/s bus
        # bandwidth between two (NCCL issue #1161); beyond a pair traffic crosses PCIe.
        collective_bytes_per_s=116 * GB,
        sources=("NVIDIA H100 datasheet", "nvbandwidth issue #24", "DualPath arXiv 2602.21548", "NCCL issue #1161"),
    ),
    "h100-sxm-pcie5": Hardware(
        name="h100-sxm-pcie5", description="NVIDIA H100 SXM5 80GB (HBM3) on a PCIe 5.0 x16 host link",
        # H100 SXM datasheet: 989 TFLOP/s dense bf16, 3350 GB/s HBM3, 80 GB.
        peak_flops_per_s=989e12, hbm_bytes_per_s=3350 * GB, hbm_capacity_bytes=80 * 10**9,
        **_EFFICIENCY, **_PCIE5,
        # NVLink 4 over NVSwitch: ~370 GB/s ring bus bandwidth (nccl-tests issue #212).
        collective_bytes_per_s=370 * GB,
        sources=("NVIDIA H100 datasheet", "nvbandwidth issue #24", "DualPath arXiv 2602.21548", "nccl-tests issue #212"),
    ),
    "h200-pcie5": Hardware(
        name="h200-pcie5", description="NVIDIA H200 141GB (HBM3e) on a PCIe 5.0 x16 host link",
        # H200 datasheet: 989 TFLOP/s dense bf16, 4800 GB/s HBM3e, 141 GB.
        peak_flops_per_s=989e12, hbm_bytes_per_s=4800 * GB, hbm_capacity_bytes=141 * 10**9,
        **_EFFICIENCY, **_PCIE5,
        # NVLink 4 is 450 GB/s per direction; NCCL's ring reaches ~370 GB/s bus bandwidth after
        # protocol overhead (nccl-tests issue #212, NCCL maintainer's answer).
        collective_bytes_per_s=370 * GB,
        sources=("NVIDIA H200 datasheet", "nvbandwidth issue #24", "DualPath arXiv 2602.21548", "nccl-tests issue #212"),
    ),
    "gh200-c2c": Hardware(
        name="gh200-c2c", description="NVIDIA GH200 96GB (HBM3) with NVLink-C2C to the Grace CPU",
        # GH200 datasheet: 989 TFLOP/s dense bf16, 4000 GB/s HBM3, 96 GB; NVLink-C2C 450 GB/s per direction.
        peak_flops_per_s=989e12, hbm_bytes_per_s=4000 * GB, hbm_capacity_bytes=96 * 10**9,
        gemm_efficiency=0.60, attention_efficiency=0.50, hbm_efficiency=0.80, copy_latency_s=6e-6,
        # Measured C2C copies: H2D ~346 GB/s, D2H ~15% lower (nvbandwidth #23).
        h2d_bytes_per_s=346 * GB, d2h_bytes_per_s=294 * GB,
        # Bidirectional C2C reached about half of the 900 GB/s total (nvbandwidth #41); measured H2D while
        # D2H runs is 0.47-0.49 of its one-way rate there, so 0.48; D2H keeps 225/294 = 0.77 (half of the
        # total each way), which no measurement isolates. Both rest on that one system (single-sourced).
        duplex_h2d_factor=0.48, duplex_d2h_factor=0.77,
        # GPU-to-GPU over NVLink 4 as on H100/H200 SXM (nccl-tests issue #212: ~370 GB/s ring bus bandwidth).
        collective_bytes_per_s=370 * GB,
        sources=("NVIDIA GH200 datasheet", "nvbandwidth issues #23, #41", "DualPath arXiv 2602.21548", "nccl-tests issue #212"),
    ),
}

