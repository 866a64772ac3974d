"""All ranks of a node in one simulation, their copies sharing the links they share.

Each rank is the single-GPU simulation of simulator.py (one compute stream, two copy streams)
with one change: the rate of a copy is ``Node.copy_rate_bytes_per_s`` for the number of ranks
of the same switch, of the same socket and of the node copying the same way at that moment (times the GPU's
duplex factor while its other direction is busy). Whenever a rank starts or ends a copy, every
rank sharing a link with it re-times its own copy in flight, so bytes move at the share in
force over each interval. Ranks run the same workload and plan; rank r starts ``r * skew_s``
after rank 0 (0: lockstep). Events are taken in order of (global time, rank, sequence), so the
run is bit-for-bit repeatable.

Only the host links are shared: compute, HBM and the collectives of each rank are its own
(collective ops take the time the workload gives them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import InfeasiblePlanError, ValidationError
from ..nodes import Node
from ..plans import Action, Plan
from ..schedule import check_plan
from ..timeline import Timeline
from ..units import format_bytes
from ..workload import Workload
from .simulator import _Simulation, events_of


class _Rank(_Simulation):
    def __init__(self, node: Node, rank: int, offset_s: float, peers: list["_Rank"], *args) -> None:
        super().__init__(*args)
        self.node = node
        self.rank = rank
        self.offset_s = offset_s
        self.peers = peers
        self.started = False

    def _copying(self, direction: str) -> bool:
        return (self.d2h if direction == "d2h" else self.h2d) is not None

    def _rate_of(self, direction: str) -> float:
        node = self.node
        on_switch = on_socket = on_node = 0
        for peer in self.peers:
            if peer._copying(direction):
                on_switch += node.switch_of(peer.rank) == node.switch_of(self.rank)
                on_socket += node.socket_of(peer.rank) == node.socket_of(self.rank)
                on_node += 1
        rate = node.copy_rate_bytes_per_s(direction, on_switch, on_socket, on_node)
        if direction == "d2h":
            return rate * (self.hw.duplex_d2h_factor if self.h2d is not None else 1.0)
        return rate * (self.hw.duplex_h2d_factor if self.d2h is not None else 1.0)

    def next_global_s(self) -> float:
        if not self.started:
            return self.offset_s
        return self.heap[0][0] + self.offset_s if self._drop_stale() else math.inf

    def start(self) -> None:
        self.started = True
        self._alloc(list(self.step_inputs))
        if self.mem > self.budget:
            self._raise_infeasible()
        self._dispatch()

    def retime(self, global_s: float) -> None:
        """A peer started or ended a copy: move this rank's clock to now and re-time its copies."""
        if not self.started or (self.d2h is None and self.h2d is None):
            return
        self.now = max(self.now, global_s - self.offset_s)
        self._rerate("d2h")
        self._rerate("h2d")


@dataclass(frozen=True, slots=True)
class NodeResult:
    """The timeline of every rank (each on its own clock, starting at 0) and the node's step."""

    timelines: tuple[Timeline, ...]
    offsets_s: tuple[float, ...]
    step_time_s: float
    """From rank 0's start to the end of the last rank's step."""
    pinned_host_bytes_per_socket: int


def pinned_host_bytes(workload: Workload, plan: Plan) -> int:
    """Host memory one rank pins for its swapped tensors (one buffer each, held through the step)."""
    return sum(t.size_bytes for t in workload.saved_tensors if plan.actions.get(t.name) is Action.SWAP)


def check_host_memory(node: Node, workload: Workload, plan: Plan) -> int:
    """Pinned bytes of the ranks of one socket; raises when they exceed the socket's memory."""
    need = node.gpus_per_socket * pinned_host_bytes(workload, plan)
    if need > node.host_memory_bytes:
        raise InfeasiblePlanError(
            f"node {node.name}: {node.gpus_per_socket} ranks per socket pin {format_bytes(need)} ({need} bytes) of "
            f"host memory for swapped tensors, more than the socket's {format_bytes(node.host_memory_bytes)}; "
            "plan with fewer swaps or a node with more host memory",
            needed_bytes=need, budget_bytes=node.host_memory_bytes,
        )
    return need


def simulate_node(workload: Workload, node: Node, plan: Plan, budget_bytes: int | None = None, *,
                  skew_s: float = 0.0) -> NodeResult:
    """Every rank of ``node`` running ``plan`` on ``workload``, rank r starting r * ``skew_s`` late."""
    if isinstance(skew_s, bool) or not isinstance(skew_s, (int, float)) or not math.isfinite(skew_s) or skew_s < 0:
        raise ValidationError(f"skew must be a finite number of seconds >= 0, got {skew_s!r}")
    check_plan(workload, plan)
    pinned = check_host_memory(node, workload, plan)
    if budget_bytes is None:
        budget_bytes = plan.budget_bytes
    budget = math.inf if budget_bytes is None else budget_bytes
    ranks: list[_Rank] = []
    for r in range(node.gpus):
        ranks.append(_Rank(node, r, r * skew_s, ranks, workload, node.hardware, plan, budget))
    while True:
        rank = min(ranks, key=lambda x: (x.next_global_s(), x.rank))
        now_s = rank.next_global_s()
        if now_s == math.inf:
            break
        copying = (rank.d2h, rank.h2d)
        if rank.started:
            rank._next_instant()
        else:
            rank.start()
        if rank.d2h is not copying[0] or rank.h2d is not copying[1]:
            for peer in ranks:
                if peer is not rank:
                    peer.retime(now_s)
    for rank in ranks:
        if rank.ci < len(rank.tasks):
            rank._raise_infeasible()
    timelines = tuple(
        Timeline(
            workload_name=workload.name, hardware_name=f"{node.name} rank {r.rank}", policy=plan.policy,
            budget_bytes=budget_bytes, step_time_s=r.now, ideal_step_time_s=workload.ideal_step_time_s,
            peak_memory_bytes=r.peak, d2h_bytes=r.d2h_bytes, h2d_bytes=r.h2d_bytes,
            recompute_time_s=r.recompute_time, stall_copy_s=r.stall_copy, stall_memory_s=r.stall_memory,
            events=events_of(r.events), memory=tuple(r.memory),
        )
        for r in ranks
    )
    return NodeResult(
        timelines=timelines, offsets_s=tuple(r.offset_s for r in ranks),
        step_time_s=max(r.offset_s + r.now for r in ranks), pinned_host_bytes_per_socket=pinned,
    )
