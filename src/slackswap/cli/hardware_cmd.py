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
         "H2D duplex", "copy latency", "collective GB/s"),
        [(name, f"{hw.peak_flops_per_s / 1e12:.0f}",
          f"{hw.gemm_efficiency:.2f}/{hw.attention_efficiency:.2f}/{hw.hbm_efficiency:.2f}",
          f"{hw.hbm_capacity_bytes / 1e9:.0f}", f"{hw.hbm_bytes_per_s / GB:.0f}", f"{hw.d2h_bytes_per_s / GB:.0f}",
          f"{hw.h2d_bytes_per_s / GB:.0f}", f"{hw.duplex_h2d_factor:.2f}x", f"{hw.copy_latency_s * 1e6:.1f} us",
          "n/a" if hw.collective_bytes_per_s is None else f"{hw.collective_bytes_per_s / GB:.0f}")
         for name, hw in PRESETS.items()],
    )
    print("H2D duplex: factor on H2D bandwidth while a D2H copy runs; sources: docs/hardware.md")
    from ..nodes import NODES

    print()
    render_table(
        ("node", "GPUs", "GPU preset", "GPUs per switch", "uplink GB/s", "sockets", "host GB/s per socket",
         "host GB per socket", "copy GB/s per rank (lockstep)"),
        [(name, node.gpus, node.gpu, node.gpus_per_switch,
          "own link" if node.switch_uplink_bytes_per_s is None else f"{node.switch_uplink_bytes_per_s / GB:.0f}",
          node.sockets, f"{node.host_memory_bytes_per_s / GB:.1f}", f"{node.host_memory_bytes / 1e9:.0f}",
          f"{node.rank_hardware().d2h_bytes_per_s / GB:.0f} D2H / {node.rank_hardware().h2d_bytes_per_s / GB:.0f} H2D")
         for name, node in NODES.items()],
    )
    print("nodes: --hardware NODE gives one rank its share of the shared links; sources: docs/hardware.md")
    return 0
