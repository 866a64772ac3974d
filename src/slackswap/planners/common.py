"""Shared planning helpers: candidate tensors, recompute costs, and simulating a candidate plan.

Every planner works on the same facts, computed once per workload:

- the *candidates*: saved tensors that have a producer (step inputs can only be kept);
- the *rebuild ops* of each candidate: its producer plus every producer of an unsaved
  (transient) input, recursively, since those inputs are not on the device either. This
  is the "counting every producer that must re-run" of the paper. Recomputing a set of
  tensors re-runs the union of their rebuild ops, so two tensors of one op (a dropout's
  mask and output) pay for it once;
- the forward timeline without stalls: when each tensor is produced, how long the
  forward pass lasts, when each backward step starts.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import operator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterable, Mapping, Sequence

from ..errors import BudgetError, InfeasiblePlanError
from ..hardware import Hardware
from ..plans import Action, Plan
from ..schedule import backward_step_starts_s, first_use_step, make_plan
from ..sim import simulate
from ..sim.simulator import events_of
from ..timeline import Event, Timeline
from ..units import format_bytes
from ..workload import Workload


@dataclass(frozen=True)
class Facts:
    """What planners need to know about a workload, computed once."""

    workload: Workload

    @cached_property
    def candidates(self) -> tuple[str, ...]:
        """Saved tensors that a plan may swap or recompute, in production order."""
        return tuple(t.name for t in self.workload.saved_tensors if t.producer is not None)

    @cached_property
    def saved_names(self) -> tuple[str, ...]:
        """Every saved tensor, step inputs included, in the workload's order (a plan's actions)."""
        return tuple(t.name for t in self.workload.saved_tensors)

    @cached_property
    def production_order(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.candidates)}

    @cached_property
    def size(self) -> dict[str, int]:
        return {t.name: t.size_bytes for t in self.workload.tensors}

    @cached_property
    def input_bytes(self) -> int:
        """Saved step inputs: resident for the whole step whatever the plan."""
        return sum(t.size_bytes for t in self.workload.saved_tensors if t.producer is None)

    @cached_property
    def rebuild_ops(self) -> dict[str, tuple[int, ...]]:
        """Op indices re-run to rebuild each candidate from saved tensors (sorted)."""
        w = self.workload
        by_name = w.tensor_by_name
        result: dict[str, tuple[int, ...]] = {}
        for name in self.candidates:
            seen: set[int] = set()
            stack = [w.op_index[by_name[name].producer]]
            while stack:
                i = stack.pop()
                if i in seen:
                    continue
                seen.add(i)
                for dep in w.ops[i].inputs:
                    t = by_name[dep]
                    if not t.is_saved and t.producer is not None:
                        stack.append(w.op_index[t.producer])
            result[name] = tuple(sorted(seen))
        return result

    @cached_property
    def rebuild_time_s(self) -> dict[str, float]:
        ops = self.workload.ops
        return {name: math.fsum(ops[i].fwd_time_s for i in idx) for name, idx in self.rebuild_ops.items()}

    @cached_property
    def produced_at_s(self) -> dict[str, float]:
        """End of each candidate's producer in a stall-free forward pass (seconds from step start)."""
        w = self.workload
        ends, now = [], 0.0
        for op in w.ops:
            now += op.fwd_time_s
            ends.append(now)
        return {name: ends[w.op_index[w.tensor_by_name[name].producer]] for name in self.candidates}

    @cached_property
    def forward_time_s(self) -> float:
        return math.fsum(op.fwd_time_s for op in self.workload.ops)

    @cached_property
    def step_starts_s(self) -> list[float]:
        """Start of each backward step after the forward pass ends, with no recompute and no stalls."""
        return backward_step_starts_s(self.workload, {})

    @cached_property
    def first_use_s(self) -> dict[str, float]:
        """When backward first reads each candidate, measured from the end of the forward pass."""
        starts = self.step_starts_s
        return {name: starts[first_use_step(self.workload, name)] for name in self.candidates}

    @cached_property
    def first_bwd_read_index(self) -> dict[str, int]:
        """Op index of the first backward reader of each candidate (the largest index: backward
        runs the ops in reverse)."""
        index = self.workload.op_index
        return {n: max(index[r] for r in self.workload.tensor_by_name[n].bwd_readers) for n in self.candidates}

    @cached_property
    def held_whatever_bytes(self) -> tuple[int, ...]:
        """Bytes on the device when backward op k runs (k = len(ops): when forward ends), whatever
        the plan: the step's inputs and every tensor with a backward reader at or after k and one
        at or before k (copied back or rebuilt before its first reader, freed after its last)."""
        w = self.workload
        delta = [0] * (len(w.ops) + 2)
        for name in self.candidates:
            readers = [w.op_index[r] for r in w.tensor_by_name[name].bwd_readers]
            delta[min(readers)] += self.size[name]
            delta[max(readers) + 1] -= self.size[name]
        held, running = [], self.input_bytes
        for k in range(len(w.ops) + 1):
            running += delta[k]
            held.append(running)
        return tuple(held)

    def peak_floor_bytes(self, kept: Iterable[str]) -> int:
        """A lower bound on the simulated peak of any plan that keeps ``kept`` (and does anything
        with the rest): held_whatever_bytes plus every kept tensor none of whose backward readers
        has run. A plan whose floor is over its budget cannot run within it."""
        held = self.held_whatever_bytes
        delta = [0] * len(held)
        first, size = self.first_bwd_read_index, self.size
        for name in kept:
            delta[first[name] + 1] += size[name]  # first[name] < len(ops): in range
        return max(0, max(map(operator.add, held, itertools.accumulate(delta))))

    def recompute_time_s(self, names: Iterable[str]) -> float:
        """Forward time re-run to rebuild ``names``, each op counted once."""
        ops: set[int] = set()
        for name in names:
            ops.update(self.rebuild_ops[name])
        return math.fsum(self.workload.ops[i].fwd_time_s for i in sorted(ops))


