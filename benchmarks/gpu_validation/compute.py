"""Compute and HBM: achieved FLOP/s of the model's own matrix multiplies (bf16), of causal fused
attention, and achieved HBM bandwidth of a large device copy; then the measured Hardware."""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from slackswap.hardware import Hardware

from .device import Device
from .link import LinkResult

# Dense bf16 tensor-core peak and HBM bandwidth from NVIDIA's datasheets, matched against
# torch.cuda.get_device_name (first match wins, so the specific names come first).
DATASHEETS = (
    ("GH200", 989e12, 4000e9, "NVIDIA GH200 datasheet: 989 TFLOP/s dense bf16, 4.0 TB/s HBM3"),
    ("H200", 989e12, 4800e9, "NVIDIA H200 datasheet: 989 TFLOP/s dense bf16, 4.8 TB/s HBM3e"),
    ("H100 PCIe", 756e12, 2000e9, "NVIDIA H100 PCIe datasheet: 756 TFLOP/s dense bf16, 2.0 TB/s HBM2e"),
    ("H100", 989e12, 3350e9, "NVIDIA H100 SXM datasheet: 989 TFLOP/s dense bf16, 3.35 TB/s HBM3"),
    ("A100 80GB PCIe", 312e12, 1935e9, "NVIDIA A100 datasheet: 312 TFLOP/s dense bf16, 1935 GB/s (80GB PCIe)"),
    ("A100-SXM4-80GB", 312e12, 2039e9, "NVIDIA A100 datasheet: 312 TFLOP/s dense bf16, 2039 GB/s (80GB SXM)"),
    ("A100", 312e12, 1555e9, "NVIDIA A100 datasheet: 312 TFLOP/s dense bf16, 1555 GB/s (40GB)"),
    ("L40S", 362e12, 864e9, "NVIDIA L40S datasheet: 362 TFLOP/s dense bf16, 864 GB/s GDDR6"),
)
MIN_FRACTION = 1e-3  # Hardware refuses fractions below this


def datasheet_for(device_name: str):
    for key, flops, hbm, source in DATASHEETS:
        if key.lower() in device_name.lower():
            return flops, hbm, source
    return None


@dataclass(frozen=True)
class Gemm:
    label: str
    batch: int
    m: int
    k: int
    n: int
    time_s: float = math.nan

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.k * self.n

    @property
    def flops_per_s(self) -> float:
        return self.flops / self.time_s


def model_gemms(config) -> list[Gemm]:
    """The matrix multiplies of one GPT-2-like step (slackswap.examples): each linear layer's
    forward, input-gradient and weight-gradient products, and the two attention batched products."""
    tokens = config.micro_batch * config.seq_len
    h, head_dim = config.hidden, config.hidden // config.heads
    shapes = []
    for name, fan_in, fan_out in (("qkv", h, 3 * h), ("attn proj", h, h), ("mlp fc", h, config.ffn),
                                  ("mlp proj", config.ffn, h), ("lm head", h, config.vocab)):
        shapes += [Gemm(f"{name} fwd", 1, tokens, fan_in, fan_out), Gemm(f"{name} dgrad", 1, tokens, fan_out, fan_in),
                   Gemm(f"{name} wgrad", 1, fan_out, tokens, fan_in)]
    heads = config.micro_batch * config.heads
    shapes += [Gemm("attn QK^T", heads, config.seq_len, head_dim, config.seq_len),
               Gemm("attn PV", heads, config.seq_len, config.seq_len, head_dim)]
    return shapes


def _time_repeated_s(device: Device, fn, iters: int, repeats: int) -> float:
    """Median over ``repeats`` of the per-call time of ``iters`` back-to-back calls (after one warm-up)."""
    fn()
    samples = []
    for _ in range(repeats):
        device.synchronize()
        start = device.mark()
        for _ in range(iters):
            fn()
        end = device.mark()
        samples.append(device.elapsed_s(start, end) / iters)
    return statistics.median(samples)


def time_gemm(device: Device, g: Gemm, dtype, iters: int, repeats: int) -> Gemm:
    shape = (g.batch,) if g.batch > 1 else ()
    a = torch.randn(*shape, g.m, g.k, device=device.torch_device, dtype=dtype)
    b = torch.randn(*shape, g.k, g.n, device=device.torch_device, dtype=dtype)
    out = torch.empty(*shape, g.m, g.n, device=device.torch_device, dtype=dtype)
    seconds = _time_repeated_s(device, lambda: torch.matmul(a, b, out=out), iters, repeats)
    return Gemm(g.label, g.batch, g.m, g.k, g.n, seconds)


@dataclass(frozen=True)
class Attention:
    batch: int
    heads: int
    seq_len: int
    head_dim: int
    fwd_time_s: float
    bwd_time_s: float

    @property
    def fwd_flops(self) -> float:
        # slackswap's flash-attention convention (workloads/roofline.py): 4 b s^2 h, halved when
        # causal; backward 2.5x forward.
        return 4.0 * self.batch * self.seq_len**2 * self.heads * self.head_dim * 0.5

    @property
    def flops_per_s(self) -> float:
        return 3.5 * self.fwd_flops / (self.fwd_time_s + self.bwd_time_s)


