"""Tiny chain workloads whose simulated results can be worked out by hand.

``chain(n)`` is n ops in a line: op{i} reads a{i-1} (a step input ``x`` for op0) and
produces a{i}; like a matrix multiply, each op saves its input for its backward. The
last op's output is transient (the loss). So the saved tensors are ``x`` (a step
input, always kept) and a0 .. a{n-2}, with a{i} read by the backward of op{i+1}.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from ..workload import Op, Tensor, Workload


def chain(
    n: int,
    *,
    fwd_time_s: float | Sequence[float] = 1.0,
    bwd_time_s: float | Sequence[float] = 2.0,
    size_bytes: int | Sequence[int] = 100,
    input_bytes: int = 1,
    name: str | None = None,
) -> Workload:
    """A chain of ``n`` >= 2 ops. Scalars apply to every op; sequences give one value per op
    (``size_bytes`` per produced tensor a0 .. a{n-1})."""
    def per_op(value, i):
        return value[i] if isinstance(value, (list, tuple)) else value

    ops, tensors = [], [Tensor(name="x", size_bytes=input_bytes, producer=None, bwd_readers=("op0",))]
    for i in range(n):
        inp = "x" if i == 0 else f"a{i - 1}"
        ops.append(Op(
            name=f"op{i}", layer=i, kind="gemm",
            fwd_time_s=float(per_op(fwd_time_s, i)), bwd_time_s=float(per_op(bwd_time_s, i)),
            flops=0.0, bytes_accessed=0.0, inputs=(inp,), outputs=(f"a{i}",),
        ))
        readers = (f"op{i + 1}",) if i < n - 1 else ()
        tensors.append(Tensor(name=f"a{i}", size_bytes=int(per_op(size_bytes, i)), producer=f"op{i}", bwd_readers=readers))
    return Workload(name=name or f"chain{n}", ops=tuple(ops), tensors=tuple(tensors), meta={"kind": "synthetic chain"})


def dag(
    ops: Sequence[tuple[str, Sequence[str], Sequence[str]]],
    sizes: Mapping[str, int],
    readers: Mapping[str, Sequence[str]],
    *,
    fwd_time_s: float | Mapping[str, float] = 1.0,
    bwd_time_s: float | Mapping[str, float] = 2.0,
    name: str = "dag",
) -> Workload:
    """A small branchy workload written out by hand.

    ``ops`` lists (op name, input tensors, output tensors) in execution order; ``sizes`` gives
    every tensor's bytes (a tensor no op outputs is a step input); ``readers`` gives the ops whose
    backward reads each saved tensor (tensors left out are transient). Times are one value for
    every op or a mapping by op name.
    """
    def per_op(value, op_name):
        return value[op_name] if isinstance(value, Mapping) else value

    producer = {out: op_name for op_name, _, outputs in ops for out in outputs}
    built = tuple(
        Op(name=op_name, layer=i, kind="other", fwd_time_s=float(per_op(fwd_time_s, op_name)),
           bwd_time_s=float(per_op(bwd_time_s, op_name)), flops=0.0, bytes_accessed=0.0,
           inputs=tuple(inputs), outputs=tuple(outputs))
        for i, (op_name, inputs, outputs) in enumerate(ops)
    )
    tensors = tuple(
        Tensor(name=t, size_bytes=size, producer=producer.get(t), bwd_readers=tuple(readers.get(t, ())))
        for t, size in sizes.items()
    )
    return Workload(name=name, ops=built, tensors=tensors, meta={"kind": "synthetic dag"})
