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


def parse_budget(budget: float | int | str, unconstrained_peak_bytes: int) -> int:
    """The activation budget in bytes, read the same way by the API and the command line.

    A float in (0, 1] is a fraction of the unconstrained peak; an int is bytes; a string is a
    fraction when it reads as a number of at most 1 ('0.5'), else a size ('12GiB', '800B').
    A byte count above the unconstrained peak is refused: everything fits, so 1.0 says it.
    """
    if isinstance(budget, bool):
        raise BudgetError(f"budget must be a fraction, a byte count or a size string, got {budget!r}")
    if isinstance(budget, str):
        text = budget.strip()
        try:
            fraction = float(text)
        except ValueError:
            fraction = None
        if fraction is not None and (fraction <= 1.0 or not math.isfinite(fraction)):
            if not math.isfinite(fraction) or fraction <= 0:
                raise BudgetError(f"budget {text!r} must be a fraction above 0 and at most 1, or a size such as 12GiB")
            return max(1, int(fraction * unconstrained_peak_bytes))
        size_bytes = parse_size_bytes(text)
    elif isinstance(budget, int):
        if budget <= 0:
            raise BudgetError(f"budget of {budget} bytes must be positive")
        size_bytes = budget
    elif isinstance(budget, float):
        if not 0 < budget <= 1:
            raise BudgetError(f"budget fraction {budget!r} must be above 0 and at most 1 (1.0 keeps everything)")
        return max(1, int(budget * unconstrained_peak_bytes))
    else:
        raise BudgetError(f"budget must be a fraction, a byte count or a size string, got {type(budget).__name__}")
    if size_bytes > unconstrained_peak_bytes:
        raise BudgetError(
            f"budget {format_bytes(size_bytes)} is above the unconstrained peak of {format_bytes(unconstrained_peak_bytes)} "
            f"({unconstrained_peak_bytes} bytes): everything fits; use 1.0 or a smaller size"
        )
    return size_bytes


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
