"""Event-by-event simulation of one training step: one compute stream, two copy streams.

The exact rules are written in docs/simulator.md; this file implements them. Events
are ordered by (time, sequence number) so equal times resolve in the order they were
scheduled, which makes every run bit-for-bit repeatable.
"""

from __future__ import annotations

import copy
import heapq
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Callable

from ..errors import InfeasiblePlanError
from ..hardware import Hardware
from ..plans import Action, Plan
from ..schedule import check_plan, make_plan, op_of_backward_step
from ..timeline import Event, Timeline
from ..units import format_bytes
from ..workload import Workload

_FORWARD, _RECOMPUTE, _BACKWARD = "forward", "recompute", "backward"
# Event kinds on the heap: a compute task's end, or the end of the copy in flight one way (the
# direction itself, "d2h" or "h2d").
_COMPUTE_END = "compute_end"


@dataclass(slots=True)
class _Task:
    kind: str
    op_index: int
    step: int  # backward step, -1 in forward
    first_of_step: bool = False
    last_of_group: bool = False


@dataclass(slots=True)
class _Copy:
    """A copy in flight. Its rate may change while it runs (duplex slowdown), so it keeps
    the bytes still to move and a generation number that invalidates stale end events."""

    tensor: str
    size_bytes: int
    start_s: float
    transfer_start_s: float
    remaining: float
    rate: float = 0.0
    last_s: float = 0.0
    generation: int = 0


@dataclass(frozen=True)
class _Setup:
    """What every simulation of one workload starts from, whatever the plan."""

    step_inputs: list[str]
    forward_tasks: tuple[_Task, ...]
    backward_tasks: tuple[tuple[_Task, _Task], ...]  # per step: first of its step, after a group
    backward_alone: tuple[_Task, ...]  # per step: the first of the pair
    bwd_readers: dict[str, tuple[int, ...]]  # per saved tensor, the ops whose backward reads it
    fwd_readers: dict[str, tuple[int, ...]]  # per tensor, the ops that take it as an input
    bwd_reads: tuple[tuple[str, ...], ...]  # per op, the saved tensors its backward reads
    inputs: tuple[tuple[str, ...], ...]  # per op, its inputs
    saved_output_bytes: tuple[int, ...]  # per op, the bytes of its saved outputs
    group_tasks: dict[tuple[int, tuple[str, ...]], tuple[_Task, ...]]  # per (step, group's ops), its tasks


_SETUPS: dict[int, tuple[Workload, _Setup]] = {}


def _setup_of(workload: Workload) -> _Setup:
    """The workload's _Setup, made once while it is kept (for at most 16 workloads, as the planners'
    facts are): a planning call simulates the same workload dozens of times."""
    held = _SETUPS.get(id(workload))
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
    backward_tasks = tuple((_Task(_BACKWARD, op_of_backward_step(n, k), k, True),
                            _Task(_BACKWARD, op_of_backward_step(n, k), k, False)) for k in range(n))
    setup = _Setup(
        step_inputs=[t.name for t in workload.tensors if t.producer is None and t.is_saved],
        forward_tasks=tuple(_Task(_FORWARD, i, -1) for i in range(n)),
        backward_tasks=backward_tasks,
        backward_alone=tuple(first for first, _ in backward_tasks),
        bwd_readers={t: tuple(v) for t, v in bwd_readers.items()},
        fwd_readers={t: tuple(v) for t, v in fwd_readers.items()},
        bwd_reads=tuple(workload.bwd_reads[op.name] for op in workload.ops),
        inputs=tuple(op.inputs for op in workload.ops),
        group_tasks={},
        saved_output_bytes=tuple(sum(workload.size_bytes_of[o] for o in outputs) for outputs in workload.saved_outputs),
    )
    if len(_SETUPS) > 16:
        _SETUPS.clear()
    _SETUPS[id(workload)] = (workload, setup)
    return setup


