"""Node presets: whole servers whose GPUs share PCIe switches and the host's memory.

A Node names the GPU preset of each of its ranks and the links the ranks share: how many GPUs
hang off one PCIe switch and the bandwidth of that switch's uplink to the CPU, and per CPU socket
the host memory bandwidth and capacity. While k GPUs on one switch copy host-to-device (or
device-to-host) at the same time, each gets at most uplink / k; while m GPUs of a socket copy,
each gets at most the socket's memory bandwidth / m; while n GPUs of the node copy, each gets at
most the node's measured aggregate host copy rate / n (where one was measured); and never more
than its own link.
Every constant in NODES cites its source; docs/hardware.md discusses them.

``Node.rank_hardware()`` is the Hardware of one rank when every rank runs the same plan in
lockstep (all GPUs of a switch copy together): planners plan for that share, and
``get_hardware`` resolves a node preset name to it. ``slackswap.sim.node.simulate_node`` runs
the ranks themselves with their copies sharing the links, optionally skewed in time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .errors import ValidationError
from .gpus import PRESETS, Hardware
from .units import GB


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    name: str
    description: str
    gpu: str
    """Hardware preset of each GPU (its own host link is its rate when it copies alone)."""
    gpus: int
    gpus_per_switch: int
    """GPUs behind one PCIe switch uplink; 1 with ``switch_uplink_bytes_per_s`` None: each GPU has its own link."""
    switch_uplink_bytes_per_s: float | None
    """Bandwidth of one switch's uplink to the CPU, per direction."""
    sockets: int
    host_memory_bytes_per_s: float
    """Memory bandwidth of one CPU socket."""
    host_memory_bytes: int
    """Host memory of one CPU socket (pinned copies of swapped tensors live there)."""
    host_copy_bytes_per_s: float | None = None
    """What all GPUs of the node copying the same way move in total, per direction, as measured with
    every GPU copying; None where no such measurement exists (then only the links above limit it)."""
    sources: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.gpu not in PRESETS:
            raise ValidationError(f"node {self.name!r}: gpu {self.gpu!r} is not a hardware preset")
        for key in ("gpus", "gpus_per_switch", "sockets", "host_memory_bytes"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValidationError(f"node.{key} must be a positive integer, got {value!r}")
        if self.gpus % self.sockets or self.gpus % self.gpus_per_switch:
            raise ValidationError(f"node {self.name!r}: gpus ({self.gpus}) must divide evenly over sockets and switches")
        if (self.switch_uplink_bytes_per_s is None) != (self.gpus_per_switch == 1):
            raise ValidationError(f"node {self.name!r}: give a switch uplink exactly when GPUs share a switch")
        if self.host_copy_bytes_per_s is not None and not self.host_copy_bytes_per_s > 0:
            raise ValidationError(f"node.host_copy_bytes_per_s must be positive or None, got {self.host_copy_bytes_per_s!r}")

    @property
    def hardware(self) -> Hardware:
        return PRESETS[self.gpu]

    @property
    def gpus_per_socket(self) -> int:
        return self.gpus // self.sockets

    def switch_of(self, rank: int) -> int:
        return rank // self.gpus_per_switch

    def socket_of(self, rank: int) -> int:
        return rank // self.gpus_per_socket

    def copy_rate_bytes_per_s(self, direction: str, copying_on_switch: int, copying_on_socket: int,
                              copying_on_node: int = 1) -> float:
        """One GPU's copy rate in ``direction`` ('d2h' or 'h2d') while that many GPUs of its
        switch, of its socket and of the node (itself included) copy the same way."""
        hw = self.hardware
        rate = hw.d2h_bytes_per_s if direction == "d2h" else hw.h2d_bytes_per_s
        if self.switch_uplink_bytes_per_s is not None:
            rate = min(rate, self.switch_uplink_bytes_per_s / max(1, copying_on_switch))
        if self.host_copy_bytes_per_s is not None:
            rate = min(rate, self.host_copy_bytes_per_s / max(1, copying_on_node))
        return min(rate, self.host_memory_bytes_per_s / max(1, copying_on_socket))

    def rank_hardware(self) -> Hardware:
        """One rank's Hardware when all ranks copy in lockstep: its share of the shared links, and
        of its socket's memory for pinned copies (``pinned_host_bytes``, which planners respect)."""
        hw = self.hardware
        share = {d: self.copy_rate_bytes_per_s(d, self.gpus_per_switch, self.gpus_per_socket, self.gpus)
                 for d in ("d2h", "h2d")}
        return hw.replace(
            name=self.name, description=f"one of {self.gpus} ranks of {self.description}, copying in lockstep",
            d2h_bytes_per_s=share["d2h"], h2d_bytes_per_s=share["h2d"],
            pinned_host_bytes=self.host_memory_bytes // self.gpus_per_socket, sources=hw.sources + self.sources,
        )

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["sources"] = list(self.sources)
        return data


NODES: dict[str, Node] = {
    "dgx-a100": Node(
        name="dgx-a100", description="8x A100 SXM4 80GB, two GPUs per PCIe 4.0 switch, 2x AMD EPYC 7742",
        gpu="a100-80gb-pcie4", gpus=8,
        # DGX A100 system architecture: four PCIe 4.0 switches, each with two GPUs (and two NICs) and
        # an x16 uplink to a CPU; one GPU alone already fills that x16 link (24 GB/s measured,
        # nvbandwidth #11, #53), so the uplink is the same 24 GB/s per direction.
        gpus_per_switch=2, switch_uplink_bytes_per_s=24 * GB,
        # DGX A100 640GB datasheet: 2 TB system memory over two sockets; EPYC 7742: 8 channels of
        # DDR4-3200 = 204.8 GB/s per socket.
        sockets=2, host_memory_bytes_per_s=204.8 * GB, host_memory_bytes=1024 * 10**9,
        # nvbandwidth #11: with all eight A100s copying at once each moved 5-6 GB/s, 40-48 GB/s in all,
        # half of what the four switch uplinks (4 x 24 GB/s) and far less than host memory allow. What
        # limits it beyond the switches (the CPUs' I/O fabric, the host buffers' NUMA placement) is not
        # isolated by any published measurement, so the node carries the measured total: 44 GB/s, the
        # middle of the range (5.5 GB/s per GPU with all eight copying; two alone still get 12 each).
        host_copy_bytes_per_s=44 * GB,
        sources=("NVIDIA DGX A100 datasheet and system architecture white paper", "AMD EPYC 7742 specifications",
                 "nvbandwidth issues #11, #53"),
    ),
    "dgx-h100": Node(
        name="dgx-h100", description="8x H100 SXM5 80GB on PCIe 5.0, 2x Intel Xeon Platinum 8480C",
        gpu="h100-sxm-pcie5", gpus=8,
        # Two GPUs per PCIe 5.0 switch as on DGX A100 (assumed: no published per-switch measurement
        # was found); the uplink is x16 PCIe 5.0 at the ~50 GB/s copy-engine planning figure.
        gpus_per_switch=2, switch_uplink_bytes_per_s=50 * GB,
        # DGX H100 datasheet: 2 TB system memory, two sockets; Xeon 8480C: 8 channels of DDR5-4800
        # = 307.2 GB/s per socket.
        sockets=2, host_memory_bytes_per_s=307.2 * GB, host_memory_bytes=1024 * 10**9,
        sources=("NVIDIA DGX H100 datasheet", "Intel Xeon Platinum 8480+ specifications", "nvbandwidth issue #24"),
    ),
    "gh200-x4": Node(
        name="gh200-x4", description="4x GH200 superchips, each GPU with its own NVLink-C2C link to its Grace CPU",
        gpu="gh200-c2c", gpus=4, gpus_per_switch=1, switch_uplink_bytes_per_s=None,
        # GH200 datasheet: up to 480 GB LPDDR5X per Grace CPU at up to 512 GB/s; one GPU per socket.
        sockets=4, host_memory_bytes_per_s=512 * GB, host_memory_bytes=480 * 10**9,
        sources=("NVIDIA GH200 Grace Hopper Superchip datasheet", "nvbandwidth issues #23, #41"),
    ),
}


def get_node(name: str) -> Node:
    try:
        return NODES[name]
    except (KeyError, TypeError):
        from .errors import UnknownNameError

        raise UnknownNameError(f"unknown node {name!r}: choose one of {', '.join(NODES)}") from None
