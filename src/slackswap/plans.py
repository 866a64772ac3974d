"""Plan: what to do with every saved tensor of a workload, and the schedule that carries it out.

A plan gives each saved tensor an Action. SWAP tensors also get ``prefetch_step``:
the backward step at whose start their copy back is issued (step k is the backward
of op ``ops[n-1-k]``; step 0 starts when the forward pass ends). ``recompute_groups``
lists, for each backward step that needs them, the forward ops re-run just before
it. ``schedule`` is what the simulator and the runtime execute: the groups with their
steps, and the copies back in the order of the host-to-device stream, each with the step
it is issued at and the step its copy starts at. Groups and schedule are derived by
``slackswap.schedule`` (make_plan); this module holds the data and its JSON only, and
``slackswap.schedule.check_plan`` checks a loaded plan against the derivation.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from ._fields import (
    Fields, check_int, check_json, check_text, is_text, json_int, placed, read_json_file, show, write_text_atomic,
)
from .errors import PlanMismatchError, ValidationError
from .workload import Workload

PLAN_FORMAT = "slackswap.plan/2"
"""Version 2 adds ``schedule``. A version-1 file lacks the copy-back order and start steps,
which need the workload and the hardware to derive, so it is refused with the fix."""
_OLD_PLAN_FORMATS = ("slackswap.plan/1",)


class Action(str, enum.Enum):
    KEEP = "keep"
    SWAP = "swap"
    RECOMPUTE = "recompute"

    @classmethod
    def parse(cls, text: str, where: str) -> "Action":
        try:
            return cls(text)
        except ValueError:
            raise ValidationError(f"{where} is {text!r}: use one of keep, swap, recompute") from None


@dataclass(frozen=True)
class RecomputeGroup:
    """Forward ops re-run at the start of one backward step, before that step's backward op."""

    step: int
    before: str
    """The op whose backward step this is (it needs what the group rebuilds)."""
    ops: tuple[str, ...]
    """The forward ops re-run, in execution order."""

    def __post_init__(self) -> None:
        check_int(self.step, "recompute_group.step")
        check_text(self.before, "recompute_group.before")
        if not isinstance(self.ops, (tuple, list)) or not all(is_text(op) for op in self.ops):
            raise ValidationError(f"recompute_group.ops must be a list of op names, got {show(self.ops)}")
        object.__setattr__(self, "ops", tuple(self.ops))  # a list given loads back as the tuple


@dataclass(frozen=True)
class CopyBack:
    """One swapped tensor's copy back to the device."""

    tensor: str
    issue_step: int
    """The plan's prefetch step: the simulator issues the copy at the start of this backward step."""
    start_step: int
    """The backward step at which the simulated copy starts (after copies ahead of it on the stream,
    and memory, allow); the runtime issues it here, so it holds what the simulation holds."""

    def __post_init__(self) -> None:
        check_text(self.tensor, "copy_back.tensor")
        check_int(self.issue_step, "copy_back.issue_step")
        check_int(self.start_step, "copy_back.start_step")


@dataclass(frozen=True)
class ExecutionSchedule:
    """What runs when in the backward pass: the recompute groups by step, and the copies back in the
    order of the in-order host-to-device stream. Derived by slackswap.schedule.derive_schedule."""

    recompute_groups: tuple[RecomputeGroup, ...] = ()
    copy_backs: tuple[CopyBack, ...] = ()

    def __post_init__(self) -> None:
        for key, kind in (("recompute_groups", RecomputeGroup), ("copy_backs", CopyBack)):
            items = getattr(self, key)
            if not isinstance(items, (tuple, list)) or not all(isinstance(x, kind) for x in items):
                raise ValidationError(f"plan.schedule.{key} must be a tuple of {kind.__name__}, got {show(items)}")
            object.__setattr__(self, key, tuple(items))

    def group_at_step(self) -> dict[int, RecomputeGroup]:
        return {g.step: g for g in self.recompute_groups}

    def start_steps(self) -> dict[str, int]:
        return {c.tensor: c.start_step for c in self.copy_backs}

    def to_dict(self) -> dict[str, Any]:
        return {
            "recompute_groups": [{"step": g.step, "before": g.before, "ops": list(g.ops)} for g in self.recompute_groups],
            "copy_backs": [{"tensor": c.tensor, "issue_step": c.issue_step, "start_step": c.start_step}
                           for c in self.copy_backs],
        }

    @classmethod
    def from_dict(cls, data: Any) -> "ExecutionSchedule":
        top = Fields(data, "plan.schedule")
        read = {"recompute_groups": (RecomputeGroup, "recompute_group", ("step", "before", "ops")),
                "copy_backs": (CopyBack, "copy_back", ("tensor", "issue_step", "start_step"))}
        entries: dict[str, list] = {}
        for key, (kind, prefix, names) in read.items():
            entries[key] = []
            for i, raw in enumerate(top.list(key)):
                f = Fields(raw, f"plan.schedule.{key}[{i}]")
                values = {name: json_int(f.raw(name)) for name in names}
                f.no_extra()
                try:  # the constructor checks the values; its message is placed in the file
                    entries[key].append(kind(**values))
                except ValidationError as exc:
                    raise placed(exc, prefix, f.where) from None
        top.no_extra()
        return cls(recompute_groups=tuple(entries["recompute_groups"]), copy_backs=tuple(entries["copy_backs"]))


