"""What the checkpoint backend would run for a Plan, and whether that is the plan (pure Python).

The checkpoint backend (checkpoint_backend.py) recomputes through non-reentrant
``torch.utils.checkpoint`` with a selective-checkpoint (SAC) policy per aten op, and swaps
through the same SwapManager hooks as the replay backend, outside the checkpointed calls.
Checkpoint can only wrap a *module call*, and it rebuilds everything a call recomputes at
the first backward unpack of anything saved inside it. So:

* each recompute group of the plan is placed in the innermost module call that contains its
  ops, the op whose backward needs it and every backward reader of the tensors it rebuilds;
  where such calls nest, the outermost is checkpointed: a *region*;
* inside a region, the SAC policy re-runs (PREFER_RECOMPUTE) the plan's group ops, views and
  ops past the region's last save (early stop never re-runs them), and ops that must re-run
  for SAC to be correct: an op whose output is written in place later in the region (SAC
  refuses mutated cache entries) and a random op before a re-run random op (checkpoint
  restores the RNG state at the region's start, so every random op in front must draw again).
  Every other op is MUST_SAVE: SAC caches its output on the device, out of reach of our hooks;
* a region's positional tensor arguments are saved by checkpoint itself, through our hooks,
  so they can be kept or swapped; everything saved outside regions goes through our hooks.

``build_checkpoint_map`` works this out and lists in ``notes`` every way in which it would
differ from the plan: a tensor with another action (a swap inside a region), other ops
re-run (other FLOPs), or more memory than the plan's budget when each region is rebuilt at
its first unpack (the simulator runs the plan with the regions' groups merged at their
trigger steps). ``faithful`` is True when there is none; the backend refuses otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

from ..plans import Action, Plan
from ..profile_trace import LOSS_CALL, CallEntered, ProfileTrace, TensorSaved, aten_of, tensor_source
from ..schedule import backward_step_of, rescheduled
from ..sim import simulate
from ..workload import Workload
from .mapping import RANDOM_OPS, ExecutionMap, PackEntry, build_execution_map, profile_trace


@dataclass(frozen=True)
class Region:
    call: str
    ops: tuple[int, ...]
    """Op indices run inside the call, in forward order."""
    recompute: tuple[bool, ...]
    """Per op of ``ops``: True = PREFER_RECOMPUTE, False = MUST_SAVE (SAC caches its outputs)."""
    aten: tuple[str, ...]
    rerun: tuple[int, ...]
    """Op indices that run again when the region recomputes (before its early stop)."""
    trigger: int
    """Op whose backward unpacks the region first: the region is rebuilt at step n-1-trigger."""
    cached: tuple[str, ...]
    """Saved tensors made inside the region that SAC keeps on the device (MUST_SAVE outputs)."""
    rebuilt: tuple[str, ...]
    """Saved tensors the region's recompute rebuilds."""
    cached_transient_bytes: int
    """Bytes SAC caches that no backward reads (outputs of MUST_SAVE ops nobody saves)."""


@dataclass(frozen=True)
class CheckpointMap:
    regions: tuple[Region, ...]
    execution: ExecutionMap
    """What the swap manager sees (region arguments and saves outside regions)."""
    manager_plan: Plan
    """The plan as the swap manager runs it: no replayed groups, and copies back of swapped region
    arguments issued by the step that rebuilds their region."""
    simulated_plan: Plan
    """The plan with each region's re-run ops as one group at its trigger step (for the simulator)."""
    predicted_peak_bytes: int | None
    notes: tuple[str, ...] = field(default=())

    @property
    def faithful(self) -> bool:
        return not self.notes

    def refusal(self) -> str:
        return (f"the checkpoint backend cannot run this plan as planned: {self.notes[0]}"
                f"{f' (and {len(self.notes) - 1} more)' if len(self.notes) > 1 else ''}; "
                'use backend="replay", which runs any plan exactly, or the default "auto"')


def _chain(calls: Mapping[str, str | None], call: str) -> list[str]:
    """The call and every call it ran inside, innermost first (empty for loss_fn)."""
    out: list[str] = []
    c: str | None = call
    while c is not None and c != LOSS_CALL:
        out.append(c)
        c = calls.get(c)
    return out


