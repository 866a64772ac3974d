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
from .fused_loops import run_copy_free, run_with_copies
from .setup import BACKWARD, COMPUTE_END, FORWARD, RECOMPUTE, Setup, Task, setup_of, swapped_of


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
        setup = setup_of(workload)
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
        return swapped_of(self._swapped, self.setup.bwd_readers, self.setup.bwd_reads, self.n)

    @cached_property
    def swapped_inputs(self) -> list[tuple[str, ...]]:
        return swapped_of(self._swapped, self.setup.fwd_readers, self.setup.inputs, self.n)

    @cached_property
    def h2d_position(self) -> dict[str, int]:
        """Each copy back's place in the copy-back order (read only when a copy may go out of order)."""
        return {name: i for i, name in enumerate(self.h2d_order)}

    def _build_tasks(self, setup: Setup) -> list[Task]:
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
                step = made[(k, ops)] = (*(Task(RECOMPUTE, op_index[name], k, j == 0, j == last)
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

    def _waiting_on(self, task: Task) -> list[str]:
        """Swapped tensors ``task`` waits for (its data conditions fail on them), in h2d order."""
        op = self.w.ops[task.op_index]
        if task.kind == BACKWARD:
            names = [t for t in self.w.bwd_reads[op.name] if self.actions[t] is Action.SWAP]
        elif task.kind == RECOMPUTE:
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
    def _allocation(self, task: Task) -> list[str]:
        if task.kind == BACKWARD:
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
            if kind == RECOMPUTE:
                # A recompute op waits for inputs whose copy back has been issued for this step or earlier.
                prefetch = self.plan.prefetch_step
                for name in self.swapped_inputs[op_index]:
                    if prefetch[name] <= task.step and name not in done:
                        return False
            elif kind == BACKWARD:
                # A backward op waits until every swapped tensor it reads is back on the device.
                for name in self.swapped_bwd_reads[op_index]:
                    if name not in done:
                        return False
            ready = self.data_ready_at = now
        alloc_bytes = 0
        if kind == BACKWARD:
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
            if kind == RECOMPUTE:
                self.group_allocs.extend(alloc)
            duration = op.fwd_time_s
        else:
            duration = op.bwd_time_s if kind == BACKWARD else op.fwd_time_s
        self.compute_busy = True
        heapq.heappush(self.heap, (now + duration, self.seq, COMPUTE_END, (task, now, alloc_bytes)))
        self.seq += 1
        return True

    def _end_compute(self, task: Task, start_s: float, alloc_bytes: int) -> None:
        op = self.w.ops[task.op_index]
        now = self.now
        kind = task.kind
        self.events.append(("compute", kind, op.name, start_s, now, alloc_bytes, task.step))
        if kind == FORWARD:
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
        elif kind == RECOMPUTE:
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
            run_copy_free(self)
            return
        while not run_with_copies(self):
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
        fork.heap = [e if e[2] is COMPUTE_END or id(e[3][0]) not in live else (*e[:3], (live[id(e[3][0])], e[3][1]))
                     for e in self.heap]
        fork.lift_to = None
        self.fork = fork
        self.budget, self.lift_to = self.lift_to, None
        return True

    def _run_events(self) -> None:
        heap = self.heap
        while heap:
            top = heap[0]
            if top[2] is not COMPUTE_END and top[3][1] != top[3][0].generation:
                heapq.heappop(heap)  # a copy end re-timed by a change of the other direction
                continue
            self._next_instant()
        if self.ci < len(self.tasks):
            self._raise_infeasible()

    def _next_instant(self) -> None:
        """Handle every event due at the next instant before starting anything, so memory
        freed at time t is available to work that starts at time t."""
        heap = self.heap
        now = self.now = heap[0][0]
        pop = heapq.heappop
        while heap:
            top = heap[0]
            kind, payload = top[2], top[3]
            if kind is COMPUTE_END:
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
        while heap and heap[0][2] is not COMPUTE_END and heap[0][3][1] != heap[0][3][0].generation:
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