@dataclass(frozen=True, kw_only=True)
class Plan:
    workload_name: str
    workload_fingerprint: str
    policy: str
    budget_bytes: int | None
    """Activation budget the plan was made for; None for the unconstrained (ideal) plan."""
    actions: Mapping[str, Action]
    prefetch_step: Mapping[str, int] = field(default_factory=dict)
    recompute_groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    recompute_regions: tuple[tuple[str, ...], ...] = ()
    """Ops that re-run as one unit, as a checkpointed function does: a recompute group that re-runs
    one op of a region re-runs all of them (slackswap.schedule.derive_recompute_groups).
    ``selective-recompute`` sets one per eager attention core; empty for every other policy."""
    schedule: ExecutionSchedule = field(default_factory=ExecutionSchedule)
    """The execution order the simulator and the runtime follow (part of the plan's identity)."""
    info: Mapping[str, Any] = field(default_factory=dict, compare=False)
    """Planner diagnostics (objective values, solve time); not part of the plan's identity."""
    profile: Workload | None = field(default=None, compare=False, repr=False)
    """The profiled workload the runtime follows (ops, saves, module calls), carried by plans that
    slackswap.plan makes from a profile and saved with them, so the plan applies to a model of the
    same signature in another process without ``workload=``. None for built-in workloads."""

    def __post_init__(self) -> None:
        _validate_plan(self)

    def count(self, action: Action) -> int:
        return sum(1 for a in self.actions.values() if a is action)

    def bytes_with(self, workload: Workload, action: Action) -> int:
        return sum(workload.tensor_by_name[n].size_bytes for n, a in self.actions.items() if a is action)

    def recompute_flops(self, workload: Workload) -> float:
        """Forward FLOPs the recompute groups re-run (the profile's per-op FLOPs)."""
        index = workload.op_index
        return math.fsum(workload.ops[index[o]].flops for group in self.recompute_groups.values() for o in group)

    def to_dict(self, workload: Workload | None = None) -> dict[str, Any]:
        names = [t.name for t in workload.saved_tensors] if workload is not None else list(self.actions)
        rows = []
        for name in names:
            row: dict[str, Any] = {"name": name, "action": self.actions[name].value}
            if name in self.prefetch_step:
                row["prefetch_step"] = self.prefetch_step[name]
            rows.append(row)
        return {
            "format": PLAN_FORMAT,
            "workload": self.workload_name,
            "workload_fingerprint": self.workload_fingerprint,
            "policy": self.policy,
            "budget_bytes": self.budget_bytes,
            "tensors": rows,
            "recompute_groups": {k: list(v) for k, v in self.recompute_groups.items()},
            **({"recompute_regions": [list(r) for r in self.recompute_regions]} if self.recompute_regions else {}),
            "schedule": self.schedule.to_dict(),
            "info": dict(self.info),
            **({"profile": self.profile.to_dict()} if self.profile is not None else {}),
        }

    def to_json(self, workload: Workload | None = None) -> str:
        return json.dumps(self.to_dict(workload), indent=1)

    def save(self, path, workload: Workload | None = None) -> None:
        write_text_atomic(path, self.to_json(workload) + "\n")

    @classmethod
    def from_dict(cls, data: Any) -> "Plan":
        top = Fields(data, "plan")
        fmt = top.str("format", default=PLAN_FORMAT)
        if fmt in _OLD_PLAN_FORMATS:
            raise ValidationError(
                f"plan.format is {fmt!r}, from an older slackswap, without the execution schedule "
                f"{PLAN_FORMAT!r} carries: make the plan again (slackswap plan, or slackswap.plan)"
            )
        if fmt != PLAN_FORMAT:
            raise ValidationError(f"plan.format is {fmt!r}, expected {PLAN_FORMAT!r}: make the plan again")
        budget = top.obj.get("budget_bytes")
        top.used.add("budget_bytes")
        if budget is not None:
            budget = top.int("budget_bytes", positive=True)  # the constructor checks it again; this reads 3.0 as 3
        actions: dict[str, Action] = {}
        prefetch: dict[str, int] = {}
        for i, raw in enumerate(top.list("tensors")):
            f = Fields(raw, f"plan.tensors[{i}]")
            name = f.str("name")
            if name in actions:
                raise ValidationError(f"plan.tensors[{i}] names {name!r} twice: give each tensor one action")
            actions[name] = Action.parse(f.str("action"), f"plan.tensors[{i}].action")
            if "prefetch_step" in f.obj:
                prefetch[name] = f.int("prefetch_step")
            f.no_extra()
        groups_raw = top.dict("recompute_groups", default={})
        groups: dict[str, tuple[str, ...]] = {}
        for key, value in groups_raw.items():
            if not isinstance(value, list):
                raise ValidationError(f"plan.recompute_groups[{show(key)}] must be a list of op names")
            groups[key] = tuple(value)  # names checked by the constructor
        regions = []
        for i, value in enumerate(top.list("recompute_regions", default=[])):
            if not isinstance(value, list):
                raise ValidationError(f"plan.recompute_regions[{i}] must be a list of op names")
            regions.append(tuple(value))  # names checked by the constructor
        profile = None
        if "profile" in top.obj:
            top.used.add("profile")
            profile = Workload.from_dict(top.obj["profile"])
        plan = cls(
            workload_name=top.str("workload"), workload_fingerprint=top.str("workload_fingerprint"),
            policy=top.str("policy"), budget_bytes=budget, actions=actions, prefetch_step=prefetch,
            recompute_groups=groups, recompute_regions=tuple(regions),
            schedule=ExecutionSchedule.from_dict(top.dict("schedule")),
            info=top.dict("info", default={}), profile=profile,
        )
        top.no_extra()
        if profile is not None and profile.fingerprint != plan.workload_fingerprint:
            # The carried profile must be the plan's workload; the rest of the plan is checked
            # against it (slackswap.schedule.check_plan) when it is simulated or applied.
            raise PlanMismatchError(
                f"plan was made for workload {plan.workload_name!r} (fingerprint {plan.workload_fingerprint}), "
                f"but the profile it carries has fingerprint {profile.fingerprint}: make the plan again"
            )
        return plan

    @classmethod
    def load(cls, path) -> "Plan":
        return cls.from_dict(read_json_file(path, "plan"))