def time_attention(device: Device, config, dtype, iters: int, repeats: int) -> Attention:
    shape = (config.micro_batch, config.heads, config.seq_len, config.hidden // config.heads)
    q, k, v = (torch.randn(shape, device=device.torch_device, dtype=dtype, requires_grad=True) for _ in range(3))
    grad = torch.randn(shape, device=device.torch_device, dtype=dtype)

    def forward():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward_backward():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        q.grad = k.grad = v.grad = None
        out.backward(grad)

    fwd = _time_repeated_s(device, forward, iters, repeats)
    both = _time_repeated_s(device, forward_backward, iters, repeats)
    return Attention(shape[0], shape[1], shape[2], shape[3], fwd, max(both - fwd, 1e-12))


def time_hbm_bytes_per_s(device: Device, size_bytes: int, iters: int, repeats: int) -> float:
    """A device-to-device copy reads and writes every byte: 2 x size per copy."""
    src, dst = device.device_buffer(size_bytes), device.device_buffer(size_bytes)
    return 2 * size_bytes / _time_repeated_s(device, lambda: dst.copy_(src), iters, repeats)


@dataclass(frozen=True)
class ComputeResult:
    gemms: list[Gemm]
    attention: Attention
    hbm_bytes_per_s: float
    peak_flops_per_s: float
    peak_hbm_bytes_per_s: float
    peak_source: str

    @property
    def gemm_flops_per_s(self) -> float:
        """FLOP-weighted over the model's GEMMs: total FLOPs over total time."""
        return sum(g.flops for g in self.gemms) / sum(g.time_s for g in self.gemms)

    @property
    def gemm_efficiency(self) -> float:
        return self.gemm_flops_per_s / self.peak_flops_per_s

    @property
    def attention_efficiency(self) -> float:
        return self.attention.flops_per_s / self.peak_flops_per_s

    @property
    def hbm_efficiency(self) -> float:
        return self.hbm_bytes_per_s / self.peak_hbm_bytes_per_s

    def to_dict(self) -> dict:
        a = self.attention
        return {
            "peak_flops_per_s": self.peak_flops_per_s, "peak_hbm_bytes_per_s": self.peak_hbm_bytes_per_s,
            "peak_source": self.peak_source,
            "gemms": [{"label": g.label, "batch": g.batch, "m": g.m, "k": g.k, "n": g.n, "flops": g.flops,
                       "time_s": g.time_s, "flops_per_s": g.flops_per_s} for g in self.gemms],
            "gemm_flops_per_s": self.gemm_flops_per_s, "gemm_efficiency": self.gemm_efficiency,
            "attention": {"batch": a.batch, "heads": a.heads, "seq_len": a.seq_len, "head_dim": a.head_dim,
                          "causal": True, "fwd_time_s": a.fwd_time_s, "bwd_time_s": a.bwd_time_s,
                          "flops_per_s": a.flops_per_s, "efficiency": self.attention_efficiency},
            "hbm_bytes_per_s": self.hbm_bytes_per_s, "hbm_efficiency": self.hbm_efficiency,
        }


def measure_compute(device: Device, config, dtype, *, hbm_size_bytes: int, iters: int, repeats: int) -> ComputeResult:
    gemms = [time_gemm(device, g, dtype, iters, repeats) for g in model_gemms(config)]
    attention = time_attention(device, config, dtype, iters, repeats)
    hbm = time_hbm_bytes_per_s(device, hbm_size_bytes, iters, repeats)
    sheet = datasheet_for(device.name)
    if sheet is not None:
        peak_flops, peak_hbm, source = sheet
    else:
        # Unknown device: the fastest measured rate stands in for the peak, so peak x efficiency
        # (all the simulator uses) is still the measured rate.
        peak_flops = max(max(g.flops_per_s for g in gemms), attention.flops_per_s)
        peak_hbm, source = hbm, f"{device.name} is not in the datasheet table: peaks are the best measured rates"
    return ComputeResult(gemms, attention, hbm, peak_flops, peak_hbm, source)


def _fraction(x: float) -> float:
    return min(1.0, max(MIN_FRACTION, x))


def host_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def measured_hardware(device: Device, link: LinkResult, compute: ComputeResult, when: str) -> Hardware:
    """A Hardware (slackswap.hardware/1) from the measurements; fractions clamped to [0.001, 1]."""
    large, d = link.largest, link.duplex
    capacity = device.total_memory_bytes() or host_memory_bytes()
    return Hardware(
        name=f"{device.slug}-measured",
        description=f"{device.name}, measured by benchmarks/gpu_validate.py ({when})",
        peak_flops_per_s=compute.peak_flops_per_s,
        gemm_efficiency=_fraction(compute.gemm_efficiency),
        attention_efficiency=_fraction(compute.attention_efficiency),
        hbm_bytes_per_s=compute.peak_hbm_bytes_per_s,
        hbm_efficiency=_fraction(compute.hbm_efficiency),
        hbm_capacity_bytes=int(capacity),
        d2h_bytes_per_s=large.d2h_bytes_per_s,
        h2d_bytes_per_s=large.h2d_bytes_per_s,
        copy_latency_s=min(link.copy_latency_s, 1.0),
        duplex_h2d_factor=_fraction(d.h2d_factor),
        duplex_d2h_factor=_fraction(d.d2h_factor),
        sources=(compute.peak_source,
                 f"measured: {'pinned' if device.pinned_host else 'pageable'} copies of "
                 f"{min(s.size_bytes for s in link.samples)}-{large.size_bytes} bytes, bandwidth at "
                 f"{large.size_bytes} bytes, latency from the smallest copy",
                 "measured: efficiencies are FLOP-weighted over the model's bf16 GEMMs, causal SDPA "
                 "fwd+bwd, and a device copy"),
    )