class _Builder:
    """The steps of build_checkpoint_map, sharing the workload, the plan, the trace and the notes."""

    def __init__(self, workload: Workload, plan: Plan, trace: ProfileTrace, notes: list[str]) -> None:
        self.workload = workload
        self.plan = plan
        self.trace = trace
        self.notes = notes
        self.ops = workload.ops
        self.index = workload.op_index
        self.by_name = workload.tensor_by_name
        self.actions = plan.actions
        self.chains = {c: _chain(trace.calls, c) for c in set(trace.op_calls)}
        self.realized: dict[str, Action] = {}
        """What happens to each saved tensor as checkpoint runs it."""

    # ---- step 1: the calls to checkpoint ---------------------------------------------------------
    def region_calls(self) -> tuple[list[str], set[int]]:
        """The outermost of the innermost calls that hold each recompute group (its ops, the op whose
        backward needs it and every backward reader of what it rebuilds), in forward order; and the
        op indices of the groups placed."""
        ops, index, trace = self.ops, self.index, self.trace
        candidates: list[str] = []
        group_ops: set[int] = set()
        for reader, group in self.plan.recompute_groups.items():
            members = {index[g] for g in group} | {index[reader]}
            for g in group:
                for out in ops[index[g]].outputs:
                    t = self.by_name[out]
                    if t.is_saved and self.actions.get(out) is Action.RECOMPUTE:
                        members |= {index[r] for r in t.bwd_readers}
            shared = None
            for i in sorted(members):
                c = self.chains[trace.op_calls[i]]
                shared = list(c) if shared is None else [x for x in shared if x in c]
            if not shared:
                self.notes.append(f"the recompute group before {reader!r} reaches ops outside the model's module "
                                  "calls (loss_fn), which checkpoint cannot wrap")
                continue
            group_ops |= {index[g] for g in group}
            candidates.append(shared[0])
        calls = sorted({c for c in candidates if not any(a in candidates for a in _chain(trace.calls, c)[1:])},
                       key=lambda c: min(i for i, oc in enumerate(trace.op_calls) if c in self.chains[oc]))
        return calls, group_ops

    # ---- step 2: what each region re-runs and caches -----------------------------------------------
    def region(self, call: str, members: list[int], saves: list[TensorSaved], group_ops: set[int]) -> Region:
        """The SAC policy of one region: which of its ops re-run, what SAC caches, what it rebuilds."""
        ops, index, by_name, n = self.ops, self.index, self.by_name, len(self.ops)
        last = saves[-1]
        stop = index[last.reader] if last.is_output else index[last.reader] - 1  # last op that re-runs
        trigger = max(index[save.reader] for save in saves)
        # A tensor some later op writes into (a new version of its storage): SAC refuses a cached entry
        # that was mutated, so its producer must re-run.
        overwritten = {inp for i in range(members[0], n) for out in ops[i].outputs if tensor_source(out).written
                       for inp in ops[i].inputs if by_name[inp].size_bytes == by_name[out].size_bytes}
        recompute = [
            i in group_ops or i > stop or ops[i].kind == "view" or not ops[i].outputs
            or any(o in overwritten for o in ops[i].outputs)
            for i in members
        ]
        # Random ops re-draw from the RNG state saved at the region's start: every random op in front of a
        # re-run one must run again too.
        random = [aten_of(ops[i].name) in RANDOM_OPS for i in members]
        rerun_random = [j for j, i in enumerate(members) if recompute[j] and i <= stop and random[j]]
        if rerun_random:
            for j in range(len(members)):
                if j < rerun_random[-1] and random[j]:
                    recompute[j] = True
        rerun = tuple(i for j, i in enumerate(members) if recompute[j] and i <= stop)
        cached, rebuilt, transient = [], [], 0
        inside = set(members)
        for j, i in enumerate(members):
            for out in ops[i].outputs:
                t = by_name[out]
                if not recompute[j]:
                    if t.is_saved:
                        cached.append(out)
                    else:
                        transient += t.size_bytes
                if t.is_saved and any(index[r] in inside for r in t.bwd_readers):
                    self.realized[out] = Action.RECOMPUTE if recompute[j] else Action.KEEP
                    if recompute[j]:
                        rebuilt.append(out)
                    if self.actions[out] is Action.SWAP:
                        self.notes.append(f"{out!r} is planned swap but is saved inside module call {call!r}, where "
                                          "selective checkpointing keeps or recomputes it out of reach of the swap hooks")
        extra = [i for i in rerun if i not in group_ops and ops[i].kind != "view" and ops[i].outputs]
        if extra:
            self.notes.append(f"checkpointing {call!r} would re-run {len(extra)} op(s) the plan does not "
                              f"(first: {ops[extra[0]].name!r})")
        # Tensors made outside the region that ops inside it save: positional arguments go through our hooks.
        args = {a for a in self.trace.call_args.get(call, ()) if a is not None}
        for save in saves:
            name = save.tensor
            if name is None or name in self.realized or (by_name[name].producer is not None
                                                         and index[by_name[name].producer] in inside):
                continue
            if name not in args and self.actions[name] is not Action.KEEP:
                self.notes.append(f"{name!r} is used inside {call!r} but is not a positional argument of it, so "
                                  f"checkpoint holds it on the device instead of {self.actions[name].value}")
        return Region(call=call, ops=tuple(members), recompute=tuple(recompute),
                      aten=tuple(aten_of(ops[i].name) for i in members), rerun=rerun, trigger=trigger,
                      cached=tuple(cached), rebuilt=tuple(rebuilt), cached_transient_bytes=transient)

    def regions(self) -> tuple[list[Region], dict[str, str | None]]:
        """Every region, and the region (call) each module call runs inside (None: outside all)."""
        calls, group_ops = self.region_calls()
        op_calls = self.trace.op_calls
        region_of_call = {oc: next((c for c in self.chains[oc] if c in calls), None) for oc in self.chains}
        saves_in: dict[str, list[TensorSaved]] = {c: [] for c in calls}
        for save in self.trace.saves:
            region = region_of_call.get(save.call)
            if region is not None:
                saves_in[region].append(save)
        regions = []
        for call in calls:
            members = [i for i, oc in enumerate(op_calls) if region_of_call[oc] == call]
            if saves_in[call]:
                regions.append(self.region(call, members, saves_in[call], group_ops))
        return regions, region_of_call

    # ---- step 3: what the swap manager sees -------------------------------------------------------
    def pack_sequence(self, regions: list[Region], region_of_call: dict[str, str | None]):
        """The saves that reach our hooks, in order (region arguments, saves outside regions); the bytes
        checkpoint holds for arguments that are no saved tensor; and, for each swapped region argument,
        the step by which its copy back must be issued (its region's trigger)."""
        by_call = {r.call: r for r in regions}
        saved_names = {t.name for t in self.workload.saved_tensors}
        by_name, n = self.by_name, len(self.ops)
        sequence: list[PackEntry] = []
        extra_held = 0
        arg_step: dict[str, int] = {}
        for event in self.trace.events:
            if isinstance(event, CallEntered):
                region = by_call.get(event.call)
                if region is None:
                    continue
                for name in self.trace.call_args.get(event.call, ()):
                    if name is None:
                        continue
                    if name not in saved_names:
                        extra_held += by_name[name].size_bytes if by_name[name].producer is not None else 0
                        sequence.append(PackEntry(name, Action.KEEP, region.trigger))
                        continue
                    action = self.actions[name]
                    if action is Action.RECOMPUTE:
                        self.notes.append(f"{name!r}, an argument of checkpointed call {event.call!r}, is planned "
                                          "recompute outside that call")
                        action = Action.KEEP
                    sequence.append(PackEntry(name, action, region.trigger))
                    if action is Action.SWAP:
                        arg_step[name] = min(arg_step.get(name, n), backward_step_of(n, region.trigger))
                continue
            if event.tensor is None or region_of_call.get(event.call) in by_call:
                continue
            action = self.actions[event.tensor]
            if action is Action.RECOMPUTE:
                self.notes.append(f"{event.tensor!r} is planned recompute but {event.reader!r}, outside every "
                                  "checkpointed call, saves it")
            sequence.append(PackEntry(event.tensor, action, self.index[event.reader]))
            self.realized.setdefault(event.tensor, action)
        for e in sequence:
            self.realized.setdefault(e.name, e.action)
        for t in self.workload.saved_tensors:
            self.realized.setdefault(t.name, Action.KEEP)
        return sequence, extra_held, arg_step

    # ---- step 4: how it differs from the plan ---------------------------------------------------------
    def compare(self, regions: list[Region], plan_flops: float) -> float:
        """Note other FLOPs or other actions than the plan's; returns the FLOPs checkpoint re-runs."""
        runtime_flops = sum(self.ops[i].flops for r in regions for i in r.rerun)
        if plan_flops != runtime_flops:
            self.notes.append(f"it would re-run {runtime_flops:.0f} FLOPs against the plan's {plan_flops:.0f} "
                              "(a region recomputes each op once, at its first unpack)")
        saved_names = {t.name for t in self.workload.saved_tensors}
        changed = [name for name in self.actions if name in saved_names and self.realized[name] is not self.actions[name]]
        if changed:
            self.notes.append(f"{len(changed)} tensor(s) would run with another action (first: {changed[0]!r} "
                              f"planned {self.actions[changed[0]].value}, runs {self.realized[changed[0]].value})")
        return runtime_flops

    # ---- step 5: the schedule as checkpoint runs it ------------------------------------------------
    def plans(self, regions: list[Region], arg_step: dict[str, int]) -> tuple[Plan, Plan]:
        """The plan as the manager runs it (no replayed groups; swapped region arguments fetched by their
        region's trigger) and as the simulator runs it (each region's re-run ops one group at its trigger)."""
        workload, plan, ops = self.workload, self.plan, self.ops
        prefetch = dict(plan.prefetch_step)
        starts = plan.schedule.start_steps()
        for name, step in arg_step.items():
            prefetch[name] = min(prefetch[name], step)
            starts[name] = min(starts[name], step)
        manager_plan = rescheduled(workload, plan, recompute_groups={}, prefetch_step=prefetch, start_step=starts)
        groups = {ops[r.trigger].name: tuple(ops[i].name for i in r.rerun) for r in regions if r.rerun}
        simulated_plan = rescheduled(workload, plan, recompute_groups=groups, prefetch_step=prefetch)
        return manager_plan, simulated_plan

    # ---- step 6: its memory ----------------------------------------------------------------------
    def predicted_peak_bytes(self, hardware, simulated_plan: Plan, regions: list[Region], extra_held: int) -> int:
        timeline = simulate(self.workload, hardware, simulated_plan, budget_bytes=math.inf, check=False)
        predicted = timeline.peak_memory_bytes + extra_held + sum(r.cached_transient_bytes for r in regions)
        budget = self.plan.budget_bytes
        if budget is not None and predicted > budget:
            self.notes.append(f"rebuilding each checkpointed call at its first unpack would hold {predicted} bytes "
                              f"of saved tensors against the plan's budget of {budget} bytes")
        return predicted