_DERIVED = contextvars.ContextVar("slackswap_plan_derived", default=False)


@contextlib.contextmanager
def derived_entries():
    """Within it, a Plan made takes its actions and recompute groups as they are: for
    schedule.make_plan, whose actions are Actions keyed by a workload's saved tensors and whose
    groups are tuples of its ops, in dicts made for the plan (a planning call makes dozens of plans
    and checking each of their hundreds of names cost a fifth of making one)."""
    token = _DERIVED.set(True)
    try:
        yield
    finally:
        _DERIVED.reset(token)


def _validate_plan(plan: Plan) -> None:
    """The checks every Plan passes, built in code or loaded: what the loader reads back equal.
    Actions given as strings ('swap') become Actions; anything else is a ValidationError. Inside
    derived_entries the actions and groups are taken as they are."""
    check_text(plan.workload_name, "plan.workload")
    check_text(plan.workload_fingerprint, "plan.workload_fingerprint")
    check_text(plan.policy, "plan.policy")
    if plan.budget_bytes is not None:
        check_int(plan.budget_bytes, "plan.budget_bytes", minimum=1)
    for key in ("actions", "prefetch_step", "recompute_groups", "info"):
        if not isinstance(getattr(plan, key), Mapping):
            raise ValidationError(f"plan.{key} must be a dict, got {show(getattr(plan, key))}")
    derived = _DERIVED.get()
    actions: dict[str, Action] = plan.actions if derived else {}
    for name, action in () if derived else plan.actions.items():
        check_text(name, "plan.actions key")
        if not isinstance(action, Action):
            if not isinstance(action, str):
                raise ValidationError(f"plan.actions[{name!r}] must be an Action (keep, swap, recompute), got {show(action)}")
            action = Action.parse(action, f"plan.actions[{name!r}]")
        actions[name] = action
    for name, step in plan.prefetch_step.items():
        if name not in actions:
            raise ValidationError(f"plan.prefetch_step names {show(name)}, which has no action: give it one or drop it")
        check_int(step, f"plan.prefetch_step[{name!r}]")
    groups: dict[str, tuple[str, ...]] = plan.recompute_groups if derived else {}
    for reader, group in () if derived else plan.recompute_groups.items():
        check_text(reader, "plan.recompute_groups key")
        if not isinstance(group, (tuple, list)) or not all(is_text(op) for op in group):
            raise ValidationError(f"plan.recompute_groups[{reader!r}] must be a tuple of op names, got {show(group)}")
        groups[reader] = tuple(group)
    if not isinstance(plan.recompute_regions, (tuple, list)) or not all(
            isinstance(r, (tuple, list)) and r and all(is_text(op) for op in r) for r in plan.recompute_regions):
        raise ValidationError("plan.recompute_regions must be a tuple of non-empty tuples of op names, "
                              f"got {show(plan.recompute_regions)}")
    check_json(dict(plan.info), "plan.info")
    if not isinstance(plan.schedule, ExecutionSchedule):
        raise ValidationError(f"plan.schedule must be an ExecutionSchedule, got {type(plan.schedule).__name__}")
    if plan.profile is not None and not isinstance(plan.profile, Workload):
        raise ValidationError(f"plan.profile must be a slackswap.Workload or None, got {type(plan.profile).__name__}")
    # Normalised copies, so that a plan built with strings or lists equals the one it saves and loads.
    object.__setattr__(plan, "actions", actions)
    object.__setattr__(plan, "prefetch_step", dict(plan.prefetch_step))
    object.__setattr__(plan, "recompute_groups", groups)
    object.__setattr__(plan, "recompute_regions", tuple(tuple(r) for r in plan.recompute_regions))
    object.__setattr__(plan, "info", dict(plan.info))