_FACTS: dict[int, Facts] = {}


def facts_for(workload: Workload) -> Facts:
    """Facts of a workload, cached for the workload object's lifetime (planners are called in sweeps)."""
    cached = _FACTS.get(id(workload))
    if cached is None or cached.workload is not workload:
        if len(_FACTS) > 16:
            _FACTS.clear()
        cached = _FACTS[id(workload)] = Facts(workload)
    return cached


@dataclass(frozen=True)
class Candidate:
    """A plan and its simulated timeline (None when the plan cannot fit its budget). The plan is
    None only when a search skipped building it: its memory floor was over the budget. A
    timeline simulated by ``evaluate`` has no events (``events`` builds them from ``records``) and
    no memory samples."""

    plan: Plan | None
    timeline: Timeline | None
    records: tuple | None = field(default=None, repr=False, compare=False)
    """The simulator's event records (``simulate(event_records=...)``), when it kept them."""

    @property
    def events(self) -> tuple[Event, ...]:
        if self.records is None:
            return self.timeline.events
        return events_of(self.records)

    def events_of_kinds(self, kinds: Iterable[str]) -> tuple[Event, ...]:
        """``events`` of the given kinds only, in order (the repair reads stalls and copies: a
        tenth of a step's events, and making an Event costs more than finding it)."""
        kinds = frozenset(kinds)
        if self.records is None:
            return tuple(e for e in self.timeline.events if e.kind in kinds)
        return events_of([r for r in self.records if r[1] in kinds])

    @property
    def fits(self) -> bool:
        return self.timeline is not None

    @property
    def step_time_s(self) -> float:
        return self.timeline.step_time_s if self.timeline is not None else math.inf


def build(workload: Workload, hardware: Hardware, actions: Mapping[str, Action], policy: str,
          budget_bytes: int | None, *, prefetch_step: Mapping[str, int] | None = None,
          info: Mapping | None = None, recompute_regions: Sequence[Sequence[str]] = ()) -> Plan:
    return make_plan(workload, actions, policy=policy, budget_bytes=budget_bytes, hardware=hardware,
                     prefetch_step=prefetch_step, info=info, recompute_regions=recompute_regions)


def memo_key(budget_bytes: int | float | None, plan: Plan) -> tuple:
    """What a simulation of ``plan`` under ``budget_bytes`` depends on, within one planning call
    (one workload, one link): the actions and the prefetch steps (the rest is derived from them)."""
    return (budget_bytes, tuple(plan.actions.values()), tuple(sorted(plan.prefetch_step.items())))


