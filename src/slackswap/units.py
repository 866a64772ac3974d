"""Byte and time units: parsing user input and printing with units."""

from __future__ import annotations

import math
import re

from .errors import BudgetError

KiB = 1024
MiB = 1024**2
GiB = 1024**3
GB = 10**9  # link and HBM bandwidths are quoted in decimal GB/s by vendors

_SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": KiB, "mib": MiB, "gib": GiB, "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size_bytes(text: str) -> int:
    """Parse '12GiB', '500MB', '1e9' into bytes. Raises BudgetError on anything else."""
    match = _SIZE_RE.match(str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SIZE_UNITS:
        raise BudgetError(
            f"cannot read size {text!r}: write a number of bytes with an optional unit, "
            "for example 12GiB, 800MiB or 2e9"
        )
    value = float(match.group(1)) * _SIZE_UNITS[unit]
    if not math.isfinite(value) or value <= 0:
        raise BudgetError(f"size {text!r} must be a positive, finite number of bytes")
    return int(round(value))


def format_bytes(n: float) -> str:
    """Human size with binary units: '1.50 GiB'."""
    n = float(n)
    for unit, scale in (("TiB", 1024**4), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def format_seconds(t: float) -> str:
    """Human duration: '12.3 ms', '4.56 s', '7.0 us'."""
    t = float(t)
    if abs(t) >= 1:
        return f"{t:.3f} s"
    if abs(t) >= 1e-3:
        return f"{t * 1e3:.2f} ms"
    return f"{t * 1e6:.1f} us"
