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
    print(f"{'preset':<17} {'peak TFLOP/s':>12} {'eff GEMM/attn/HBM':>17} {'HBM GB':>7} {'HBM GB/s':>9} "
          f"{'D2H GB/s':>9} {'H2D GB/s':>9} {'H2D duplex':>10} {'latency':>8}")
    for name, hw in PRESETS.items():
        efficiencies = f"{hw.gemm_efficiency:.2f}/{hw.attention_efficiency:.2f}/{hw.hbm_efficiency:.2f}"
        print(f"{name:<17} {hw.peak_flops_per_s / 1e12:>12.0f} {efficiencies:>17} {hw.hbm_capacity_bytes / 1e9:>7.0f} "
              f"{hw.hbm_bytes_per_s / GB:>9.0f} {hw.d2h_bytes_per_s / GB:>9.0f} {hw.h2d_bytes_per_s / GB:>9.0f} "
              f"{hw.duplex_h2d_factor:>9.2f}x {hw.copy_latency_s * 1e6:>5.1f} us")
    print("H2D duplex: factor on H2D bandwidth while a D2H copy runs; sources: docs/hardware.md")
    return 0