def build_checkpoint_map(workload: Workload, plan: Plan, hardware=None) -> CheckpointMap:
    base = build_execution_map(workload, plan)  # checks the profile format
    notes: list[str] = list(base.notes)
    steps = _Builder(workload, plan, profile_trace(workload), notes)
    regions, region_of_call = steps.regions()
    sequence, extra_held, arg_step = steps.pack_sequence(regions, region_of_call)
    runtime_flops = steps.compare(regions, base.plan_recompute_flops)
    manager_plan, simulated_plan = steps.plans(regions, arg_step)
    predicted = None
    if not notes and hardware is not None:
        predicted = steps.predicted_peak_bytes(hardware, simulated_plan, regions, extra_held)
    realized = steps.realized
    execution = ExecutionMap(realized=realized, pack_sequence=tuple(sequence), group_ops=frozenset(),
                             random_ops=frozenset(), plan_recompute_flops=base.plan_recompute_flops,
                             runtime_recompute_flops=runtime_flops,
                             swap_bytes=sum(workload.tensor_by_name[n].size_bytes for n, a in realized.items()
                                            if a is Action.SWAP),
                             notes=tuple(notes))
    return CheckpointMap(regions=tuple(regions), execution=execution, manager_plan=manager_plan,
                         simulated_plan=simulated_plan, predicted_peak_bytes=predicted, notes=tuple(notes))
