"""Fewest re-run FLOPs for the bytes held when the forward pass ends: the objective of PyTorch's
``activation_memory_budget`` knapsack, solved exactly over one graph's candidates.

What is counted is what ``FlopCounterMode`` counts around the backward pass of a partitioned graph
that re-runs each forward node once (PyTorch's partitioner does; ``PlanningPartitioner`` does with
``objective="flops"``): the FLOPs of the forward ops between what is kept and what backward reads,
each op once. Only matmul-like ops count (FlopCounterMode's formula registry), so re-running
pointwise ops is free.

Rebuilding a candidate re-runs its *chain*: its producer and, recursively, the producers of every
input that is no saved tensor, up to the nearest saved tensors and step inputs. A recompute set R
re-runs the union of its candidates' chains (a recomputed source is itself in R, so its chain is in
the union). So only the chains' FLOP-counting ops matter: for a set O of such ops, every candidate
whose chain's counting ops lie in O can be recomputed at the cost of O, and the least-cost O whose
candidates free enough bytes is the optimum. ``fewest_flops`` finds it by branch and bound over
those ops (tens per graph), with a fractional-knapsack lower bound: split each candidate's bytes
over the ops it still needs in proportion to their FLOPs; then no set of ops frees more than the
sum of its shares. The search is exact unless it is cut off after ``max_nodes`` nodes, when the
result carries a proven lower bound instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import BudgetError
from ..plans import Action, Plan
from ..schedule import make_plan
from ..workload import Workload

MAX_NODES = 200_000
"""Branch-and-bound nodes before the search stops with a bound (the graphs of
benchmarks/vs_torch_budget.py need at most a few thousand)."""

POLICY = "fewest-flops"


@dataclass(frozen=True)
class FewestFlops:
    """A recompute set and what it costs."""

    recompute: frozenset[str]
    flops: float
    """Forward FLOPs re-run, each op once (FlopCounterMode's count)."""
    held_bytes: int
    """Kept candidates and step inputs: what is held when the forward pass ends."""
    lower_bound_flops: float
    """No recompute set within the budget re-runs fewer FLOPs (equal to ``flops`` when ``complete``)."""
    complete: bool
    nodes: int


def rebuild_chains(workload: Workload) -> dict[str, frozenset[str]]:
    """Per candidate (saved tensor with a producer): the ops re-run to rebuild it from the nearest
    saved tensors and step inputs."""
    saved = {t.name for t in workload.saved_tensors}
    tensor = workload.tensor_by_name
    ops, index = workload.ops, workload.op_index
    chains: dict[str, frozenset[str]] = {}
    for t in workload.saved_tensors:
        if t.producer is None:
            continue
        chain: set[str] = set()
        pending = [t.producer]
        while pending:
            name = pending.pop()
            if name in chain:
                continue
            chain.add(name)
            for source in ops[index[name]].inputs:
                producer = tensor[source].producer
                if source not in saved and producer is not None:
                    pending.append(producer)
        chains[t.name] = frozenset(chain)
    return chains


def recompute_flops(workload: Workload, recompute, chains: dict[str, frozenset[str]] | None = None) -> float:
    """FLOPs re-run when ``recompute`` (candidate names) are rebuilt, each op once."""
    chains = rebuild_chains(workload) if chains is None else chains
    ops = set().union(*(chains[name] for name in recompute)) if recompute else set()
    index = workload.op_index
    return math.fsum(workload.ops[index[o]].flops for o in sorted(ops, key=index.__getitem__))


def fewest_flops(workload: Workload, held_budget_bytes: int, *, max_nodes: int = MAX_NODES) -> FewestFlops:
    """The recompute set re-running the fewest FLOPs whose kept candidates and step inputs fit
    ``held_budget_bytes``; ties keep back, within the budget, the candidates costliest to rebuild per
    byte. Raises BudgetError when the step inputs alone exceed the budget."""
    candidates = [t for t in workload.saved_tensors if t.producer is not None]
    inputs_bytes = sum(t.size_bytes for t in workload.saved_tensors if t.producer is None)
    if held_budget_bytes < inputs_bytes:
        raise BudgetError(
            f"no plan of {workload.name!r} holds {held_budget_bytes} bytes when the forward pass ends: its step "
            f"inputs alone are {inputs_bytes} bytes; give a budget of at least that")
    chains = rebuild_chains(workload)
    index = workload.op_index
    flops_of = {o: workload.ops[index[o]].flops for chain in chains.values() for o in chain}
    counting = sorted({o for chain in chains.values() for o in chain if flops_of[o] > 0}, key=index.__getitem__)
    need = sum(t.size_bytes for t in candidates) + inputs_bytes - held_budget_bytes
    search = _Search(
        need=need, op_flops=[flops_of[o] for o in counting],
        items=[(sum(1 << counting.index(o) for o in chains[t.name] if flops_of[o] > 0), t.size_bytes)
               for t in candidates], max_nodes=max_nodes)
    chosen = search.run()
    recompute = {t.name for t, (mask, _) in zip(candidates, search.items) if mask & ~chosen == 0}
    recompute = _keep_back(workload, recompute, chains, held_budget_bytes - inputs_bytes)
    flops = recompute_flops(workload, recompute, chains)
    held = inputs_bytes + sum(t.size_bytes for t in candidates if t.name not in recompute)
    return FewestFlops(recompute=frozenset(recompute), flops=flops, held_bytes=held,
                       lower_bound_flops=min(flops, search.lower_bound), complete=search.complete, nodes=search.nodes)


def fewest_flops_plan(workload: Workload, held_budget_bytes: int, *, max_nodes: int = MAX_NODES) -> Plan:
    """``fewest_flops`` as a recompute-only Plan; its info carries the FLOPs, the bound and the bytes
    held (``budget_bytes`` stays None: the budget bounds what is held at the boundary, not the peak)."""
    result = fewest_flops(workload, held_budget_bytes, max_nodes=max_nodes)
    actions = {t.name: Action.RECOMPUTE if t.name in result.recompute else Action.KEEP
               for t in workload.saved_tensors if t.producer is not None}
    return make_plan(workload, actions, policy=POLICY, budget_bytes=None, info={
        "objective": "flops", "held_budget_bytes": held_budget_bytes, "held_bytes": result.held_bytes,
        "recompute_flops_once": result.flops, "recompute_flops_lower_bound": result.lower_bound_flops,
        "search": "complete" if result.complete else "cut off", "search_nodes": result.nodes})


def _keep_back(workload: Workload, recompute: set[str], chains, room_bytes: int) -> set[str]:
    """Keep candidates of ``recompute`` back while the kept bytes fit ``room_bytes``, costliest rebuild
    per byte first (keeping never makes the union of chains larger, so the FLOPs cannot rise)."""
    size = workload.size_bytes_of
    index = workload.op_index
    kept = sum(t.size_bytes for t in workload.saved_tensors if t.producer is not None and t.name not in recompute)
    rebuild_s = {c: math.fsum(workload.ops[index[o]].fwd_time_s for o in chains[c]) for c in recompute}
    result = set(recompute)
    for name in sorted(recompute, key=lambda c: (-rebuild_s[c] / max(1, size[c]), index[workload.tensor_by_name[c].producer])):
        if kept + size[name] <= room_bytes:
            kept += size[name]
            result.discard(name)
    return result


class _Search:
    """Branch and bound over the FLOP-counting ops: each is in the set O of ops re-run or not."""

    def __init__(self, *, need: int, op_flops: list[float], items: list[tuple[int, int]], max_nodes: int) -> None:
        self.need = need
        self.items = items
        self.max_nodes = max_nodes
        self.nodes = 0
        self.complete = True
        self.lower_bound = math.inf
        """Least lower bound of the nodes left unexplored when the search was cut off."""
        # Branch on the ops that free the most bytes per FLOP first, so that the first leaves are good.
        shares = [0.0] * len(op_flops)
        for mask, size in items:
            total = sum(f for i, f in enumerate(op_flops) if mask >> i & 1)
            for i in range(len(op_flops)):
                if mask >> i & 1:
                    shares[i] += size / total
        self.order = sorted(range(len(op_flops)), key=lambda i: (-shares[i], i))
        self.op_flops = op_flops
        self.best_mask = (1 << len(op_flops)) - 1
        self.best_flops = math.fsum(op_flops)

    def run(self) -> int:
        if self._gained(0) >= self.need:
            self.best_mask, self.best_flops = 0, 0.0
            return 0
        stack = [(0, 0, 0.0)]  # (depth, mask of the ops in O, their FLOPs)
        while stack:
            depth, mask, flops = stack.pop()
            self.nodes += 1
            undecided = 0
            for i in self.order[depth:]:
                undecided |= 1 << i
            bound = self._bound(mask, flops, undecided)
            if bound > self.best_flops - 0.5:  # FLOP counts are whole numbers: no strictly better completion
                continue
            if self._gained(mask) >= self.need:
                self.best_mask, self.best_flops = mask, flops
                continue
            if depth == len(self.order):
                continue
            if self.nodes >= self.max_nodes:
                self.complete = False
                self.lower_bound = min(self.lower_bound, bound)
                continue
            op = self.order[depth]
            stack.append((depth + 1, mask, flops))  # without the op (explored second)
            stack.append((depth + 1, mask | 1 << op, flops + self.op_flops[op]))
        return self.best_mask

    def _gained(self, mask: int) -> int:
        return sum(size for item_mask, size in self.items if item_mask & ~mask == 0)

    def _bound(self, mask: int, flops: float, undecided: int) -> float:
        """The least FLOPs of any completion of ``mask`` with ops of ``undecided`` that frees ``need``
        bytes (math.inf where none can)."""
        missing = self.need - self._gained(mask)
        if missing <= 0:
            return flops
        per_flop = {}
        reachable = 0
        for item_mask, size in self.items:
            rest = item_mask & ~mask
            if rest == 0 or rest & ~undecided:
                continue  # already freed, or needs an op left out
            reachable += size
            ops = [i for i in range(len(self.op_flops)) if rest >> i & 1]
            total = math.fsum(self.op_flops[i] for i in ops)
            for i in ops:
                per_flop[i] = per_flop.get(i, 0.0) + size / total
        if reachable < missing:
            return math.inf
        bound = flops
        for i in sorted(per_flop, key=lambda i: (-per_flop[i], i)):
            freed = per_flop[i] * self.op_flops[i]
            if freed >= missing:
                return bound + missing / per_flop[i]
            bound += self.op_flops[i]
            missing -= freed
        return bound