def evaluate(workload: Workload, hardware: Hardware, plan: Plan, budget_bytes: int | None,
             memo: dict | None = None) -> Candidate:
    """Simulate ``plan`` under ``budget_bytes`` (None: the plan's own; math.inf: no limit); an
    infeasible plan has no timeline. With ``memo`` (one dict per planning call, so one workload
    and hardware), a plan already simulated under the same budget is not simulated again."""
    key = None
    if memo is not None:
        key = memo_key(budget_bytes, plan)
        if key in memo:
            return dataclasses.replace(memo[key], plan=plan)
    records: list = []
    try:
        # The memory samples go to a list dropped here: planners read the totals, and a Timeline
        # holding the samples checks each of them.
        timeline = simulate(workload, hardware, plan, budget_bytes, check=False, event_records=records, memory_records=[])
        found = Candidate(plan, timeline, tuple(records))
    except InfeasiblePlanError:
        found = Candidate(plan, None)
    if key is not None:
        memo[key] = found
    return found


def fewest_that_fit(workload: Workload, hardware: Hardware, budget_bytes: int, plan_with, count: int) -> Plan:
    """``plan_with(k)`` for the smallest k in 0..count whose plan runs within the budget, by bisection.

    For planners that take a growing prefix of an ordered list (more recompute or more swaps
    frees more memory); the caller has checked that ``plan_with(count)`` fits."""
    low, high = 0, count
    while low < high:
        mid = (low + high) // 2
        if evaluate(workload, hardware, plan_with(mid), budget_bytes).fits:
            high = mid
        else:
            low = mid + 1
    return plan_with(low)


def natural_peak_bytes(workload: Workload, hardware: Hardware, plan: Plan) -> int:
    """Peak of ``plan`` when nothing waits for memory: the budget it needs to run without memory stalls."""
    return simulate(workload, hardware, plan, math.inf, check=False).peak_memory_bytes


def just_in_time_prefetch(workload: Workload, actions: Mapping[str, Action]) -> dict[str, int]:
    """Each swapped tensor copied back at the start of the backward step that first reads it."""
    return {n: first_use_step(workload, n) for n, a in actions.items() if a is Action.SWAP}


def policy_cannot_fit(policy: str, budget_bytes: int, needed_bytes: int, hint: str) -> BudgetError:
    return BudgetError(
        f"policy {policy} cannot fit {format_bytes(budget_bytes)} ({budget_bytes} bytes): its plan needs "
        f"{format_bytes(needed_bytes)} ({needed_bytes} bytes); {hint}",
        minimum_bytes=needed_bytes,
    )


def finish(workload: Workload, hardware: Hardware, plan: Plan, budget_bytes: int, hint: str) -> Plan:
    """Return ``plan`` if it runs within ``budget_bytes`` in the simulator, else a BudgetError for its policy."""
    candidate = evaluate(workload, hardware, plan, budget_bytes)
    if not candidate.fits:
        raise policy_cannot_fit(plan.policy, budget_bytes, natural_peak_bytes(workload, hardware, plan), hint)
    return plan


def with_info(plan: Plan, **info) -> Plan:
    return dataclasses.replace(plan, info={**plan.info, **info})


def block_layers(workload: Workload) -> list[int]:
    """The repeated layers (blocks) of a workload, the unit of layer-wise checkpointing.

    Op.layer is -1 before the first block and L after the last (workload.py). The count L
    comes from ``meta['model']['layers']`` when the workload says it; otherwise a
    workload with ops at -1 is taken to have a head at its largest layer index, and one
    without them (a synthetic chain) to be blocks only.
    """
    layers = sorted({op.layer for op in workload.ops if op.layer >= 0})
    model = workload.meta.get("model") if isinstance(workload.meta, Mapping) else None
    if isinstance(model, Mapping) and isinstance(model.get("layers"), int):
        return [layer for layer in layers if layer < model["layers"]]
    if any(op.layer < 0 for op in workload.ops) and layers:
        return layers[:-1]
    return layers
