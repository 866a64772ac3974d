"""`slackswap hardware`: list the hardware presets with their constants."""

from __future__ import annotations

from ..hardware import PRESETS
from ..units import GB
from .common import print_json


def register(subparsers) -> None:
    parser = subparsers.add_parser("hardware", help="list hardware presets")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)


def run(args) -> int:
    if args.json:
        print_json({name: hw.to_dict() for name, hw in PRESETS.items()})
        return 0
    from ..report.console import render_table

    render_table(
        ("preset", "peak TFLOP/s", "eff GEMM/attn/HBM", "HBM GB", "HBM GB/s", "D2H GB/s", "H2D GB/s",
         "H2D duplex", "copy latency"),
        [(name, f"{hw.peak_flops_per_s / 1e12:.0f}",
          f"{hw.gemm_efficiency:.2f}/{hw.attention_efficiency:.2f}/{hw.hbm_efficiency:.2f}",
          f"{hw.hbm_capacity_bytes / 1e9:.0f}", f"{hw.hbm_bytes_per_s / GB:.0f}", f"{hw.d2h_bytes_per_s / GB:.0f}",
          f"{hw.h2d_bytes_per_s / GB:.0f}", f"{hw.duplex_h2d_factor:.2f}x", f"{hw.copy_latency_s * 1e6:.1f} us")
         for name, hw in PRESETS.items()],
    )
    print("H2D duplex: factor on H2D bandwidth while a D2H copy runs; sources: docs/hardware.md")
    return 0
