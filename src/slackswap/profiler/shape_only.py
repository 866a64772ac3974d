"""aten ops that read a tensor argument only for its shape, dtype, device and strides.

``empty_like(x)``, the first op of every dropout mask, uses ``x`` only to size the mask: its values
are never read. The profiler lists such an argument as the op's *shape input* (Op.shape_inputs), not
as an input, so no recompute group re-runs ``x``'s producer to rebuild the mask; the runtime re-runs
the op on a stand-in tensor of the recorded shape, strides, dtype and device instead
(:func:`stand_in`), and the op cannot tell the difference.

In every op listed, the shape-only argument is the first one (``self`` in the schema). The table is
the ops of this kind in native_functions.yaml; the examples' and the Hugging Face test models'
profiles use ``empty_like`` (dropout), ``zeros_like``, ``full_like``, ``new_zeros`` (T5) and
``new_ones`` (BERT).
"""

from __future__ import annotations

from typing import Any

import torch

SHAPE_ONLY_OPS: dict[str, frozenset[str] | None] = {
    # op (overload packet) -> the overloads whose ``self`` is shape-only (None: every overload)
    "empty_like": None, "zeros_like": None, "ones_like": None, "full_like": None,
    "rand_like": None, "randn_like": None, "randint_like": None,
    "new_empty": None, "new_empty_strided": None, "new_zeros": None, "new_ones": None, "new_full": None,
    # bernoulli(x, p) with a float p draws a mask of x's shape; bernoulli(x) reads x as probabilities
    "bernoulli": frozenset({"p", "float_out"}),
}


def shape_only_argument(func: Any, args: tuple) -> torch.Tensor | None:
    """The tensor argument ``func`` reads only for its metadata, or None."""
    packet = getattr(func, "overloadpacket", None)
    if packet is None or not args or not isinstance(args[0], torch.Tensor):
        return None
    if packet.__name__ not in SHAPE_ONLY_OPS:
        return None
    overloads = SHAPE_ONLY_OPS[packet.__name__]
    if overloads is not None and getattr(func, "_overloadname", None) not in overloads:
        return None
    x = args[0]
    # A stand-in is a plain strided tensor: leave other layouts and tensor subclasses as inputs.
    return x if x.layout == torch.strided and type(x) in (torch.Tensor, torch.nn.Parameter) else None


def stand_in(shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialized tensor with ``shape``, ``stride``, ``dtype`` and ``device``: what a shape-only
    argument is to the op. The strides matter: ``*_like`` ops lay their output out like their input,
    and torch fills a non-contiguous tensor with other random numbers than a contiguous one
    (``randn_like`` of a transposed view)."""
    return torch.empty_strided(shape, stride, dtype=dtype, device=device)
