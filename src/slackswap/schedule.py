"""Turn per-tensor actions into an executable Plan: recompute groups, prefetch steps and the
execution schedule, and check a plan against them.

All are pure functions of the workload, the actions and (for prefetch timing) the
hardware, so every planner shares one definition and a loaded plan can be checked.
The schedule's copy-back start steps come from a simulation (slackswap.sim.copy_starts);
everything else in it is derived here.
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Any, Mapping, Sequence

from .errors import PlanMismatchError, ValidationError
from .hardware import Hardware
from .plans import Action, CopyBack, ExecutionSchedule, Plan, RecomputeGroup, derived_entries
from .workload import Workload, backward_step_of, op_of_backward_step  # noqa: F401 - re-exported


def first_use_step(workload: Workload, name: str) -> int:
    """Backward step of the first backward read of a saved tensor."""
    return workload.first_bwd_step[name]


def first_need_step(workload: Workload, actions: Mapping[str, Action],
                    regions: Sequence[Sequence[str]] = ()) -> dict[str, int]:
    """Backward step at which each swapped tensor must be back on the device.

    That is its first backward read, or earlier when a recompute group re-runs an op that
    reads it: a copy back timed for the backward read alone would arrive after that group,
    which would then rebuild the tensor from further back instead (a longer group, more
    recompute time and a higher peak), and a faster link, issuing the copy later, would
    make it worse. The groups are those seen with every swapped tensor back from the start.
    """
    return _first_need_and_groups(workload, actions, regions)[0]


def _first_need_and_groups(workload: Workload, actions: Mapping[str, Action], regions: Sequence[Sequence[str]]
                           ) -> tuple[dict[str, int], dict[str, tuple[str, ...]] | None]:
    """first_need_step's answer, and the recompute groups it derived on the way (None where it
    needed none: no swap or no recompute).

    Those groups are also the plan's groups for any prefetch steps at or before the first need
    steps (make_plan's, prefetch_alap's or first_need_step's own): a swapped tensor still on its
    way at step k is never looked at there. The backward op of step k does not read it (its first
    read is at or after its prefetch step), and no op of step k's group reads it (that would have
    made its first need step k or earlier); so every step walks the same way in both derivations."""
    swapped = [name for name, a in actions.items() if a is Action.SWAP]
    need = {name: first_use_step(workload, name) for name in swapped}
    if not need or not any(a is Action.RECOMPUTE for a in actions.values()):
        return need, None
    ops = workload.ops
    saved = workload.saved_tensors
    if len(actions) == len(saved) and all(t.name in actions for t in saved):
        full = actions  # make_plan's: every saved tensor named already
    else:
        full = {t.name: actions.get(t.name, Action.KEEP) for t in saved}  # unnamed: kept
    groups = derive_recompute_groups(workload, full, {name: 0 for name in swapped}, regions)
    for op_name, group in groups.items():
        step = backward_step_of(len(ops), workload.op_index[op_name])
        for producer in group:
            for name in ops[workload.op_index[producer]].inputs:
                if name in need and step < need[name]:
                    need[name] = step
    return need, groups


def derive_recompute_groups(
    workload: Workload, actions: Mapping[str, Action], prefetch_step: Mapping[str, int],
    regions: Sequence[Sequence[str]] = (),
) -> dict[str, tuple[str, ...]]:
    """For each backward step, the forward ops to re-run before it, in execution order.

    Walks the backward pass and tracks which tensors are on the device: step inputs
    (always), KEEP tensors until their last backward reader, SWAP tensors from their
    prefetch step until their last reader, and RECOMPUTE tensors from the group that
    rebuilt them until their last reader. A tensor a backward op needs that is not
    there is rebuilt by re-running its producer, recursively through producers whose
    inputs are not there either ("from the nearest tensors still resident"). Outputs
    of a group that are RECOMPUTE tensors with readers left stay resident; every
    other output of a group is discarded when the group ends.

    ``regions`` (a plan's recompute_regions) are sets of ops that re-run as one unit, as a
    checkpointed function does: a group that re-runs one op of a region re-runs all of them,
    also those whose outputs nothing needs (Megatron-LM's selective recompute re-runs the
    product with V along with the softmax it rebuilds), with their missing inputs rebuilt the
    same way.
    """
    ops = workload.ops
    n = len(ops)
    by_name = workload.tensor_by_name
    last_reader = workload.last_bwd_reader
    resident: set[str] = {t.name for t in workload.tensors if t.producer is None}
    keep = Action.KEEP
    resident |= {name for name, a in actions.items() if a is keep}
    arrivals: dict[int, list[str]] = {}
    for name, step in prefetch_step.items():
        arrivals.setdefault(step, []).append(name)
    region_of: dict[str, tuple[str, ...]] = {}
    for region in regions:
        for op_name in region:
            region_of[op_name] = region_of.get(op_name, ()) + tuple(region)
    groups: dict[str, tuple[str, ...]] = {}
    bwd_reads = workload.bwd_reads
    last_read_of = workload.last_bwd_read_of
    issuperset, difference_update = resident.issuperset, resident.difference_update
    for k, bwd_op in enumerate(reversed(ops)):  # backward step k runs op n - 1 - k (op_of_backward_step)
        op_i = n - 1 - k
        if k in arrivals:
            resident.update(arrivals[k])
        if issuperset(bwd_reads[bwd_op.name]):
            # Nothing to rebuild before this step (most steps): only the reads it ends.
            difference_update(last_read_of[op_i])
            continue
        group: list[str] = []
        in_group: set[str] = set()
        temps: set[str] = set()

        def rerun(op_name: str) -> None:
            # Depth-first through the producers of missing inputs, post-order, with an explicit
            # stack: a chain of thousands of recomputed ops must not hit Python's recursion limit.
            stack: list[tuple[str, int]] = [(op_name, 0)]

            def enter(tensor: str) -> None:
                producer = by_name[tensor].producer
                if producer is None:
                    raise ValidationError(f"step input {tensor!r} is needed but not resident")
                if producer not in in_group:
                    stack.append((producer, 0))

            while stack:
                producer, next_input = stack.pop()
                inputs = ops[workload.op_index[producer]].inputs
                while next_input < len(inputs) and (inputs[next_input] in resident or inputs[next_input] in temps):
                    next_input += 1
                if next_input < len(inputs):
                    stack.append((producer, next_input + 1))
                    enter(inputs[next_input])
                    continue
                group.append(producer)
                in_group.add(producer)
                temps.update(ops[workload.op_index[producer]].outputs)

        for name in workload.bwd_reads[bwd_op.name]:
            if name in resident or name in temps:
                continue
            action = actions.get(name)
            if action is not Action.RECOMPUTE:
                raise ValidationError(
                    f"backward of {bwd_op.name!r} needs {name!r} ({action.value if action else 'no action'}), "
                    "which is not on the device at that step: prefetch it earlier or recompute it"
                )
            producer = by_name[name].producer
            if producer is None:
                raise ValidationError(f"step input {name!r} is needed but not resident")
            if producer not in in_group:
                rerun(producer)
        if group and region_of:
            done = 0
            while done < len(group):  # the group grows while regions add ops to it
                for other in region_of.get(group[done], ()):
                    if other not in in_group:
                        rerun(other)
                done += 1
        if group:
            group.sort(key=workload.op_index.__getitem__)
            groups[bwd_op.name] = tuple(group)
            for name in temps:
                if actions.get(name) is Action.RECOMPUTE and last_reader[name] <= op_i:
                    resident.add(name)
        for name in workload.bwd_reads[bwd_op.name]:
            if last_reader[name] == op_i and by_name[name].producer is not None:
                resident.discard(name)
    return groups


def backward_step_starts_s(
    workload: Workload, groups: Mapping[str, tuple[str, ...]]
) -> list[float]:
    """Start time of each backward step, measured from the end of the forward pass, with no stalls."""
    if not groups:
        return list(workload.bwd_step_starts_s)
    ops = workload.ops
    n = len(ops)
    starts = []
    now = 0.0
    for k in range(n):
        starts.append(now)
        bwd_op = ops[op_of_backward_step(n, k)]
        now += sum(ops[workload.op_index[g]].fwd_time_s for g in groups.get(bwd_op.name, ()))
        now += bwd_op.bwd_time_s
    return starts


def h2d_copy_time_s(hardware: Hardware, size_bytes: int) -> float:
    return hardware.copy_latency_s + size_bytes / hardware.h2d_bytes_per_s


def prefetch_alap(
    workload: Workload,
    actions: Mapping[str, Action],
    hardware: Hardware,
    *,
    lead_s: float = 0.0,
    regions: Sequence[Sequence[str]] = (),
) -> dict[str, int]:
    """Issue each copy back as late as it can go and still land before its first use
    (first_need_step: a backward read or a recompute that reads it).

    Swapped tensors are ordered by first use; working from the last one back, each
    copy must end before its own first use and before the next copy on the in-order
    H2D stream starts. Its prefetch step is the latest backward step that starts no
    later than the copy must start (minus ``lead_s`` of margin). Late issue keeps
    prefetched tensors from holding memory long before they are needed. Recompute
    time is not counted in the step starts used here: it only makes steps longer,
    so copies land earlier than planned, never later.
    """
    return _prefetch_alap_and_groups(workload, actions, hardware, lead_s, regions)[0]


def _prefetch_alap_and_groups(workload: Workload, actions: Mapping[str, Action], hardware: Hardware, lead_s: float,
                              regions: Sequence[Sequence[str]]
                              ) -> tuple[dict[str, int], dict[str, tuple[str, ...]] | None]:
    """prefetch_alap's answer, and the recompute groups of the plan with it (None where not derived
    on the way: _first_need_and_groups)."""
    swapped = [name for name, a in actions.items() if a is Action.SWAP]
    if not swapped:
        return {}, None
    starts = workload.bwd_step_starts_s
    first_use, groups = _first_need_and_groups(workload, actions, regions)
    production = _saved_index(workload)
    order = sorted(swapped, key=lambda name: (first_use[name], production[name]))
    result: dict[str, int] = {}
    next_copy_start = float("inf")
    for name in reversed(order):
        use = first_use[name]
        must_end = min(starts[use], next_copy_start)
        must_start = must_end - h2d_copy_time_s(hardware, workload.tensor_by_name[name].size_bytes) - lead_s
        # The latest step at or before its use that starts no later than must_start (step 0 if
        # none): starts never decrease, so a bisection finds it (a scan back was quadratic).
        step = max(0, bisect.bisect_right(starts, must_start, 0, use + 1) - 1)
        result[name] = step
        # Issued at that step's start, the copy may begin as early as starts[step]; the copy
        # before it on the stream must be done by then so as not to delay it.
        next_copy_start = starts[step]
    return result, groups


def _as_action(value, name: str) -> Action:
    if isinstance(value, Action):
        return value
    if isinstance(value, str):
        return Action.parse(value, f"action of {name!r}")
    raise ValidationError(f"action of {name!r} must be keep, swap or recompute, got {value!r}")


def copy_back_order(workload: Workload, prefetch_step: Mapping[str, int]) -> list[str]:
    """The swapped tensors in the order of the in-order host-to-device stream: by prefetch step,
    then first use, then production order."""
    production = _saved_index(workload)
    first_use = workload.first_bwd_step  # first_use_step's
    return sorted(prefetch_step, key=lambda s: (prefetch_step[s], first_use[s], production[s]))


_SAVED_INDEX: dict[int, tuple[Workload, dict[str, int]]] = {}


def _saved_index(workload: Workload) -> dict[str, int]:
    """Each saved tensor's position in workload.saved_tensors (production order), made once per
    workload (for at most 16 workloads): every plan built orders its copies back by it."""
    held = _SAVED_INDEX.get(id(workload))
    if held is None or held[0] is not workload:
        if len(_SAVED_INDEX) > 16:
            _SAVED_INDEX.clear()
        held = _SAVED_INDEX[id(workload)] = (workload, {t.name: i for i, t in enumerate(workload.saved_tensors)})
    return held[1]


# RecomputeGroups and CopyBacks already made (frozen, so shared between plans): groups by the step
# count, the op's index and the group (4 items), copies by their fields (3 items). A planning call
# builds dozens of plans with mostly the same groups and copies, and checking their fields cost
# more than looking them up (llama-7b: 9,420 groups and 9,379 copies in 41 plans).
_GROUPS_MADE: dict[tuple, RecomputeGroup | CopyBack] = {}
_GROUPS_MADE_LIMIT = 100_000


def derive_schedule(
    workload: Workload,
    prefetch_step: Mapping[str, int],
    recompute_groups: Mapping[str, tuple[str, ...]],
    start_step: Mapping[str, int] | None = None,
) -> ExecutionSchedule:
    """The execution schedule of a plan's prefetch steps and recompute groups. ``start_step`` gives
    the step at which each copy back starts in the simulation (slackswap.sim.copy_starts); a copy
    without one starts at its prefetch step."""
    n = len(workload.ops)
    starts = start_step or {}
    made = _GROUPS_MADE
    if len(made) > _GROUPS_MADE_LIMIT:
        made.clear()
    groups = []
    for before, ops in recompute_groups.items():
        key = (n, workload.op_index[before], before, tuple(ops))
        group = made.get(key)
        if group is None:
            group = made[key] = RecomputeGroup(backward_step_of(n, key[1]), before, key[3])
        groups.append(group)
    groups.sort(key=lambda g: g.step)
    copies = []
    for name in copy_back_order(workload, prefetch_step):
        issue = prefetch_step[name]
        start = starts.get(name, issue)
        key = (name, issue, start if start > issue else issue)
        # Only ints look up: 1.0 and True hash as 1 but CopyBack refuses them.
        copy = made.get(key) if type(issue) is int and type(key[2]) is int else None
        if copy is None:
            copy = made[key] = CopyBack(*key)
        copies.append(copy)
    return ExecutionSchedule(recompute_groups=tuple(groups), copy_backs=tuple(copies))


def rescheduled(
    workload: Workload,
    plan: Plan,
    *,
    prefetch_step: Mapping[str, int] | None = None,
    recompute_groups: Mapping[str, tuple[str, ...]] | None = None,
    start_step: Mapping[str, int] | None = None,
) -> Plan:
    """``plan`` with some of its prefetch steps, recompute groups or copy-back start steps replaced,
    and its schedule derived again from them (the other parts are kept)."""
    prefetch = dict(plan.prefetch_step if prefetch_step is None else prefetch_step)
    groups = dict(plan.recompute_groups if recompute_groups is None else recompute_groups)
    starts = plan.schedule.start_steps() if start_step is None else dict(start_step)
    schedule = derive_schedule(workload, prefetch, groups, {k: v for k, v in starts.items() if k in prefetch})
    return dataclasses.replace(plan, prefetch_step=prefetch, recompute_groups=groups, schedule=schedule)


def make_plan(
    workload: Workload,
    actions: Mapping[str, Action],
    *,
    policy: str,
    budget_bytes: int | None,
    hardware: Hardware | None = None,
    prefetch_step: Mapping[str, int] | None = None,
    info: Mapping[str, Any] | None = None,
    recompute_regions: Sequence[Sequence[str]] = (),
) -> Plan:
    """Complete a set of actions into a Plan: default every unnamed saved tensor to KEEP,
    choose prefetch steps (as late as possible on ``hardware``, or at the step of first need
    without one) and derive the recompute groups (``recompute_regions``: ops that re-run as one
    unit, derive_recompute_groups)."""
    full = {}
    for t in workload.saved_tensors:
        action = actions.get(t.name, Action.KEEP)
        full[t.name] = action if type(action) is Action else _as_action(action, t.name)
    unknown = set(actions) - set(full)
    if unknown:
        raise ValidationError(f"actions name tensors the workload does not save: {sorted(unknown)[:3]}")
    for t in workload.saved_tensors:
        if t.producer is None and full[t.name] is not Action.KEEP:
            raise ValidationError(f"plan: {t.name!r} is a step input and can only be kept, not {full[t.name].value}")
    regions = tuple(tuple(r) for r in recompute_regions)
    _check_regions(workload, regions)
    groups = None
    if prefetch_step is None:
        # Copies back at or before their first need steps: the groups derived on the way to those
        # steps are the plan's (_first_need_and_groups), so they are not derived twice.
        if hardware is not None:
            prefetch_step, groups = _prefetch_alap_and_groups(workload, full, hardware, 0.0, regions)
        else:
            prefetch_step, groups = _first_need_and_groups(workload, full, regions)
    if groups is None:
        groups = derive_recompute_groups(workload, full, prefetch_step, regions)
    schedule = derive_schedule(workload, prefetch_step, groups)
    with derived_entries():  # ``full`` and ``groups`` are made above for this plan, from the workload
        return Plan(
            workload_name=workload.name, workload_fingerprint=workload.fingerprint, policy=policy,
            budget_bytes=budget_bytes, actions=full, prefetch_step=dict(prefetch_step),
            recompute_groups=groups, schedule=schedule, info=dict(info or {}), recompute_regions=regions,
        )


def _check_regions(workload: Workload, regions: Sequence[Sequence[str]]) -> None:
    for i, region in enumerate(regions):
        for op_name in region:
            if op_name not in workload.op_index:
                raise PlanMismatchError(f"plan.recompute_regions[{i}] names op {op_name!r}, which the workload "
                                        "does not have: make the plan again")


def check_plan(workload: Workload, plan: Plan) -> None:
    """Raise PlanMismatchError or ValidationError unless ``plan`` can execute on ``workload``."""
    if not isinstance(workload, Workload):
        raise ValidationError(f"workload must be a slackswap.Workload, got {type(workload).__name__}: "
                              "use Workload.load(path) or a built-in model name")
    if not isinstance(plan, Plan):
        raise ValidationError(f"plan must be a slackswap.Plan, got {type(plan).__name__}: "
                              "use Plan.load(path), Plan.from_dict(data) or slackswap.plan(...)")
    if plan.workload_fingerprint != workload.fingerprint:
        raise PlanMismatchError(
            f"plan was made for workload {plan.workload_name!r} (fingerprint {plan.workload_fingerprint}), "
            f"not for {workload.name!r} (fingerprint {workload.fingerprint}): make the plan again for this workload"
        )
    saved = {t.name for t in workload.saved_tensors}
    for name in plan.actions:
        if name not in saved:
            raise PlanMismatchError(f"plan names tensor {name!r}, which the workload does not save: make the plan again")
    for t in workload.saved_tensors:
        if t.name not in plan.actions:
            raise PlanMismatchError(f"plan has no action for saved tensor {t.name!r}: make the plan again")
        action = plan.actions[t.name]
        if t.producer is None and action is not Action.KEEP:
            raise ValidationError(f"plan: {t.name!r} is a step input and can only be kept, not {action.value}")
    for name, action in plan.actions.items():
        if action is Action.SWAP:
            if name not in plan.prefetch_step:
                raise ValidationError(f"plan: swapped tensor {name!r} has no prefetch_step")
            first_use = first_use_step(workload, name)
            step = plan.prefetch_step[name]
            if not 0 <= step <= first_use:
                raise ValidationError(
                    f"plan: prefetch_step of {name!r} is {step}; it must be between 0 and {first_use}, "
                    "the backward step of its first use"
                )
        elif name in plan.prefetch_step:
            raise ValidationError(f"plan: {name!r} has a prefetch_step but is not swapped")
    _check_regions(workload, plan.recompute_regions)
    expected = derive_recompute_groups(workload, plan.actions, plan.prefetch_step, plan.recompute_regions)
    if dict(plan.recompute_groups) != expected:
        raise ValidationError(
            "plan.recompute_groups do not match the actions and prefetch steps: make the plan again "
            "(groups are derived by slackswap.schedule.derive_recompute_groups)"
        )
    starts = plan.schedule.start_steps()
    for name, step in starts.items():
        if name in plan.prefetch_step and not plan.prefetch_step[name] <= step <= first_use_step(workload, name):
            raise ValidationError(
                f"plan.schedule: the copy back of {name!r} starts at step {step}; it must be between its "
                f"prefetch_step {plan.prefetch_step[name]} and {first_use_step(workload, name)}, the step of its "
                "first use: make the plan again"
            )
    if plan.schedule != derive_schedule(workload, plan.prefetch_step, plan.recompute_groups, starts):
        raise ValidationError(
            "plan.schedule does not match the plan's prefetch steps and recompute groups: make the plan again "
            "(the schedule is derived by slackswap.schedule.derive_schedule)"
        )
