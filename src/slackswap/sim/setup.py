"""What every simulation of a workload starts from, whatever the plan: its compute tasks and reader
lists, made once per workload and shared by the simulator's loops (simulator.py, fused_loops.py)."""

from __future__ import annotations

from dataclasses import dataclass

from ..schedule import op_of_backward_step
from ..workload import Workload

FORWARD, RECOMPUTE, BACKWARD = "forward", "recompute", "backward"
# Event kinds on the heap: a compute task's end, or the end of the copy in flight one way (the
# direction itself, "d2h" or "h2d").
COMPUTE_END = "compute_end"


@dataclass(slots=True)
class Task:
    kind: str
    op_index: int
    step: int  # backward step, -1 in forward
    first_of_step: bool = False
    last_of_group: bool = False


@dataclass(frozen=True)
class Setup:
    """What every simulation of one workload starts from, whatever the plan."""

    step_inputs: list[str]
    forward_tasks: tuple[Task, ...]
    backward_tasks: tuple[tuple[Task, Task], ...]  # per step: first of its step, after a group
    backward_alone: tuple[Task, ...]  # per step: the first of the pair
    bwd_readers: dict[str, tuple[int, ...]]  # per saved tensor, the ops whose backward reads it
    fwd_readers: dict[str, tuple[int, ...]]  # per tensor, the ops that take it as an input
    bwd_reads: tuple[tuple[str, ...], ...]  # per op, the saved tensors its backward reads
    inputs: tuple[tuple[str, ...], ...]  # per op, its inputs
    saved_output_bytes: tuple[int, ...]  # per op, the bytes of its saved outputs
    group_tasks: dict[tuple[int, tuple[str, ...]], tuple[Task, ...]]  # per (step, group's ops), its tasks


SETUPS: dict[int, tuple[Workload, Setup]] = {}


def setup_of(workload: Workload) -> Setup:
    """The workload's Setup, made once while it is kept (for at most 16 workloads, as the planners'
    facts are): a planning call simulates the same workload dozens of times."""
    held = SETUPS.get(id(workload))
    if held is not None and held[0] is workload:
        return held[1]
    n = len(workload.ops)
    bwd_readers: dict[str, list[int]] = {}
    fwd_readers: dict[str, list[int]] = {}
    for i, op in enumerate(workload.ops):
        for t in workload.bwd_reads[op.name]:
            bwd_readers.setdefault(t, []).append(i)
        for t in op.inputs:
            fwd_readers.setdefault(t, []).append(i)
    backward_tasks = tuple((Task(BACKWARD, op_of_backward_step(n, k), k, True),
                            Task(BACKWARD, op_of_backward_step(n, k), k, False)) for k in range(n))
    setup = Setup(
        step_inputs=[t.name for t in workload.tensors if t.producer is None and t.is_saved],
        forward_tasks=tuple(Task(FORWARD, i, -1) for i in range(n)),
        backward_tasks=backward_tasks,
        backward_alone=tuple(first for first, _ in backward_tasks),
        bwd_readers={t: tuple(v) for t, v in bwd_readers.items()},
        fwd_readers={t: tuple(v) for t, v in fwd_readers.items()},
        bwd_reads=tuple(workload.bwd_reads[op.name] for op in workload.ops),
        inputs=tuple(op.inputs for op in workload.ops),
        group_tasks={},
        saved_output_bytes=tuple(sum(workload.size_bytes_of[o] for o in outputs) for outputs in workload.saved_outputs),
    )
    if len(SETUPS) > 16:
        SETUPS.clear()
    SETUPS[id(workload)] = (workload, setup)
    return setup


def swapped_of(swapped: set[str], readers: dict[str, tuple[int, ...]], reads: tuple[tuple[str, ...], ...],
                n: int) -> list[tuple[str, ...]]:
    """Per op index i, the tensors of ``reads[i]`` in ``swapped``, in their order (found from the swapped
    tensors' ``readers``: the other ops read none)."""
    out: list[tuple[str, ...]] = [()] * n
    for name in swapped:
        for i in readers.get(name, ()):
            if not out[i]:  # not found yet: once found it holds ``name`` at least
                read = reads[i]
                out[i] = read if swapped.issuperset(read) else tuple([t for t in read if t in swapped])
    return out
