"""Pad to a few lengths: fewer input shapes, so slackswap.auto profiles and plans fewer times."""

from __future__ import annotations

from typing import Sequence

from .errors import ValidationError


def bucket_length(length: int, buckets: Sequence[int]) -> int:
    """The smallest of ``buckets`` that is at least ``length``.

    Padding every batch to its bucket (``torch.nn.functional.pad(tokens, (0, bucket - n))``, or
    ``pad_to_multiple_of=`` in a Hugging Face collator) makes a run see at most ``len(buckets)``
    sequence lengths instead of one per batch."""
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        raise ValidationError(f"length must be an integer >= 0, got {length!r}")
    sizes = sorted(buckets)
    if not sizes or any(isinstance(b, bool) or not isinstance(b, int) or b <= 0 for b in sizes):
        raise ValidationError(f"buckets must be positive integers, got {list(buckets)!r}")
    for size in sizes:
        if size >= length:
            return size
    raise ValidationError(f"length {length} is longer than the largest bucket ({sizes[-1]}): add a bucket of at "
                          f"least {length} or truncate the batch")
