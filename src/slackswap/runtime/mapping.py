"""How a Plan's per-tensor actions map onto what PyTorch can run (pure Python, no torch).

Recompute runs through non-reentrant ``torch.utils.checkpoint`` with a selective-checkpoint
(SAC) policy, and checkpoint can only wrap a *module call*. So for every recompute group of
the plan the runtime checkpoints the smallest module call that contains the group's ops and
the backward readers of what the group rebuilds (the outermost one where such calls nest):
a *region*. Inside a region, SAC's policy is per aten op:

* ops of the plan's recompute groups, and ops past the region's last save (recompute stops
  there, so they never run again) are PREFER_RECOMPUTE;
* every other op is MUST_SAVE: SAC caches its outputs on the device.

Everything the region's ops save goes to checkpoint, not to our hooks, so a tensor saved
only inside a region cannot be swapped: it is kept (SAC cache) or recomputed. A region's
positional tensor arguments are saved by checkpoint itself, through our hooks, so they can
be kept or swapped. Everything saved outside regions goes through our hooks as planned.

``ExecutionMap`` works this out from the workload (with the trace the profiler left in its
``meta``) and the plan, and predicts what the runtime will do: the realized action of each
saved tensor, the recompute FLOPs, the bytes swapped each way, and the order in which
tensors reach the swap manager. ``aligned`` is True when the realized actions and FLOPs are
exactly the plan's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ..errors import PlanMismatchError
from ..plans import Action, Plan
from ..workload import Workload

LOSS_CALL = "loss_fn"

# aten ops that draw random numbers (torch/_refs and native_functions.yaml 'nondeterministic_seeded').
RANDOM_OPS = frozenset({
    "bernoulli", "bernoulli_", "native_dropout", "rand", "rand_like", "randn", "randn_like", "randint",
    "randint_like", "randperm", "normal", "normal_", "uniform_", "exponential_", "geometric_", "cauchy_",
    "log_normal_", "multinomial", "poisson", "rrelu_with_noise", "_fused_dropout", "_standard_gamma",
})


@dataclass(frozen=True)
class PackEntry:
    """One tensor the swap manager will see, in forward order."""

    name: str
    action: Action
    clock_op: int
    """Op index whose backward first reads it (for a region argument: the region's recompute)."""
    region: str | None = None
    """Set when the entry is a region's argument, saved by checkpoint itself."""


@dataclass(frozen=True)
class Region:
    call: str
    first_op: int
    last_op: int
    save_policy: tuple[bool, ...]
    """Per op of the region, in order: True = MUST_SAVE (cached), False = PREFER_RECOMPUTE."""
    aten: tuple[str, ...]
    rerun_ops: tuple[int, ...]
    """Op indices that actually run again when the region recomputes."""
    cached: tuple[str, ...]
    """Saved tensors SAC keeps on the device for this region (MUST_SAVE outputs)."""
    rebuilt: tuple[str, ...]
    """Saved tensors the region's recompute rebuilds."""
    stop_op: int
    """Op whose backward triggers the recompute (the region's last save)."""


@dataclass(frozen=True)
class ExecutionMap:
    regions: tuple[Region, ...]
    realized: Mapping[str, Action]
    """What actually happens to each saved tensor of the workload."""
    pack_sequence: tuple[PackEntry, ...]
    plan_recompute_flops: float
    runtime_recompute_flops: float
    swap_bytes: int
    """Bytes copied out (and back) per step."""
    extra_held: tuple[str, ...] = ()
    """Region arguments the plan does not count as saved but checkpoint holds anyway."""
    notes: tuple[str, ...] = field(default=())

    @property
    def aligned(self) -> bool:
        return not self.notes

    def region_of(self, call: str) -> Region | None:
        return next((r for r in self.regions if r.call == call), None)


def _meta(workload: Workload, key: str):
    if key not in workload.meta:
        raise PlanMismatchError(
            f"workload {workload.name!r} has no profiler trace (meta.{key}): the runtime needs a workload "
            "from slackswap.profile for this model"
        )
    return workload.meta[key]


def build_execution_map(workload: Workload, plan: Plan) -> ExecutionMap:
    calls: dict[str, str | None] = dict(_meta(workload, "calls"))
    call_args: dict[str, list] = _meta(workload, "call_args")
    op_calls: list[str] = list(_meta(workload, "op_calls"))
    trace: list[list] = _meta(workload, "save_trace")
    ops = workload.ops
    index = workload.op_index
    actions = plan.actions
    notes: list[str] = []

    def chain(call: str) -> list[str]:
        out = []
        c: str | None = call
        while c is not None and c != LOSS_CALL:
            out.append(c)
            c = calls.get(c)
        return out  # innermost first

    def common_call(op_indices) -> str | None:
        chains = [chain(op_calls[i]) for i in op_indices]
        if any(not c for c in chains):
            return None
        shared = set(chains[0])
        for c in chains[1:]:
            shared &= set(c)
        return next((c for c in chains[0] if c in shared), None)

    # ---- regions -------------------------------------------------------------------------
    group_ops: set[int] = set()
    candidates: list[str] = []
    unplaced: list[str] = []
    for reader, group in plan.recompute_groups.items():
        members = {index[g] for g in group} | {index[reader]}
        for g in group:
            for out in ops[index[g]].outputs:
                t = workload.tensor_by_name[out]
                if t.is_saved and actions.get(out) is Action.RECOMPUTE:
                    members |= {index[r] for r in t.bwd_readers}
        call = common_call(sorted(members))
        if call is None:
            unplaced.append(reader)
            continue
        group_ops |= {index[g] for g in group}
        candidates.append(call)
    if unplaced:
        notes.append(f"{len(unplaced)} recompute group(s) span ops outside the model's module calls "
                     f"(first: before {unplaced[0]!r}); their tensors are kept")
    region_calls = sorted({c for c in candidates if not any(a in candidates for a in chain(c)[1:])},
                          key=lambda c: min(i for i, oc in enumerate(op_calls) if c in chain(oc)))
    in_region: dict[str, str] = {}  # call -> region call containing it
    for oc in set(op_calls):
        for c in chain(oc):
            if c in region_calls:
                in_region[oc] = c
    region_of_op = [in_region.get(oc) for oc in op_calls]

    # Saves inside each region, in order, to find where its recompute stops.
    saves_in: dict[str, list[list]] = {c: [] for c in region_calls}
    for row in trace:
        if row[0] == "save":
            r = in_region.get(row[3])
            if r is not None:
                saves_in[r].append(row)

    regions = []
    realized: dict[str, Action] = {}
    for call in region_calls:
        members = [i for i, r in enumerate(region_of_op) if r == call]
        first, last = members[0], members[-1]
        rows = saves_in[call]
        if not rows:
            continue
        stop_op = index[rows[-1][2]]
        stop_runs = rows[-1][4] == "out"  # an input save happens before its op runs
        policy, rerun = [], []
        mutated: set[str] = set()
        for i in members:
            op = ops[i]
            if _aten(op.name).endswith("_") and op.inputs:
                mutated.add(op.inputs[0])  # an in-place op (aten name ending in '_') writes its first argument
        extra_rerun = 0
        for i in members:
            op = ops[i]
            past_stop = i > stop_op or (i == stop_op and not stop_runs)
            transient = all(not workload.tensor_by_name[o].is_saved for o in op.outputs)
            recompute = (
                i in group_ops or past_stop
                # Views and in-place results must be re-derived from the recomputed base: a cached
                # alias would pin the original storage, and SAC refuses cached tensors mutated later.
                or not op.outputs or any(o in mutated for o in op.outputs)
                # Random ops re-draw from the region's saved RNG state in forward order, so all of them
                # must run again for each to draw what it drew in forward (dropout masks).
                or _aten(op.name) in RANDOM_OPS
                # Nobody saved it: caching it would hold memory the plan never counts, so redo it
                # (any FLOPs this adds are reported against the plan).
                or transient
            )
            policy.append(not recompute)
            if recompute and not past_stop:
                rerun.append(i)
                if i not in group_ops and op.flops > 0:
                    extra_rerun += 1
        cached, rebuilt = [], []
        for i, save in zip(members, policy):
            for out in ops[i].outputs:
                t = workload.tensor_by_name[out]
                if save:
                    cached.append(out)
                if not t.is_saved or not all(region_of_op[index[r]] == call for r in t.bwd_readers):
                    continue
                if not save:
                    rebuilt.append(out)
                realized[out] = Action.KEEP if save else Action.RECOMPUTE
        regions.append(Region(call=call, first_op=first, last_op=last, save_policy=tuple(policy),
                              aten=tuple(_aten(ops[i].name) for i in members),
                              rerun_ops=tuple(rerun), cached=tuple(cached), rebuilt=tuple(rebuilt), stop_op=stop_op))
    region_calls = [r.call for r in regions]
    by_call = {r.call: r for r in regions}

    # ---- what the swap manager sees, in order ------------------------------------------
    saved_names = {t.name for t in workload.saved_tensors}
    sequence: list[PackEntry] = []
    extra: list[str] = []
    for row in trace:
        if row[0] == "enter":
            region = by_call.get(row[1])
            if region is None:
                continue
            for name in call_args.get(row[1], []):
                if name is None:
                    continue
                if name not in saved_names:
                    if name not in extra:
                        extra.append(name)
                    action = Action.KEEP
                else:
                    action = _held_action(actions[name])
                sequence.append(PackEntry(name, action, region.stop_op, region=row[1]))
            continue
        name, reader, call = row[1], row[2], row[3]
        if name is None or in_region.get(call) in by_call:
            continue
        sequence.append(PackEntry(name, _held_action(actions[name]), index[reader]))
    held = {e.name: e.action for e in sequence}
    for name, action in held.items():
        if name in saved_names:
            realized[name] = action
    for t in workload.saved_tensors:
        realized.setdefault(t.name, Action.KEEP)  # saved only inside a region from outside it: held by reference

    plan_flops = sum(ops[index[g]].flops for group in plan.recompute_groups.values() for g in group)
    runtime_flops = sum(ops[i].flops for r in regions for i in r.rerun_ops)
    swap_bytes = sum(workload.tensor_by_name[n].size_bytes for n, a in held.items() if a is Action.SWAP)
    changed = [n for n in actions if realized[n] is not actions[n]]
    if changed:
        notes.append(f"{len(changed)} tensor(s) run with another action than planned "
                     f"(first: {changed[0]!r} planned {actions[changed[0]].value}, runs {realized[changed[0]].value})")
    if plan_flops != runtime_flops:
        notes.append(f"recompute FLOPs differ: plan {plan_flops:.0f}, runtime {runtime_flops:.0f}")
    if extra:
        notes.append(f"{len(extra)} region argument(s) not saved in the workload are held by checkpoint "
                     f"(first: {extra[0]!r})")
    return ExecutionMap(regions=tuple(regions), realized=realized, pack_sequence=tuple(sequence),
                        plan_recompute_flops=plan_flops, runtime_recompute_flops=runtime_flops,
                        swap_bytes=swap_bytes, extra_held=tuple(extra), notes=tuple(notes))


def _aten(op_name: str) -> str:
    """'h.0.mlp.fc/addmm#3' -> 'addmm'."""
    return op_name.rsplit("/", 1)[-1].split("#")[0]


def _held_action(action: Action) -> Action:
    """A tensor that reaches the swap manager is kept or swapped; one planned for recompute is kept."""
    return Action.SWAP if action is Action.SWAP else Action.KEEP


def runtime_prefetch_steps(workload: Workload, plan_or_actions) -> dict[str, int]:
    """Prefetch steps that make a swap plan executable by the runtime: each swapped tensor
    arrives by the backward step at which the runtime first reads it (a region argument is
    read when its region recomputes, which can be before the plan's first use)."""
    from ..schedule import first_use_step, make_plan

    actions = plan_or_actions.actions if isinstance(plan_or_actions, Plan) else plan_or_actions
    swapped = [n for n, a in actions.items() if a is Action.SWAP]
    early = make_plan(workload, actions, policy="probe", budget_bytes=None, prefetch_step={n: 0 for n in swapped})
    emap = build_execution_map(workload, early)
    n = len(workload.ops)
    steps = {name: first_use_step(workload, name) for name in swapped}
    for entry in emap.pack_sequence:
        if entry.name in steps:
            steps[entry.name] = min(steps[entry.name], n - 1 - entry.clock_op)
    for reader, group in early.recompute_groups.items():
        step = n - 1 - workload.op_index[reader]
        for g in group:
            for dep in workload.ops[workload.op_index[g]].inputs:
                if dep in steps:
                    steps[dep] = min(steps[dep], step)
    return steps
