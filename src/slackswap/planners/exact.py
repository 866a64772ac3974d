"""Rule 10 of `slackswap`: an exact search where it is cheap.

A branch and bound over every keep / swap / recompute assignment of the candidate tensors, each
assignment with the schedule `make_plan` derives for the hardware (the same plans
tests/brute_force.py enumerates), simulated under the budget. It starts from the heuristic's
plan as the incumbent and drops a partial assignment when a lower bound on every completion's
step time is no better. When it finishes within its simulation cap its plan is the fastest any
assignment gives; a local search can return different local optima for neighbouring inputs
(more budget, a faster link), the exhaustive best cannot (docs/planners.md, rule 10).

Lower bounds, each valid whatever the undecided tensors become (keeping costs nothing):

- memory: when backward op k runs, the step's inputs, every tensor some reader at or after k and
  some reader at or before k reads (present whatever its action), and every kept tensor not yet
  read are all on the device; a keep that would push any of these sums over the budget is not
  tried (k past the last op is the end of forward: all kept tensors);
- compute: the ideal step plus one forward run of each producer of a recomputed tensor (the
  compute stream runs one op at a time);
- copies, at the full link rate: a swapped tensor that surely makes the round trip is made,
  copied out, copied back, and then every backward op from its last reader down still runs; the
  copy out that ends last on the D2H stream, and the copy back that ends last on H2D, each add
  the same tail. Queued copies overlap their latency, so each stream's bound counts the bytes of
  every copy and the latency once, from each copy's ready time. Since a swap is cancelled when its tensor is still
  on the device at its copy back (docs/simulator.md), a swap surely round-trips only when (a)
  its copy out ends before forward does even if every candidate queued from its own back to it
  is swapped: for each such start, the copies' latency plus bytes at the full rate (there is no
  copy back in forward, so no duplex slowdown) fit in the forward time left after that start's
  producer; and (b) no recompute group can rebuild it: its producer is no ancestor of the
  producer of any tensor that is, or may yet be, recomputed. Undecided tensors count as swapped
  in (a) and recomputed in (b), so the bound holds for every completion.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from ..hardware import Hardware
from ..plans import Action
from ..workload import Workload
from .common import Candidate, facts_for
from .repair import rank
from .search import Search

# Up to 3**12 assignments before pruning; the cap bounds the search's cost on a few-op workload
# (measured in docs/planners.md, rule 10); the built-in models never qualify.
EXACT_MAX_CANDIDATES = 12
EXACT_MAX_SIMULATIONS = 4000
_ROUNDING = 1e-12  # bounds are sums taken in another order than the simulator's
_MARGIN = 1e-9  # a copy out must end this clearly before forward does to count as surely done


@dataclass(frozen=True)
class ExactResult:
    best: Candidate
    simulations: int
    complete: bool  # True: no assignment simulates faster than ``best``


class Bounds:
    """The lower bounds of one workload on one link (module docstring), for any assignment."""

    def __init__(self, workload: Workload, hardware: Hardware) -> None:
        w = workload
        facts = self.facts = facts_for(w)
        self.ideal_s = w.ideal_step_time_s
        self.fwd_s = {op.name: op.fwd_time_s for op in w.ops}
        self.producer = {n: w.tensor_by_name[n].producer for n in facts.candidates}
        fwd_end = list(itertools.accumulate(op.fwd_time_s for op in w.ops))
        # backward time of ops[0..i]: what still runs once op i's backward may start
        bwd_through = list(itertools.accumulate(op.bwd_time_s for op in w.ops))
        self.latency_s = hardware.copy_latency_s
        self.made_s, self.tail_s, self.out_s, self.in_s = {}, {}, {}, {}
        self.out_bytes_s, self.in_bytes_s = {}, {}  # without the latency
        self.first_read, self.last_read = {}, {}  # backward readers' op indices, min and max
        for name in facts.candidates:
            tensor = w.tensor_by_name[name]
            readers = [w.op_index[r] for r in tensor.bwd_readers]
            self.first_read[name], self.last_read[name] = min(readers), max(readers)
            self.made_s[name] = fwd_end[w.op_index[tensor.producer]]
            self.tail_s[name] = bwd_through[max(readers)]
            self.out_bytes_s[name] = tensor.size_bytes / hardware.d2h_bytes_per_s
            self.in_bytes_s[name] = tensor.size_bytes / hardware.h2d_bytes_per_s
            self.out_s[name] = hardware.copy_latency_s + self.out_bytes_s[name]
            self.in_s[name] = hardware.copy_latency_s + self.in_bytes_s[name]
        # Bytes on the device when backward op k runs whatever the assignment (Facts); kept tensors
        # add to this (peak_bytes, and branch_and_bound in place).
        self.held = list(facts.held_whatever_bytes)
        # Copy-out queue order (producer, then its outputs' order) and the forward time left
        # after each candidate's producer ends (rule (a) of the module docstring).
        self.queue = sorted(facts.candidates, key=lambda n: (w.op_index[self.producer[n]],
                                                             w.saved_outputs[w.op_index[self.producer[n]]].index(n)))
        self.fwd_left_s = {n: fwd_end[-1] - self.made_s[n] for n in facts.candidates}
        self.ancestors = _ancestor_ops(w, {self.producer[n] for n in facts.candidates})

    def round_trips(self, swapped: list[str], maybe_swapped: list[str], maybe_recomputed: list[str]) -> list[str]:
        """The tensors of ``swapped`` surely copied out and back (rules (a) and (b) above), with
        ``maybe_swapped`` a superset of every swap and ``maybe_recomputed`` of every recompute."""
        queued = set(maybe_swapped)
        rebuildable: set[str] = set()
        for name in maybe_recomputed:
            rebuildable |= self.ancestors[self.producer[name]]
        wanted = set(swapped)
        surely: list[str] = []
        copies: list[str] = []  # queued so far, in queue order
        for name in self.queue:
            if name not in queued:
                continue
            copies.append(name)
            if name not in wanted or self.producer[name] in rebuildable:
                continue
            busy = 0.0
            ends_in_forward = True
            for start in reversed(copies):  # every start of the busy period that ends with this copy
                busy += self.out_s[start]
                if busy * (1 + _MARGIN) + _MARGIN >= self.fwd_left_s[start]:
                    ends_in_forward = False
                    break
            if ends_in_forward:
                surely.append(name)
        return surely

    def step_time_s(self, recomputed: list[str], swapped: list[str], undecided: list[str] = ()) -> float:
        """A lower bound on the step time of every completion of the partial assignment (tensors
        in ``undecided`` may still become anything)."""
        rerun = sorted({self.producer[n] for n in recomputed})
        bound = self.ideal_s + math.fsum(self.fwd_s[op] for op in rerun)
        moved = self.round_trips(swapped, [*swapped, *undecided], [*recomputed, *undecided]) if swapped else []
        if moved:
            # A copy moves no byte before its latency has passed since it was queued (and queued
            # copies overlap their latencies, docs/simulator.md): each stream's transfers run one at
            # a time, the transfer of n from its ready time plus the latency.
            lat = self.latency_s
            bound = max(
                bound,
                one_stream_bound([(self.made_s[n] + lat, self.out_bytes_s[n], self.in_s[n] + self.tail_s[n])
                                  for n in moved]),
                one_stream_bound([(self.made_s[n] + self.out_s[n] + lat, self.in_bytes_s[n], self.tail_s[n])
                                  for n in moved]),
            )
        return bound

    def peak_bytes(self, kept: list[str], size: dict[str, int]) -> int:
        """A lower bound on the peak of any plan that keeps ``kept``."""
        return self.facts.peak_floor_bytes(kept)


def _ancestor_ops(workload: Workload, ops: set[str]) -> dict[str, set[str]]:
    """For each op of ``ops``, itself and every op whose outputs it reads, transitively: the ops a
    recompute group that re-runs it may re-run too."""
    result: dict[str, set[str]] = {}
    for name in ops:
        seen, todo = {name}, [name]
        while todo:
            op = workload.ops[workload.op_index[todo.pop()]]
            for tensor in op.inputs:
                producer = workload.tensor_by_name[tensor].producer
                if producer is not None and producer not in seen:
                    seen.add(producer)
                    todo.append(producer)
        result[name] = seen
    return result


def one_stream_bound(jobs: list[tuple[float, float, float]]) -> float:
    """Least end of any schedule of copies on one stream, each (ready_s, copy_s, after_s): it
    starts once ready and, once it ends, ``after_s`` more must pass before the step can end.
    For any subset, the earliest ready time plus every copy in it plus the least ``after_s``
    bounds the end (whichever copy of the subset runs last); subsets of the copies ready no
    sooner than a threshold, and of those with at least a given ``after_s``, are tried."""
    best = 0.0
    for key in (0, 2):
        ordered = sorted(jobs, key=lambda j: j[key], reverse=True)
        busy = 0.0
        least_ready = least_after = math.inf
        for ready_s, copy_s, after_s in ordered:
            busy += copy_s
            least_ready = min(least_ready, ready_s)
            least_after = min(least_after, after_s)
            best = max(best, least_ready + busy + least_after)
    return best


def branch_and_bound(search: Search, incumbent: Candidate, *,
                     max_simulations: int = EXACT_MAX_SIMULATIONS) -> ExactResult:
    """The fastest assignment of every candidate tensor, from ``incumbent``, within ``max_simulations``."""
    facts, budget_bytes = search.facts, search.budget_bytes
    # Large tensors first: their choice decides most of the memory and copy bounds.
    names = sorted(facts.candidates, key=lambda n: (-facts.size[n], facts.production_order[n]))
    bounds = Bounds(search.workload, search.hardware)
    held = bounds.held  # updated in place as tensors are kept, restored on the way back
    best = incumbent
    simulations = 0
    complete = True
    actions: dict[str, Action] = {}
    recomputed: list[str] = []
    swapped: list[str] = []

    def visit(i: int) -> None:
        nonlocal best, simulations, complete
        if not complete:
            return
        # Ties are dropped too: the search is exact in step time, not in the tie-breaks.
        if bounds.step_time_s(recomputed, swapped, names[i:]) >= best.step_time_s * (1 - _ROUNDING):
            return
        if i == len(names):
            if simulations >= max_simulations:
                complete = False
                return
            simulations += 1
            found = search.try_actions({n: actions[n] for n in facts.candidates})
            if found.fits and rank(found) < rank(best):
                best = found
            return
        name = names[i]
        size, later = facts.size[name], range(bounds.last_read[name] + 1, len(held))
        if all(held[k] + size <= budget_bytes for k in later):
            actions[name] = Action.KEEP
            for k in later:
                held[k] += size
            visit(i + 1)
            for k in later:
                held[k] -= size
        actions[name] = Action.SWAP
        swapped.append(name)
        visit(i + 1)
        swapped.pop()
        actions[name] = Action.RECOMPUTE
        recomputed.append(name)
        visit(i + 1)
        recomputed.pop()
        del actions[name]

    visit(0)
    return ExactResult(best=best, simulations=simulations, complete=complete)