def _swapped_of(swapped: set[str], readers: dict[str, tuple[int, ...]], reads: tuple[tuple[str, ...], ...],
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


class _Simulation:
    # What a run changes as it goes (everything else is set up once and shared by a fork's copy).
    _RUN_STATE = ("present", "events", "memory", "group_allocs", "trigger_s", "d2h_queue", "d2h_done", "queued_s",
                  "d2h_end_s", "last_copy_end_s", "h2d_issued", "h2d_done", "cancelled")

    def __init__(self, workload: Workload, hardware: Hardware, plan: Plan, budget_bytes: float,
                 tensor_log: list | None = None, *, lift_to: float | None = None) -> None:
        self.w = workload
        # With ``lift_to``, the first time ``budget_bytes`` binds, the state is kept in ``fork``
        # and the run goes on under ``lift_to`` (``_lift_budget``).
        self.lift_to = lift_to
        self.fork: _Simulation | None = None
        self.log = tensor_log
        self.hw = hardware
        self.plan = plan
        self.actions = plan.actions
        self.budget = budget_bytes
        self.size = workload.size_bytes_of
        self.saved_outputs = workload.saved_outputs
        setup = _setup_of(workload)
        self.step_inputs = setup.step_inputs
        n = len(workload.ops)
        self.n = n
        self.tasks = self._build_tasks(setup)
        self.n_tasks = len(self.tasks)
        self.setup = setup
        self.heap: list = []
        self.seq = 0
        self.now = 0.0
        self.mem = 0
        self.peak = 0
        self.present: set[str] = set()
        # Event fields as plain tuples, made into Events once at the end (or never, for a planner
        # that reads only the totals): building an Event costs more than the step it records.
        self.events: list[tuple] = []
        self.memory: list[tuple[float, int]] = [(0.0, 0)]
        # compute stream
        self.ci = 0
        self.compute_busy = False
        self.compute_end_s = 0.0  # the step time: a cancelled swap's copy out may end after the last task
        self.idle_since = 0.0
        self.data_ready_at: float | None = None
        self.group_allocs: list[str] = []
        self.fwd_done_upto = -1  # index of the last completed forward op
        self.triggered_step = -1
        self.trigger_s: dict[int, float] = {}  # when each step's trigger fired
        # copy streams
        self.d2h_queue: list[str] = []
        self.d2h_head = 0
        self.d2h: _Copy | None = None
        self.d2h_done: set[str] = set()
        self.queued_s: dict[str, float] = {}  # when each copy out joined its queue
        self.d2h_end_s: dict[str, float] = {}  # when each copy out ended
        self.last_copy_end_s = {"d2h": -math.inf, "h2d": -math.inf}
        self.h2d_order = [c.tensor for c in plan.schedule.copy_backs]
        self.h2d_head = 0
        # The backward step the head of the copy-back order waits for (set when it was tried too
        # early): until that step triggers, trying the stream again changes nothing.
        self.h2d_gate = -1
        self.h2d: _Copy | None = None
        self.h2d_issued: set[str] = set()  # started or skipped
        self.h2d_done: set[str] = set()
        self.cancelled: set[str] = set()  # swaps whose tensor was still on the device when needed back
        # totals
        self.d2h_bytes = 0
        self.h2d_bytes = 0
        self.recompute_time = 0.0
        self.stall_copy = 0.0
        self.stall_memory = 0.0

    # ---- setup ----------------------------------------------------------------------
    # Per op, the swapped tensors its backward reads and its forward inputs: what a backward or
    # recompute task may wait for (found once per simulation, not once per try; the fused loops
    # look at the op's reads themselves, which costs less than finding these). Only the ops that
    # read a swapped tensor are looked at; the others wait for nothing.
    @cached_property
    def _swapped(self) -> set[str]:
        swap = Action.SWAP
        return {name for name, a in self.actions.items() if a is swap}

    @cached_property
    def swapped_bwd_reads(self) -> list[tuple[str, ...]]:
        return _swapped_of(self._swapped, self.setup.bwd_readers, self.setup.bwd_reads, self.n)

    @cached_property
    def swapped_inputs(self) -> list[tuple[str, ...]]:
        return _swapped_of(self._swapped, self.setup.fwd_readers, self.setup.inputs, self.n)

    @cached_property
    def h2d_position(self) -> dict[str, int]:
        """Each copy back's place in the copy-back order (read only when a copy may go out of order)."""
        return {name: i for i, name in enumerate(self.h2d_order)}

    def _build_tasks(self, setup: "_Setup") -> list[_Task]:
        # Tasks are never changed once made, so the forward and backward ones are shared by every
        # simulation of the workload (a backward task comes in two: first of its step or not), and
        # so are a step's recompute tasks and backward task for each group it is given.
        tasks = list(setup.forward_tasks)
        backward, alone = setup.backward_tasks, setup.backward_alone
        groups = self.plan.schedule.group_at_step()
        made = setup.group_tasks
        done = 0  # steps before this one are in ``tasks``
        for k in sorted(k for k in groups if 0 <= k < self.n):
            tasks.extend(alone[done:k])
            ops = groups[k].ops
            step = made.get((k, ops))
            if step is None:
                if len(made) > 4096:  # made for plans long gone
                    made.clear()
                op_index, last = self.w.op_index, len(ops) - 1
                step = made[(k, ops)] = (*(_Task(_RECOMPUTE, op_index[name], k, j == 0, j == last)
                                           for j, name in enumerate(ops)), backward[k][1] if ops else backward[k][0])
            tasks.extend(step)
            done = k + 1
        tasks.extend(alone[done:])
        return tasks

    # ---- memory -----------------------------------------------------------------------
    def _alloc(self, names: list[str]) -> None:
        for name in names:
            self.present.add(name)
            self.mem += self.size[name]
            if self.log is not None:
                self.log.append((self.now, name, True))
        if names:
            self.peak = max(self.peak, self.mem)
            self.memory.append((self.now, self.mem))

    def _free(self, name: str) -> None:
        if name in self.present:
            self.present.discard(name)
            self.mem -= self.size[name]
            if self.log is not None:
                self.log.append((self.now, name, False))
            self.memory.append((self.now, self.mem))

    def _fits(self, nbytes: int) -> bool:
        return self.mem + nbytes <= self.budget

    # ---- event queue ------------------------------------------------------------------
    def _push(self, time_s: float, kind: str, payload) -> None:
        heapq.heappush(self.heap, (time_s, self.seq, kind, payload))
        self.seq += 1

    # ---- copies -------------------------------------------------------------------------
    def _rate_of(self, direction: str) -> float:
        if direction == "d2h":
            slow = self.hw.duplex_d2h_factor if self.h2d is not None else 1.0
            return self.hw.d2h_bytes_per_s * slow
        slow = self.hw.duplex_h2d_factor if self.d2h is not None else 1.0
        return self.hw.h2d_bytes_per_s * slow

    def _advance(self, copy: _Copy) -> None:
        """Account the bytes moved since the copy's last update."""
        begin = max(copy.last_s, copy.transfer_start_s)
        if self.now > begin:
            copy.remaining = max(0.0, copy.remaining - (self.now - begin) * copy.rate)
        copy.last_s = self.now

    def _schedule_end(self, copy: _Copy, direction: str) -> None:
        copy.generation += 1
        end_s = max(self.now, copy.transfer_start_s) + copy.remaining / copy.rate
        self._push(end_s, direction, (copy, copy.generation))

    def _rerate(self, direction: str) -> None:
        """The other direction started or stopped: re-time the copy in flight this way."""
        copy = self.d2h if direction == "d2h" else self.h2d
        if copy is None:
            return
        new_rate = self._rate_of(direction)
        if new_rate == copy.rate:
            return
        self._advance(copy)
        copy.rate = new_rate
        self._schedule_end(copy, direction)

    def _start_copy(self, direction: str, tensor: str, queued_s: float) -> _Copy:
        size = self.size[tensor]
        latency = self.hw.copy_latency_s
        if self.last_copy_end_s[direction] == self.now:
            # Back to back: it was launched while the copy before it ran (docs/simulator.md).
            transfer_start_s = max(self.now, queued_s + latency)
        else:
            transfer_start_s = self.now + latency
        copy = _Copy(tensor, size, self.now, transfer_start_s, float(size), last_s=self.now)
        if direction == "d2h":
            self.d2h = copy
        else:
            self.h2d = copy
        copy.rate = self._rate_of(direction)
        self._schedule_end(copy, direction)
        self._rerate("h2d" if direction == "d2h" else "d2h")
        return copy

    def _try_d2h(self) -> bool:
        while self.d2h_head < len(self.d2h_queue) and self.d2h_queue[self.d2h_head] in self.cancelled:
            self.d2h_head += 1  # the swap was cancelled before its copy out began
        if self.d2h is not None or self.d2h_head >= len(self.d2h_queue):
            return False
        tensor = self.d2h_queue[self.d2h_head]
        self.d2h_head += 1
        self._start_copy("d2h", tensor, self.queued_s[tensor])
        return True

    def _try_h2d(self) -> bool:
        order = self.h2d_order
        while self.h2d_head < len(order) and order[self.h2d_head] in self.h2d_issued:
            self.h2d_head += 1
        if self.h2d is not None or self.h2d_head >= len(order):
            return False
        tensor = order[self.h2d_head]
        if self.plan.prefetch_step[tensor] > self.triggered_step:
            self.h2d_gate = self.plan.prefetch_step[tensor]
            return False
        if self._issue_h2d(tensor):
            return True
        # The head does not fit: a tensor the idle compute stream waits for may go first.
        for name in self._waited_for():
            if self._issue_h2d(name):
                return True
        return False

    def _issue_h2d(self, tensor: str) -> bool:
        """Skip or start the copy back of ``tensor``; False when it must wait."""
        if tensor in self.present:
            # Still on the device: a recompute group re-created it (the copy back is dropped), or
            # its copy out has not ended (the swap is cancelled). Nothing moves; the tensor now
            # stays until its last backward reader.
            if tensor in self.group_allocs:
                self.group_allocs.remove(tensor)
            if tensor not in self.d2h_done:
                self.cancelled.add(tensor)
            self.h2d_issued.add(tensor)
            self.h2d_done.add(tensor)
            return True
        if tensor not in self.d2h_done:
            return False
        if not self._fits(self.size[tensor]) and not self._lift_budget():
            return False
        self._alloc([tensor])
        self.h2d_issued.add(tensor)
        queued_s = max(self.trigger_s[self.plan.prefetch_step[tensor]], self.d2h_end_s[tensor])
        self._start_copy("h2d", tensor, queued_s)
        return True

    def _waited_for(self) -> list[str]:
        """Swapped tensors the compute stream, idle, waits for before its next task, in h2d order."""
        if self.compute_busy or self.ci >= len(self.tasks) or self.data_ready_at is not None:
            return []
        return self._waiting_on(self.tasks[self.ci])

    def _waiting_on(self, task: _Task) -> list[str]:
        """Swapped tensors ``task`` waits for (its data conditions fail on them), in h2d order."""
        op = self.w.ops[task.op_index]
        if task.kind == _BACKWARD:
            names = [t for t in self.w.bwd_reads[op.name] if self.actions[t] is Action.SWAP]
        elif task.kind == _RECOMPUTE:
            names = [t for t in op.inputs
                     if self.actions.get(t) is Action.SWAP and self.plan.prefetch_step[t] <= task.step]
        else:
            return []
        return sorted((t for t in names if t not in self.h2d_done), key=self.h2d_position.__getitem__)

    def _end_copy(self, direction: str, copy: _Copy) -> None:
        self.events.append((direction, "copy_out" if direction == "d2h" else "copy_in", copy.tensor,
                            copy.start_s, self.now, copy.size_bytes, self._current_step()))
        self.last_copy_end_s[direction] = self.now
        if direction == "d2h":
            self.d2h = None
            self.d2h_bytes += copy.size_bytes
            self.d2h_done.add(copy.tensor)
            self.d2h_end_s[copy.tensor] = self.now
            if self.w.last_fwd_use[copy.tensor] <= self.fwd_done_upto and copy.tensor not in self.cancelled:
                self._free(copy.tensor)
            self._rerate("h2d")
        else:
            self.h2d = None
            self.h2d_bytes += copy.size_bytes
            self.h2d_done.add(copy.tensor)
            self._rerate("d2h")

    def _current_step(self) -> int:
        return self.tasks[self.ci].step if self.ci < len(self.tasks) else self.n

    # ---- compute stream -----------------------------------------------------------------
    def _allocation(self, task: _Task) -> list[str]:
        if task.kind == _BACKWARD:
            return []
        present = self.present
        return [o for o in self.saved_outputs[task.op_index] if o not in present]

    def _try_compute(self) -> bool:
        if self.compute_busy or self.ci >= self.n_tasks:
            return False
        task = self.tasks[self.ci]
        kind = task.kind
        op_index = task.op_index
        now = self.now
        ready = self.data_ready_at
        if ready is None:
            done = self.h2d_done
            if kind == _RECOMPUTE:
                # A recompute op waits for inputs whose copy back has been issued for this step or earlier.
                prefetch = self.plan.prefetch_step
                for name in self.swapped_inputs[op_index]:
                    if prefetch[name] <= task.step and name not in done:
                        return False
            elif kind == _BACKWARD:
                # A backward op waits until every swapped tensor it reads is back on the device.
                for name in self.swapped_bwd_reads[op_index]:
                    if name not in done:
                        return False
            ready = self.data_ready_at = now
        alloc_bytes = 0
        if kind == _BACKWARD:
            alloc = None
        else:
            present, size = self.present, self.size
            alloc = [o for o in self.saved_outputs[op_index] if o not in present]
            for name in alloc:
                alloc_bytes += size[name]
        if self.mem + alloc_bytes > self.budget and not self._lift_budget():
            return False
        # start the task
        op = self.w.ops[op_index]
        if ready > self.idle_since:
            self.stall_copy += ready - self.idle_since
            self.events.append(("compute", "stall_copy", op.name, self.idle_since, ready, 0, task.step))
        if now > ready:
            self.stall_memory += now - ready
            self.events.append(("compute", "stall_memory", op.name, ready, now, 0, task.step))
        if alloc:
            self._alloc(alloc)
            if kind == _RECOMPUTE:
                self.group_allocs.extend(alloc)
            duration = op.fwd_time_s
        else:
            duration = op.bwd_time_s if kind == _BACKWARD else op.fwd_time_s
        self.compute_busy = True
        heapq.heappush(self.heap, (now + duration, self.seq, _COMPUTE_END, (task, now, alloc_bytes)))
        self.seq += 1
        return True

    def _end_compute(self, task: _Task, start_s: float, alloc_bytes: int) -> None:
        op = self.w.ops[task.op_index]
        now = self.now
        kind = task.kind
        self.events.append(("compute", kind, op.name, start_s, now, alloc_bytes, task.step))
        if kind == _FORWARD:
            self.fwd_done_upto = task.op_index
            actions = self.actions
            for name in self.saved_outputs[task.op_index]:
                if actions[name] is Action.SWAP:
                    self.d2h_queue.append(name)
                    self.queued_s[name] = now
            for name in self.w.last_fwd_use_of_saved[task.op_index]:
                action = actions[name]
                if action is Action.RECOMPUTE or (action is Action.SWAP and name in self.d2h_done):
                    self._free(name)
        elif kind == _RECOMPUTE:
            self.recompute_time += op.fwd_time_s
            if task.last_of_group:
                current = op_of_backward_step(self.n, task.step)
                for name in self.group_allocs:
                    keep = self.actions[name] is Action.RECOMPUTE and self.w.last_bwd_reader[name] <= current
                    if not keep:
                        self._free(name)
                self.group_allocs = []
        else:
            for name in self.w.last_bwd_read_of[task.op_index]:
                self._free(name)
        self.compute_busy = False
        self.compute_end_s = now
        ci = self.ci = self.ci + 1
        self.idle_since = now
        self.data_ready_at = None
        if ci < self.n_tasks and self.tasks[ci].first_of_step:
            step = self.triggered_step = self.tasks[ci].step
            self.trigger_s[step] = now

    # ---- main loop ----------------------------------------------------------------------
    def _dispatch(self) -> None:
        # Each stream is tried only when it is free and has work left (the tries' own first
        # checks, taken here to save most calls: dispatching runs at every instant). Starting a
        # compute task or a copy out enables nothing on the streams tried after it in the same
        # pass, and neither stream's try changes while the other two fail: only a copy back
        # issued (or skipped, which can make the compute stream's inputs ready) needs another pass.
        while True:
            if not self.compute_busy and self.ci < self.n_tasks:
                self._try_compute()
            if self.d2h is None and self.d2h_head < len(self.d2h_queue):
                self._try_d2h()
            if not (self.h2d is None and self.h2d_head < len(self.h2d_order)
                    and self.h2d_gate <= self.triggered_step and self._try_h2d()):
                return

    def run(self) -> None:
        self._alloc(list(self.step_inputs))
        if self.mem > self.budget and not self._lift_budget():
            self._raise_over_inputs()
        self._run_on()

    def _run_on(self) -> None:
        # _dispatch and _run_events, the plain event loop, do what these two loops do step for step
        # (tests/test_simulator.py compares them on random plans); node.py's ranks run that loop.
        if not self.h2d_order and Action.SWAP not in self.actions.values():
            self._run_copy_free()
            return
        while not self._run_with_copies():
            self._lift_budget()

    def _raise_over_inputs(self) -> None:
        need, budget = self.mem, int(self.budget)
        raise InfeasiblePlanError(
            f"plan cannot fit its budget: the step inputs alone take {format_bytes(need)} ({need} bytes) "
            f"with {format_bytes(budget)} ({budget} bytes) allowed; raise the budget",
            needed_bytes=need, budget_bytes=budget,
        )

    def resume(self) -> None:
        """Run a fork (``_lift_budget``) on to the end. It was copied at a memory check that fails
        under its budget, in the middle of a dispatch pass; a pass tried again from its start does
        what the rest of that pass would do (a stream's try changes nothing when it fails, and one
        that started its work is busy), so the run goes on with a dispatch. Under a budget the
        memory in use stays within it once the step inputs fit, so the inputs' check only raises
        for a fork copied there."""
        if self.mem > self.budget:
            self._raise_over_inputs()
        self._run_on()

    def _lift_budget(self) -> bool:
        """With ``lift_to``, at the first memory check that fails under the budget: keep a copy of
        the state as it is in ``fork`` (the run under the budget is this run up to here) and go on
        under ``lift_to``. False (the check fails) otherwise."""
        if self.lift_to is None:
            return False
        fork = copy.copy(self)
        for name in self._RUN_STATE:
            setattr(fork, name, copy.copy(getattr(self, name)))
        live = {}
        for direction in ("d2h", "h2d"):
            flight = getattr(self, direction)
            if flight is not None:
                live[id(flight)] = copy.copy(flight)
                setattr(fork, direction, live[id(flight)])
        # Copy ends hold their copy in flight, which the fork's own run re-times: its own.
        fork.heap = [e if e[2] is _COMPUTE_END or id(e[3][0]) not in live else (*e[:3], (live[id(e[3][0])], e[3][1]))
                     for e in self.heap]
        fork.lift_to = None
        self.fork = fork
        self.budget, self.lift_to = self.lift_to, None
        return True

    def _run_events(self) -> None:
        heap = self.heap
        while heap:
            top = heap[0]
            if top[2] is not _COMPUTE_END and top[3][1] != top[3][0].generation:
                heapq.heappop(heap)  # a copy end re-timed by a change of the other direction
                continue
            self._next_instant()
        if self.ci < len(self.tasks):
            self._raise_infeasible()

    def _run_copy_free(self) -> None:
        """``run`` for a plan that copies nothing: the compute stream alone, one task after the
        other, each started at the instant the one before ends (no copy can free memory or end in
        between, so the event loop would find nothing else to do); it stops, as that loop does,
        at the first task that does not fit the budget."""
        # _try_compute and _end_compute in one loop, without what only copies need: no task waits
        # for data (nothing is swapped), so none stalls, and no event but the task's end is ever
        # queued. The state is in local variables, stored on the object as those keep it where a
        # fork copies it (_lift_budget) and at the end.
        tasks, n_tasks, ops = self.tasks, self.n_tasks, self.w.ops
        saved_outputs, size, present, events = self.saved_outputs, self.size, self.present, self.events
        output_bytes = _setup_of(self.w).saved_output_bytes
        last_fwd_use_of_saved, last_bwd_read_of = self.w.last_fwd_use_of_saved, self.w.last_bwd_read_of
        last_bwd_reader, actions, memory, trigger_s = self.w.last_bwd_reader, self.actions, self.memory, self.trigger_s
        recompute, n, log, budget = Action.RECOMPUTE, self.n, self.log, self.budget
        now, mem, peak, seq, ci, recompute_time = self.now, self.mem, self.peak, self.seq, self.ci, self.recompute_time
        group_allocs, fwd_done_upto, triggered = self.group_allocs, self.fwd_done_upto, self.triggered_step
        ended, idle_since, ready_at = self.compute_end_s, self.idle_since, self.data_ready_at
        while ci < n_tasks:
            task = tasks[ci]
            kind, op_index = task.kind, task.op_index
            op = ops[op_index]
            if kind is _BACKWARD:
                alloc, alloc_bytes = (), 0
            elif present.isdisjoint(saved_outputs[op_index]):  # as always in forward
                alloc, alloc_bytes = saved_outputs[op_index], output_bytes[op_index]
            else:
                alloc = [o for o in saved_outputs[op_index] if o not in present]
                alloc_bytes = 0
                for name in alloc:
                    alloc_bytes += size[name]
            if mem + alloc_bytes > budget:
                self.now, self.mem, self.peak, self.seq, self.ci = now, mem, peak, seq, ci
                self.recompute_time, self.group_allocs, self.fwd_done_upto = recompute_time, group_allocs, fwd_done_upto
                self.triggered_step, self.data_ready_at = triggered, now
                self.compute_end_s, self.idle_since = ended, idle_since
                if not self._lift_budget():
                    self._raise_infeasible()
                budget = self.budget
            start = now
            if alloc:
                if log is None:
                    present.update(alloc)
                    mem += alloc_bytes  # their sizes' sum
                else:
                    for name in alloc:
                        present.add(name)
                        mem += size[name]
                        log.append((now, name, True))
                if mem > peak:
                    peak = mem
                memory.append((now, mem))
                if kind is _RECOMPUTE:
                    group_allocs.extend(alloc)
            seq += 1  # the task's end, as _try_compute queues it
            now = start + (op.bwd_time_s if kind is _BACKWARD else op.fwd_time_s)
            events.append(("compute", kind, op.name, start, now, alloc_bytes, task.step))
            freed = ()
            if kind is _FORWARD:
                fwd_done_upto = op_index
                freed = last_fwd_use_of_saved[op_index]
                if freed:
                    freed = [name for name in freed if actions[name] is recompute]
            elif kind is _RECOMPUTE:
                recompute_time += op.fwd_time_s
                if task.last_of_group:
                    current = op_of_backward_step(n, task.step)
                    freed = [name for name in group_allocs
                             if not (actions[name] is recompute and last_bwd_reader[name] <= current)]
                    group_allocs = []
            else:
                freed = last_bwd_read_of[op_index]
            for name in freed:
                if name in present:
                    present.discard(name)
                    mem -= size[name]
                    if log is not None:
                        log.append((now, name, False))
                    memory.append((now, mem))
            ended = idle_since = now
            ready_at = None
            ci += 1
            if ci < n_tasks and tasks[ci].first_of_step:
                triggered = tasks[ci].step
                trigger_s[triggered] = now
        self.now, self.mem, self.peak, self.seq, self.ci = now, mem, peak, seq, ci
        self.recompute_time, self.group_allocs, self.fwd_done_upto = recompute_time, group_allocs, fwd_done_upto
        self.triggered_step, self.data_ready_at = triggered, ready_at
        self.compute_end_s, self.idle_since = ended, idle_since

    def _run_with_copies(self) -> bool:
        """``_dispatch`` then ``_run_events`` in one function, for a plan that copies: the same steps
        in the same order, with the state in local variables and the methods' bodies written out (a
        run takes a thousand instants of a few short steps each, and the calls cost more than the
        steps). False, with the state stored, at the first memory check that fails under a budget
        that lifts: the caller forks there (``_lift_budget``) and calls it again, and a dispatch
        pass tried again from its start does what the rest of the pass would do (``resume``)."""
        heap, push, pop = self.heap, heapq.heappush, heapq.heappop
        tasks, n_tasks, n, ops = self.tasks, self.n_tasks, self.n, self.w.ops
        saved_outputs, size, present = self.saved_outputs, self.size, self.present
        output_bytes = _setup_of(self.w).saved_output_bytes
        events, memory, log = self.events, self.memory, self.log
        actions, prefetch, swap, recompute = self.actions, self.plan.prefetch_step, Action.SWAP, Action.RECOMPUTE
        bwd_reads, inputs = self.setup.bwd_reads, self.setup.inputs
        last_fwd_use_of_saved, last_bwd_read_of = self.w.last_fwd_use_of_saved, self.w.last_bwd_read_of
        last_bwd_reader, last_fwd_use = self.w.last_bwd_reader, self.w.last_fwd_use
        d2h_queue, queued_s, d2h_done, d2h_end_s = self.d2h_queue, self.queued_s, self.d2h_done, self.d2h_end_s
        h2d_order, h2d_issued, h2d_done = self.h2d_order, self.h2d_issued, self.h2d_done
        cancelled, trigger_s, n_order = self.cancelled, self.trigger_s, len(self.h2d_order)
        hw = self.hw
        latency = hw.copy_latency_s
        # _rate_of's four outcomes
        d2h_alone, d2h_duplex = hw.d2h_bytes_per_s * 1.0, hw.d2h_bytes_per_s * hw.duplex_d2h_factor
        h2d_alone, h2d_duplex = hw.h2d_bytes_per_s * 1.0, hw.h2d_bytes_per_s * hw.duplex_h2d_factor
        budget, can_lift = self.budget, self.lift_to is not None
        now, mem, peak, seq, ci = self.now, self.mem, self.peak, self.seq, self.ci
        busy, idle_since, ready_at, compute_end_s = self.compute_busy, self.idle_since, self.data_ready_at, self.compute_end_s
        fwd_done_upto, triggered, group_allocs = self.fwd_done_upto, self.triggered_step, self.group_allocs
        d2h, h2d, d2h_head, h2d_head, h2d_gate = self.d2h, self.h2d, self.d2h_head, self.h2d_head, self.h2d_gate
        d2h_last_end, h2d_last_end = self.last_copy_end_s["d2h"], self.last_copy_end_s["h2d"]
        d2h_bytes, h2d_bytes, recompute_time = self.d2h_bytes, self.h2d_bytes, self.recompute_time
        stall_copy, stall_memory = self.stall_copy, self.stall_memory
        bound = False  # a memory check failed under a budget that lifts
        while True:
            # ---- a dispatch pass (_dispatch) ----
            while True:
                if not busy and ci < n_tasks:  # _try_compute
                    task = tasks[ci]
                    kind, op_index = task.kind, task.op_index
                    go = True
                    if ready_at is None:
                        if kind is _RECOMPUTE:
                            for name in inputs[op_index]:  # the swapped ones: swapped_inputs
                                if (name not in h2d_done and actions.get(name) is swap
                                        and prefetch[name] <= task.step):
                                    go = False
                                    break
                        elif kind is _BACKWARD:
                            for name in bwd_reads[op_index]:  # the swapped ones: swapped_bwd_reads
                                if name not in h2d_done and actions.get(name) is swap:
                                    go = False
                                    break
                        if go:
                            ready_at = now
                    if go:
                        alloc_bytes = 0
                        if kind is _BACKWARD:
                            alloc = None
                        elif present.isdisjoint(saved_outputs[op_index]):  # as always in forward
                            alloc, alloc_bytes = saved_outputs[op_index], output_bytes[op_index]
                        else:
                            alloc = [o for o in saved_outputs[op_index] if o not in present]
                            for name in alloc:
                                alloc_bytes += size[name]
                        if mem + alloc_bytes > budget:
                            if can_lift:
                                bound = True
                                break
                        else:
                            op = ops[op_index]
                            if ready_at > idle_since:
                                stall_copy += ready_at - idle_since
                                events.append(("compute", "stall_copy", op.name, idle_since, ready_at, 0, task.step))
                            if now > ready_at:
                                stall_memory += now - ready_at
                                events.append(("compute", "stall_memory", op.name, ready_at, now, 0, task.step))
                            if alloc:
                                if log is None:
                                    present.update(alloc)
                                    mem += alloc_bytes  # their sizes' sum
                                else:
                                    for name in alloc:
                                        present.add(name)
                                        mem += size[name]
                                        log.append((now, name, True))
                                if mem > peak:
                                    peak = mem
                                memory.append((now, mem))
                                if kind is _RECOMPUTE:
                                    group_allocs.extend(alloc)
                                duration = op.fwd_time_s
                            else:
                                duration = op.bwd_time_s if kind is _BACKWARD else op.fwd_time_s
                            busy = True
                            push(heap, (now + duration, seq, _COMPUTE_END, (task, now, alloc_bytes)))
                            seq += 1
                if d2h is None and d2h_head < len(d2h_queue):  # _try_d2h
                    while d2h_head < len(d2h_queue) and d2h_queue[d2h_head] in cancelled:
                        d2h_head += 1
                    if d2h_head < len(d2h_queue):
                        tensor = d2h_queue[d2h_head]
                        d2h_head += 1
                        nbytes = size[tensor]
                        if d2h_last_end == now:
                            begin = queued_s[tensor] + latency
                            begin = begin if begin > now else now
                        else:
                            begin = now + latency
                        rate = d2h_duplex if h2d is not None else d2h_alone
                        d2h = [tensor, nbytes, now, begin, float(nbytes), rate, now, 1]
                        push(heap, ((begin if begin > now else now) + d2h[4] / rate, seq, "d2h", (d2h, 1)))
                        seq += 1
                        if h2d is not None and h2d[5] != h2d_duplex:  # _rerate("h2d")
                            begin = h2d[3] if h2d[3] > h2d[6] else h2d[6]
                            if now > begin:
                                left = h2d[4] - (now - begin) * h2d[5]
                                h2d[4] = left if left > 0.0 else 0.0
                            h2d[5], h2d[6] = h2d_duplex, now
                            h2d[7] += 1
                            begin = h2d[3]
                            push(heap, ((begin if begin > now else now) + h2d[4] / h2d_duplex, seq, "h2d", (h2d, h2d[7])))
                            seq += 1
                if not (h2d is None and h2d_head < n_order and h2d_gate <= triggered):
                    break
                # _try_h2d
                while h2d_head < n_order and h2d_order[h2d_head] in h2d_issued:
                    h2d_head += 1
                if h2d_head >= n_order:
                    break
                tensor = h2d_order[h2d_head]
                if prefetch[tensor] > triggered:
                    h2d_gate = prefetch[tensor]
                    break
                waited = None
                k = 0
                while True:  # the head, then (when it does not fit) what compute waits for: _issue_h2d
                    if tensor in present:
                        if tensor in group_allocs:
                            group_allocs.remove(tensor)
                        if tensor not in d2h_done:
                            cancelled.add(tensor)
                        h2d_issued.add(tensor)
                        h2d_done.add(tensor)
                        break
                    if tensor in d2h_done:
                        nbytes = size[tensor]
                        if mem + nbytes <= budget:
                            present.add(tensor)
                            mem += nbytes
                            if log is not None:
                                log.append((now, tensor, True))
                            if mem > peak:
                                peak = mem
                            memory.append((now, mem))
                            h2d_issued.add(tensor)
                            if h2d_last_end == now:
                                begin = trigger_s[prefetch[tensor]]
                                ended = d2h_end_s[tensor]
                                begin = (ended if ended > begin else begin) + latency
                                begin = begin if begin > now else now
                            else:
                                begin = now + latency
                            rate = h2d_duplex if d2h is not None else h2d_alone
                            h2d = [tensor, nbytes, now, begin, float(nbytes), rate, now, 1]
                            push(heap, ((begin if begin > now else now) + h2d[4] / rate, seq, "h2d", (h2d, 1)))
                            seq += 1
                            if d2h is not None and d2h[5] != d2h_duplex:  # _rerate("d2h")
                                begin = d2h[3] if d2h[3] > d2h[6] else d2h[6]
                                if now > begin:
                                    left = d2h[4] - (now - begin) * d2h[5]
                                    d2h[4] = left if left > 0.0 else 0.0
                                d2h[5], d2h[6] = d2h_duplex, now
                                d2h[7] += 1
                                begin = d2h[3]
                                push(heap, ((begin if begin > now else now) + d2h[4] / d2h_duplex, seq, "d2h",
                                            (d2h, d2h[7])))
                                seq += 1
                            break
                        if can_lift:
                            bound = True
                            break
                    if waited is None:
                        waited = (self._waiting_on(tasks[ci]) if not busy and ci < n_tasks and ready_at is None
                                  else ())
                    if k == len(waited):
                        tensor = None
                        break
                    tensor = waited[k]
                    k += 1
                if tensor is None or bound:
                    break
            if bound:
                break
            # ---- the next instant (_run_events, _next_instant) ----
            while heap:
                top = heap[0]
                if top[2] is not _COMPUTE_END and top[3][1] != top[3][0][7]:
                    pop(heap)  # a copy end re-timed by a change of the other direction
                else:
                    break
            if not heap:
                break
            now = heap[0][0]
            while heap:
                top = heap[0]
                if top[2] is _COMPUTE_END:
                    if top[0] != now:
                        break
                    pop(heap)
                    task, start_s, alloc_bytes = top[3]  # _end_compute
                    kind, op_index = task.kind, task.op_index
                    op = ops[op_index]
                    events.append(("compute", kind, op.name, start_s, now, alloc_bytes, task.step))
                    if kind is _FORWARD:
                        fwd_done_upto = op_index
                        for name in saved_outputs[op_index]:
                            if actions[name] is swap:
                                d2h_queue.append(name)
                                queued_s[name] = now
                        freed = last_fwd_use_of_saved[op_index]
                        if freed:
                            freed = [name for name in freed
                                     if actions[name] is recompute or (actions[name] is swap and name in d2h_done)]
                    elif kind is _RECOMPUTE:
                        recompute_time += op.fwd_time_s
                        freed = ()
                        if task.last_of_group:
                            current = op_of_backward_step(n, task.step)
                            freed = [name for name in group_allocs
                                     if not (actions[name] is recompute and last_bwd_reader[name] <= current)]
                            group_allocs = []
                    else:
                        freed = last_bwd_read_of[op_index]
                    for name in freed:  # _free
                        if name in present:
                            present.discard(name)
                            mem -= size[name]
                            if log is not None:
                                log.append((now, name, False))
                            memory.append((now, mem))
                    busy = False
                    compute_end_s = idle_since = now
                    ci += 1
                    ready_at = None
                    if ci < n_tasks and tasks[ci].first_of_step:
                        triggered = tasks[ci].step
                        trigger_s[triggered] = now
                    continue
                copy, generation = top[3]
                if generation != copy[7]:
                    pop(heap)  # a copy end re-timed since
                    continue
                if top[0] != now:
                    break
                pop(heap)
                tensor = copy[0]  # _end_copy
                step = tasks[ci].step if ci < n_tasks else n
                if top[2] == "d2h":
                    events.append(("d2h", "copy_out", tensor, copy[2], now, copy[1], step))
                    d2h_last_end = now
                    d2h = None
                    d2h_bytes += copy[1]
                    d2h_done.add(tensor)
                    d2h_end_s[tensor] = now
                    if last_fwd_use[tensor] <= fwd_done_upto and tensor not in cancelled and tensor in present:
                        present.discard(tensor)
                        mem -= size[tensor]
                        if log is not None:
                            log.append((now, tensor, False))
                        memory.append((now, mem))
                    other, rate = h2d, h2d_alone
                else:
                    events.append(("h2d", "copy_in", tensor, copy[2], now, copy[1], step))
                    h2d_last_end = now
                    h2d = None
                    h2d_bytes += copy[1]
                    h2d_done.add(tensor)
                    other, rate = d2h, d2h_alone
                if other is not None and other[5] != rate:  # _rerate of the other direction
                    begin = other[3] if other[3] > other[6] else other[6]
                    if now > begin:
                        left = other[4] - (now - begin) * other[5]
                        other[4] = left if left > 0.0 else 0.0
                    other[5], other[6] = rate, now
                    other[7] += 1
                    begin = other[3]
                    push(heap, ((begin if begin > now else now) + other[4] / rate, seq,
                                "h2d" if other is h2d else "d2h", (other, other[7])))
                    seq += 1
        self.now, self.mem, self.peak, self.seq, self.ci = now, mem, peak, seq, ci
        self.compute_busy, self.idle_since, self.data_ready_at, self.compute_end_s = busy, idle_since, ready_at, compute_end_s
        self.fwd_done_upto, self.triggered_step, self.group_allocs = fwd_done_upto, triggered, group_allocs
        self.d2h, self.h2d, self.d2h_head, self.h2d_head, self.h2d_gate = d2h, h2d, d2h_head, h2d_head, h2d_gate
        self.last_copy_end_s["d2h"], self.last_copy_end_s["h2d"] = d2h_last_end, h2d_last_end
        self.d2h_bytes, self.h2d_bytes, self.recompute_time = d2h_bytes, h2d_bytes, recompute_time
        self.stall_copy, self.stall_memory = stall_copy, stall_memory
        if bound:
            return False
        if ci < n_tasks:
            self._raise_infeasible()
        return True

    def _next_instant(self) -> None:
        """Handle every event due at the next instant before starting anything, so memory
        freed at time t is available to work that starts at time t."""
        heap = self.heap
        now = self.now = heap[0][0]
        pop = heapq.heappop
        while heap:
            top = heap[0]
            kind, payload = top[2], top[3]
            if kind is _COMPUTE_END:
                if top[0] != now:
                    break
                pop(heap)
                self._end_compute(*payload)
            elif payload[1] != payload[0].generation:
                pop(heap)  # a copy end re-timed since
            elif top[0] != now:
                break
            else:
                pop(heap)
                self._end_copy(kind, payload[0])
        self._dispatch()

    def _drop_stale(self) -> bool:
        """Discard copy ends re-timed by a change of the other direction; True if events remain."""
        heap = self.heap
        while heap and heap[0][2] is not _COMPUTE_END and heap[0][3][1] != heap[0][3][0].generation:
            heapq.heappop(heap)
        return bool(heap)

    def _raise_infeasible(self) -> None:
        task = self.tasks[self.ci]
        op = self.w.ops[task.op_index]
        budget = int(self.budget)
        if self.data_ready_at is not None:
            need = self.mem + sum(self.size[a] for a in self._allocation(task))
            what = f"{task.kind} of {op.name!r}"
        else:
            waited = self._waited_for()
            head = waited[0] if waited else None
            need = self.mem + (self.size[head] if head else 0)
            what = f"the copy back of {head!r} that {task.kind} of {op.name!r} waits for"
        raise InfeasiblePlanError(
            f"plan cannot fit its budget: {what} needs {format_bytes(need)} ({need} bytes) "
            f"with {format_bytes(budget)} ({budget} bytes) allowed and nothing left to free; "
            "raise the budget or plan again for this budget",
            needed_bytes=need, budget_bytes=budget,
        )


def simulate(
    workload: Workload,
    hardware: Hardware,
    plan: Plan,
    budget_bytes: int | float | None = None,
    *,
    check: bool = True,
    tensor_log: list | None = None,
    event_records: list | None = None,
    memory_records: list | None = None,
) -> Timeline:
    """Simulate one training step of ``workload`` on ``hardware`` under ``plan``.

    ``budget_bytes`` defaults to the plan's own budget; None on both, or ``math.inf``, means
    no limit (the Timeline's ``budget_bytes`` is then None).
    Raises InfeasiblePlanError when the plan can never fit the budget, or swaps more than the
    hardware's ``pinned_host_bytes`` (when set) to the host. ``tensor_log``, when
    given, receives ``(time_s, tensor, added)`` for every change of the saved tensors on the
    device, in order (slackswap.memory replays them through the allocator model).
    ``event_records``, when given, receives the events' fields as tuples in order
    (``Event(*record)`` is the event) and the Timeline's ``events`` stay empty: the planners
    simulate hundreds of plans and read the events of a few. ``memory_records``, when given, receives
    the memory samples ``(time_s, bytes)`` in order and the Timeline's ``memory`` stays empty: a
    Timeline checks every sample it holds, and planners read only the totals.
    """
    if check:
        check_plan(workload, plan)
    if hardware.pinned_host_bytes is not None:
        from ..memory.host import check_host_memory

        check_host_memory(workload, hardware, plan)
    if budget_bytes is None:
        budget_bytes = plan.budget_bytes
    if budget_bytes is not None and math.isinf(budget_bytes):
        budget_bytes = None
    sim = _Simulation(workload, hardware, plan, math.inf if budget_bytes is None else budget_bytes, tensor_log)
    sim.run()
    return _timeline(sim, budget_bytes, event_records, memory_records)


def _timeline(sim: _Simulation, budget_bytes: int | float | None, event_records: list | None,
              memory_records: list | None = None) -> Timeline:
    if memory_records is not None:
        memory_records.extend(sim.memory)
    return Timeline(
        workload_name=sim.w.name, hardware_name=sim.hw.name, policy=sim.plan.policy,
        budget_bytes=budget_bytes, step_time_s=sim.compute_end_s, ideal_step_time_s=sim.w.ideal_step_time_s,
        peak_memory_bytes=sim.peak, d2h_bytes=sim.d2h_bytes, h2d_bytes=sim.h2d_bytes,
        recompute_time_s=sim.recompute_time, stall_copy_s=sim.stall_copy, stall_memory_s=sim.stall_memory,
        events=events_of(sim.events, event_records), memory=() if memory_records is not None else tuple(sim.memory),
    )


def simulate_unlimited_with_fork(
    workload: Workload, hardware: Hardware, plan: Plan, budget_bytes: int, *, event_records: list | None = None,
    memory_records: list | None = None,
) -> tuple[Timeline, Callable[..., Timeline] | None]:
    """``simulate(workload, hardware, plan, math.inf, check=False, event_records=..., memory_records=...)``,
    and the run under ``budget_bytes`` without its first part: the two runs are the same until a memory
    check first fails under the budget, where the state is copied; ``resume(event_records, memory_records)``
    runs that copy on and returns what ``simulate(..., budget_bytes, check=False, event_records=...,
    memory_records=...)`` would
    (or raises its InfeasiblePlanError). ``resume`` is None when the budget never binds: the run
    under it is the unlimited run (its peak is within the budget). Planners size a plan by its
    unlimited peak and then need its run under the budget (selection.fit_need)."""
    if hardware.pinned_host_bytes is not None:
        from ..memory.host import check_host_memory

        check_host_memory(workload, hardware, plan)
    sim = _Simulation(workload, hardware, plan, budget_bytes, lift_to=math.inf)
    sim.run()
    free = _timeline(sim, None, event_records, memory_records)
    fork = sim.fork
    if fork is None:
        return free, None

    def resume(records: list | None = None, memory_records: list | None = None) -> Timeline:
        fork.resume()
        return _timeline(fork, budget_bytes, records, memory_records)
    return free, resume


def events_of(records: list[tuple], into: list | None = None) -> tuple[Event, ...]:
    """``records`` as Events, or, with ``into``, handed over as they are (and no Events)."""
    if into is not None:
        into.extend(records)
        return ()
    return tuple(Event(*r) for r in records)


def simulate_ideal(workload: Workload, hardware: Hardware) -> Timeline:
    """Everything kept, no limit: the reference step time and the unconstrained peak."""
    plan = make_plan(workload, {}, policy="ideal", budget_bytes=None)
    return simulate(workload, hardware, plan, check=False)
