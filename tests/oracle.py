"""A second, deliberately naive implementation of docs/simulator.md, to check the real one.

It shares no code with slackswap.sim: no event heap, no re-timed copy ends. It keeps the state
of the three streams and, at each step of its loop, scans them for the next instant something
ends, moves every copy's bytes forward to that instant at the rates in force, handles every
ending due then, and starts whatever can start. Memory is recomputed as the sum over the set
of tensors on the device. It is slow (quadratic) and only meant for tiny workloads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slackswap.errors import InfeasiblePlanError
from slackswap.plans import Action

INF = float("inf")


@dataclass
class OracleResult:
    step_time_s: float
    peak_memory_bytes: int
    d2h_bytes: int
    h2d_bytes: int
    recompute_time_s: float
    stall_copy_s: float
    stall_memory_s: float
    tasks: list = field(default_factory=list)
    """(kind, op name, start_s, end_s, step) of every compute task."""
    stalls: list = field(default_factory=list)
    """(kind, op name, start_s, end_s) of every stall span."""
    copies: list = field(default_factory=list)
    """(direction, tensor, start_s, end_s) of every copy."""
    memory_by_instant: dict = field(default_factory=dict)
    """time_s -> bytes in use once the instant is over, for instants where it changed."""
    missing: list = field(default_factory=list)
    """(kind, op name, tensor) for every saved tensor a task reads that is not on the device when it
    starts: the recompute groups failed to bring it back. Should stay empty."""


class _CopyState:
    def __init__(self, tensor: str, size: int, issued_s: float, bytes_from_s: float) -> None:
        self.tensor = tensor
        self.size = size
        self.issued_s = issued_s
        self.bytes_from_s = bytes_from_s
        self.left = float(size)


def oracle_simulate(workload, hardware, plan, budget_bytes=None) -> OracleResult:
    ops = workload.ops
    n = len(ops)
    index = {op.name: i for i, op in enumerate(ops)}
    tensors = {t.name: t for t in workload.tensors}
    saved = [t.name for t in workload.saved_tensors]
    action = dict(plan.actions)
    budget = budget_bytes if budget_bytes is not None else plan.budget_bytes
    limit = INF if budget is None else budget

    def last_forward_use(name: str) -> int:
        uses = [i for i, op in enumerate(ops) if name in op.inputs or name in op.outputs]
        return max(uses) if uses else -1

    def last_backward_reader(name: str) -> int:
        return min(index[r] for r in tensors[name].bwd_readers)

    def first_use(name: str) -> int:
        return n - 1 - max(index[r] for r in tensors[name].bwd_readers)

    def reads_in_backward(i: int) -> list[str]:
        return [s for s in saved if ops[i].name in tensors[s].bwd_readers]

    # The compute stream's task list: (kind, op index, step, last task of its group?).
    tasks = [("forward", i, -1, False) for i in range(n)]
    first_task_of_step = {}
    for k in range(n):
        i = n - 1 - k
        first_task_of_step[k] = len(tasks)
        group = list(plan.recompute_groups.get(ops[i].name, ()))
        for j, name in enumerate(group):
            tasks.append(("recompute", index[name], k, j == len(group) - 1))
        tasks.append(("backward", i, k, False))

    h2d_order = sorted(
        (s for s in saved if action[s] is Action.SWAP),
        key=lambda s: (plan.prefetch_step[s], first_use(s), saved.index(s)),
    )

    on_device: set[str] = set()
    group_owned: set[str] = set()

    def in_use() -> int:
        return sum(tensors[s].size_bytes for s in on_device)

    out = OracleResult(0.0, 0, 0, 0, 0.0, 0.0, 0.0)
    now = 0.0
    on_device.update(s for s in saved if tensors[s].producer is None)
    if in_use() > limit:
        raise InfeasiblePlanError("step inputs", needed_bytes=in_use(), budget_bytes=int(limit))
    out.peak_memory_bytes = in_use()
    last_recorded = 0

    next_task = 0
    running = None  # (task, start_s, end_s)
    idle_since = 0.0
    ready_at = None
    forward_done = -1
    d2h_queue: list[str] = []
    d2h = None
    h2d = None
    copied_out: set[str] = set()
    copied_in: set[str] = set()
    issued: set[str] = set()  # copies back started or skipped
    made_at: dict[str, float] = {}  # a swapped tensor's producer's forward end: its copy out is queued
    out_at: dict[str, float] = {}  # a copy out's end
    task_end_at: list[float] = []  # each compute task's end, in task order
    last_end = {"d2h": None, "h2d": None}  # the last copy end of each direction

    def bytes_from(direction: str, name: str) -> float:
        """When a copy issued now starts moving bytes: after its latency, or, back to back behind
        the copy that just ended, after its latency counted from when it was queued."""
        if last_end[direction] != now:
            return now + hardware.copy_latency_s
        if direction == "d2h":
            queued = made_at[name]
        else:
            queued = max(task_end_at[first_task_of_step[plan.prefetch_step[name]] - 1], out_at[name])
        return max(now, queued + hardware.copy_latency_s)
    cancelled: set[str] = set()  # swaps whose tensor was still on the device when needed back

    def fired(step: int) -> bool:
        # next_task moves on when a task ends, so this says every task before the step has ended.
        return next_task >= first_task_of_step[step]

    def data_ready(task) -> bool:
        kind, i, step, _ = task
        if kind == "forward":
            return True
        if kind == "recompute":
            return all(
                name in copied_in
                for name in ops[i].inputs
                if action.get(name) is Action.SWAP and plan.prefetch_step[name] <= step
            )
        return all(name in copied_in for name in reads_in_backward(i) if action[name] is Action.SWAP)

    def new_outputs(task) -> list[str]:
        kind, i, _, _ = task
        if kind == "backward":
            return []
        return [o for o in ops[i].outputs if o in action and o not in on_device]

    def waited_for() -> list[str]:
        """Swapped tensors the idle compute stream waits for before its next task, in h2d order."""
        if running is not None or next_task >= len(tasks) or ready_at is not None:
            return []
        kind, i, step, _ = tasks[next_task]
        if kind == "backward":
            names = [s for s in reads_in_backward(i) if action[s] is Action.SWAP]
        elif kind == "recompute":
            names = [s for s in ops[i].inputs if action.get(s) is Action.SWAP and plan.prefetch_step[s] <= step]
        else:
            names = []
        return [s for s in h2d_order if s in names and s not in copied_in]

    def try_copy_back(name: str) -> bool:
        """Skip (still on the device) or start the copy back of ``name``; False if it must wait."""
        nonlocal h2d
        if name in on_device:
            group_owned.discard(name)
            if name not in copied_out:
                cancelled.add(name)
            issued.add(name)
            copied_in.add(name)
            return True
        if name in copied_out and in_use() + tensors[name].size_bytes <= limit:
            on_device.add(name)
            issued.add(name)
            h2d = _CopyState(name, tensors[name].size_bytes, now, bytes_from("h2d", name))
            return True
        return False

    def waits_for_memory(name: str) -> bool:
        """The head of the h2d order waits for memory (not for its copy out)."""
        return name in copied_out and in_use() + tensors[name].size_bytes > limit

    def rate(direction: str) -> float:
        if direction == "d2h":
            return hardware.d2h_bytes_per_s * (hardware.duplex_d2h_factor if h2d is not None else 1.0)
        return hardware.h2d_bytes_per_s * (hardware.duplex_h2d_factor if d2h is not None else 1.0)

    def copy_end(copy: _CopyState, direction: str) -> float:
        return max(now, copy.bytes_from_s) + copy.left / rate(direction)

    while True:
        # ---- start what can start, compute first, until nothing more does
        started = True
        while started:
            started = False
            if running is None and next_task < len(tasks):
                task = tasks[next_task]
                if ready_at is None and data_ready(task):
                    ready_at = now
                if ready_at is not None:
                    new = new_outputs(task)
                    if in_use() + sum(tensors[o].size_bytes for o in new) <= limit:
                        name = ops[task[1]].name
                        if ready_at > idle_since:
                            out.stall_copy_s += ready_at - idle_since
                            out.stalls.append(("stall_copy", name, idle_since, ready_at))
                        if now > ready_at:
                            out.stall_memory_s += now - ready_at
                            out.stalls.append(("stall_memory", name, ready_at, now))
                        reads = reads_in_backward(task[1]) if task[0] == "backward" else ops[task[1]].inputs
                        out.missing.extend((task[0], name, t) for t in reads if t in action and t not in on_device)
                        on_device.update(new)
                        if task[0] == "recompute":
                            group_owned.update(new)
                        duration = ops[task[1]].bwd_time_s if task[0] == "backward" else ops[task[1]].fwd_time_s
                        running = (task, now, now + duration)
                        started = True
            d2h_queue[:] = [name for name in d2h_queue if name not in cancelled]
            if d2h is None and d2h_queue:
                name = d2h_queue.pop(0)
                d2h = _CopyState(name, tensors[name].size_bytes, now, bytes_from("d2h", name))
                started = True
            pending = [name for name in h2d_order if name not in issued]
            if h2d is None and pending and fired(plan.prefetch_step[pending[0]]):
                if try_copy_back(pending[0]):
                    started = True
                elif waits_for_memory(pending[0]):
                    started = any(try_copy_back(name) for name in waited_for() if name not in issued)
            out.peak_memory_bytes = max(out.peak_memory_bytes, in_use())
        if in_use() != last_recorded:
            out.memory_by_instant[now] = in_use()
            last_recorded = in_use()

        # ---- nothing running: finished, or stuck for good
        if running is None and d2h is None and h2d is None:
            if next_task < len(tasks):
                task = tasks[next_task]
                if ready_at is not None:
                    need, waited = in_use() + sum(tensors[o].size_bytes for o in new_outputs(task)), None
                else:
                    waited = waited_for()[0]
                    need = in_use() + tensors[waited].size_bytes
                raise InfeasiblePlanError(f"stuck waiting for {waited!r}", needed_bytes=need, budget_bytes=int(limit))
            break

        # ---- the next instant, and the bytes each copy moves until then
        ends = {}
        if running is not None:
            ends["compute"] = running[2]
        if d2h is not None:
            ends["d2h"] = copy_end(d2h, "d2h")
        if h2d is not None:
            ends["h2d"] = copy_end(h2d, "h2d")
        then = min(ends.values())
        for direction, copy in (("d2h", d2h), ("h2d", h2d)):
            if copy is not None and ends[direction] != then:
                copy.left -= max(0.0, then - max(now, copy.bytes_from_s)) * rate(direction)
        now = then

        # ---- everything that ends now
        if "compute" in ends and ends["compute"] == now:
            task, start, end = running
            kind, i, step, last_of_group = task
            out.tasks.append((kind, ops[i].name, start, end, step))
            if kind == "forward":
                forward_done = i
                d2h_queue.extend(o for o in ops[i].outputs if action.get(o) is Action.SWAP)
                made_at.update((o, now) for o in ops[i].outputs if action.get(o) is Action.SWAP)
                for name in ops[i].inputs + ops[i].outputs:
                    if name in action and last_forward_use(name) == i:
                        if action[name] is Action.RECOMPUTE or (action[name] is Action.SWAP and name in copied_out):
                            on_device.discard(name)
            elif kind == "recompute":
                out.recompute_time_s += ops[i].fwd_time_s
                if last_of_group:
                    for name in sorted(group_owned):
                        stays = action[name] is Action.RECOMPUTE and last_backward_reader(name) <= n - 1 - step
                        if not stays:
                            on_device.discard(name)
                    group_owned.clear()
            else:
                for name in reads_in_backward(i):
                    if last_backward_reader(name) == i and tensors[name].producer is not None:
                        on_device.discard(name)
            running = None
            task_end_at.append(now)
            next_task += 1
            idle_since = now
            ready_at = None
            out.step_time_s = now
        if d2h is not None and ends["d2h"] == now:
            copied_out.add(d2h.tensor)
            out_at[d2h.tensor] = now
            last_end["d2h"] = now
            out.d2h_bytes += d2h.size
            out.copies.append(("d2h", d2h.tensor, d2h.issued_s, now))
            if last_forward_use(d2h.tensor) <= forward_done and d2h.tensor not in cancelled:
                on_device.discard(d2h.tensor)
            d2h = None
        if h2d is not None and ends["h2d"] == now:
            copied_in.add(h2d.tensor)
            last_end["h2d"] = now
            out.h2d_bytes += h2d.size
            out.copies.append(("h2d", h2d.tensor, h2d.issued_s, now))
            h2d = None
    return out
