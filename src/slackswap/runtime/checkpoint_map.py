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

from dataclasses import dataclass, field
from typing import Mapping

from ..plans import Action, Plan
from ..schedule import backward_step_of, rescheduled
from ..workload import Workload
from .mapping import LOSS_CALL, RANDOM_OPS, ExecutionMap, PackEntry, _meta, aten_name


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
                'use backend="replay" (the default), which runs any plan exactly')


def _chain(calls: Mapping[str, str | None], call: str) -> list[str]:
    """The call and every call it ran inside, innermost first (empty for loss_fn)."""
    out: list[str] = []
    c: str | None = call
    while c is not None and c != LOSS_CALL:
        out.append(c)
        c = calls.get(c)
    return out


def build_checkpoint_map(workload: Workload, plan: Plan, hardware=None) -> CheckpointMap:
    from ..sim import simulate
    from .mapping import build_execution_map

    base = build_execution_map(workload, plan)  # checks the profile format
    calls: dict[str, str | None] = dict(_meta(workload, "calls"))
    call_args: dict[str, list] = _meta(workload, "call_args")
    op_calls: list[str] = list(_meta(workload, "op_calls"))
    trace: list[list] = _meta(workload, "save_trace")
    ops = workload.ops
    n = len(ops)
    index = workload.op_index
    by_name = workload.tensor_by_name
    actions = plan.actions
    notes: list[str] = list(base.notes)
    chains = {c: _chain(calls, c) for c in set(op_calls)}

    # ---- regions: the call that holds each group, its ops and readers ---------------------------
    candidates: list[str] = []
    group_ops: set[int] = set()
    for reader, group in plan.recompute_groups.items():
        members = {index[g] for g in group} | {index[reader]}
        for g in group:
            for out in ops[index[g]].outputs:
                t = by_name[out]
                if t.is_saved and actions.get(out) is Action.RECOMPUTE:
                    members |= {index[r] for r in t.bwd_readers}
        shared = None
        for i in sorted(members):
            c = chains[op_calls[i]]
            shared = list(c) if shared is None else [x for x in shared if x in c]
        if not shared:
            notes.append(f"the recompute group before {reader!r} reaches ops outside the model's module calls "
                         "(loss_fn), which checkpoint cannot wrap")
            continue
        group_ops |= {index[g] for g in group}
        candidates.append(shared[0])
    region_calls = sorted({c for c in candidates if not any(a in candidates for a in _chain(calls, c)[1:])},
                          key=lambda c: min(i for i, oc in enumerate(op_calls) if c in chains[oc]))
    region_of_call = {oc: next((c for c in chains[oc] if c in region_calls), None) for oc in chains}
    region_of_op = [region_of_call[oc] for oc in op_calls]

    save_rows: dict[str, list[list]] = {c: [] for c in region_calls}
    for row in trace:
        if row[0] == "save" and row[3] in region_of_call and region_of_call[row[3]] is not None:
            save_rows[region_of_call[row[3]]].append(row)

    regions: list[Region] = []
    realized: dict[str, Action] = {}
    for call in region_calls:
        members = [i for i, r in enumerate(region_of_op) if r == call]
        rows = save_rows[call]
        if not rows:
            continue
        last = rows[-1]
        stop = index[last[2]] if last[4] == "out" else index[last[2]] - 1  # last op that re-runs
        trigger = max(index[row[2]] for row in rows)
        # A tensor some later op writes into (a new version of its storage): SAC refuses a cached entry
        # that was mutated, so its producer must re-run.
        overwritten = {inp for i in range(members[0], n) for out in ops[i].outputs
                       if out.rsplit(":", 1)[-1].startswith("w")
                       for inp in ops[i].inputs if by_name[inp].size_bytes == by_name[out].size_bytes}
        recompute: list[bool] = []
        for i in members:
            op = ops[i]
            rerun = (
                i in group_ops or i > stop or op.kind == "view" or not op.outputs
                or any(o in overwritten for o in op.outputs)
            )
            recompute.append(rerun)
        # Random ops re-draw from the RNG state saved at the region's start: every random op in front of a
        # re-run one must run again too.
        random = [aten_name(ops[i].name) in RANDOM_OPS for i in members]
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
                saved_inside = any(index[r] in inside for r in t.bwd_readers)
                if t.is_saved and saved_inside:
                    realized[out] = Action.RECOMPUTE if recompute[j] else Action.KEEP
                    if recompute[j]:
                        rebuilt.append(out)
                    if actions[out] is Action.SWAP:
                        notes.append(f"{out!r} is planned swap but is saved inside module call {call!r}, where "
                                     "selective checkpointing keeps or recomputes it out of reach of the swap hooks")
        extra = [i for i in rerun if i not in group_ops and ops[i].kind != "view" and ops[i].outputs]
        if extra:
            notes.append(f"checkpointing {call!r} would re-run {len(extra)} op(s) the plan does not "
                         f"(first: {ops[extra[0]].name!r})")
        # Tensors made outside the region that ops inside it save: positional arguments go through our hooks.
        args = {a for a in call_args.get(call, []) if a is not None}
        for row in rows:
            name = row[1]
            if name is None or name in realized or (by_name[name].producer is not None
                                                     and index[by_name[name].producer] in inside):
                continue
            if name not in args and actions[name] is not Action.KEEP:
                notes.append(f"{name!r} is used inside {call!r} but is not a positional argument of it, so "
                             f"checkpoint holds it on the device instead of {actions[name].value}")
        regions.append(Region(call=call, ops=tuple(members), recompute=tuple(recompute),
                              aten=tuple(aten_name(ops[i].name) for i in members), rerun=rerun, trigger=trigger,
                              cached=tuple(cached), rebuilt=tuple(rebuilt), cached_transient_bytes=transient))

    by_call = {r.call: r for r in regions}
    saved_names = {t.name for t in workload.saved_tensors}
    sequence: list[PackEntry] = []
    extra_held = 0
    arg_step: dict[str, int] = {}
    for row in trace:
        if row[0] == "enter":
            region = by_call.get(row[1])
            if region is None:
                continue
            for name in call_args.get(row[1], []):
                if name is None:
                    continue
                if name not in saved_names:
                    extra_held += by_name[name].size_bytes if by_name[name].producer is not None else 0
                    sequence.append(PackEntry(name, Action.KEEP, region.trigger))
                    continue
                action = actions[name]
                if action is Action.RECOMPUTE:
                    notes.append(f"{name!r}, an argument of checkpointed call {row[1]!r}, is planned recompute "
                                 "outside that call")
                    action = Action.KEEP
                sequence.append(PackEntry(name, action, region.trigger))
                if action is Action.SWAP:
                    arg_step[name] = min(arg_step.get(name, n), backward_step_of(n, region.trigger))
            continue
        name, reader, call = row[1], row[2], row[3]
        if name is None or region_of_call.get(call) in by_call:
            continue
        action = actions[name]
        if action is Action.RECOMPUTE:
            notes.append(f"{name!r} is planned recompute but {reader!r}, outside every checkpointed call, saves it")
        sequence.append(PackEntry(name, action, index[reader]))
        realized.setdefault(name, action)
    for e in sequence:
        realized.setdefault(e.name, e.action)
    for t in workload.saved_tensors:
        realized.setdefault(t.name, Action.KEEP)

    plan_flops = base.plan_recompute_flops
    runtime_flops = sum(ops[i].flops for r in regions for i in r.rerun)
    if plan_flops != runtime_flops:
        notes.append(f"it would re-run {runtime_flops:.0f} FLOPs against the plan's {plan_flops:.0f} "
                     "(a region recomputes each op once, at its first unpack)")
    changed = [name for name in actions if name in saved_names and realized[name] is not actions[name]]
    if changed:
        notes.append(f"{len(changed)} tensor(s) would run with another action (first: {changed[0]!r} planned "
                     f"{actions[changed[0]].value}, runs {realized[changed[0]].value})")

    # ---- the schedule as checkpoint runs it, and its memory -------------------------------------
    prefetch = dict(plan.prefetch_step)
    starts = plan.schedule.start_steps()
    for name, step in arg_step.items():
        prefetch[name] = min(prefetch[name], step)
        starts[name] = min(starts[name], step)
    manager_plan = rescheduled(workload, plan, recompute_groups={}, prefetch_step=prefetch, start_step=starts)
    groups = {ops[r.trigger].name: tuple(ops[i].name for i in r.rerun) for r in regions if r.rerun}
    simulated_plan = rescheduled(workload, plan, recompute_groups=groups, prefetch_step=prefetch)
    predicted = None
    if not notes and hardware is not None:
        timeline = simulate(workload, hardware, simulated_plan, budget_bytes=2**62, check=False)
        predicted = timeline.peak_memory_bytes + extra_held + sum(r.cached_transient_bytes for r in regions)
        if plan.budget_bytes is not None and predicted > plan.budget_bytes:
            notes.append(f"rebuilding each checkpointed call at its first unpack would hold {predicted} bytes of "
                         f"saved tensors against the plan's budget of {plan.budget_bytes} bytes")
    execution = ExecutionMap(realized=realized, pack_sequence=tuple(sequence), group_ops=frozenset(),
                             random_ops=frozenset(), plan_recompute_flops=plan_flops,
                             runtime_recompute_flops=runtime_flops,
                             swap_bytes=sum(by_name[n].size_bytes for n, a in realized.items() if a is Action.SWAP),
                             notes=tuple(notes))
    return CheckpointMap(regions=tuple(regions), execution=execution, manager_plan=manager_plan,
                         simulated_plan=simulated_plan, predicted_peak_bytes=predicted, notes=tuple(notes))
