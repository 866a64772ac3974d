"""Hardware by name: a single-GPU preset, one rank of a node preset, or a hardware JSON file.

The ``Hardware`` type and the single-GPU ``PRESETS`` live in slackswap.gpus, below the node
presets (slackswap.nodes) that are built from them; this module sits above both, so imports run
one way. Users import all three names from here.
"""

from __future__ import annotations

import os

from .errors import UnknownNameError
from .gpus import HARDWARE_FORMAT, PRESETS, Hardware
from .nodes import NODES

__all__ = ["DEFAULT_HARDWARE", "HARDWARE_FORMAT", "PRESETS", "Hardware", "get_hardware"]

DEFAULT_HARDWARE = "a100-80gb-pcie4"
"""The preset used when none is named: the SlackSwap paper's setup (docs/hardware.md)."""


def get_hardware(name_or_path: "str | os.PathLike | Hardware") -> Hardware:
    """A preset by name, a node preset by name (one rank's share of its links, slackswap.nodes),
    a hardware JSON file by path, or a Hardware as it is."""
    if isinstance(name_or_path, Hardware):
        return name_or_path
    if isinstance(name_or_path, os.PathLike):
        name_or_path = os.fspath(name_or_path)
    if not isinstance(name_or_path, str):
        raise UnknownNameError(
            f"hardware must be a preset name, a .json path or a Hardware, got {type(name_or_path).__name__}: "
            f"choose one of {', '.join(PRESETS)}"
        )
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    if name_or_path in NODES:
        return NODES[name_or_path].rank_hardware()
    if name_or_path.endswith(".json"):
        return Hardware.load(name_or_path)
    raise UnknownNameError(
        f"unknown hardware {name_or_path!r}: choose one of {', '.join(PRESETS)}, a node "
        f"({', '.join(NODES)}) or pass a hardware .json file"
    )
