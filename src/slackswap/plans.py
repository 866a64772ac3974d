"""Plan: what to do with every saved tensor of a workload, and the schedule that carries it out.

A plan gives each saved tensor an Action. SWAP tensors also get ``prefetch_step``:
the backward step at whose start their copy back is issued (step k is the backward
of op ``ops[n-1-k]``; step 0 starts when the forward pass ends). ``recompute_groups``
lists, for each backward step that needs them, the forward ops re-run just before
it. Groups are derived from the actions and prefetch steps by
``slackswap.schedule.derive_recompute_groups``; they are stored so that a person, the
runtime and the trace can read them, and checked against the derivation on load.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from ._fields import Fields, read_json_file, write_text_atomic
from .errors import PlanMismatchError, ValidationError
from .workload import Workload

PLAN_FORMAT = "slackswap.plan/1"


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
    info: Mapping[str, Any] = field(default_factory=dict, compare=False)
    """Planner diagnostics (objective values, solve time); not part of the plan's identity."""
    profile: Workload | None = field(default=None, compare=False, repr=False)
    """The profiled workload the runtime follows (ops, saves, module calls), carried by plans that
    slackswap.plan makes from a profile and saved with them, so the plan applies to a model of the
    same signature in another process without ``workload=``. None for built-in workloads."""

    def count(self, action: Action) -> int:
        return sum(1 for a in self.actions.values() if a is action)

    def bytes_with(self, workload: Workload, action: Action) -> int:
        return sum(workload.tensor_by_name[n].size_bytes for n, a in self.actions.items() if a is action)

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
        if fmt != PLAN_FORMAT:
            raise ValidationError(f"plan.format is {fmt!r}, expected {PLAN_FORMAT!r}: make the plan again")
        budget = top.obj.get("budget_bytes")
        top.used.add("budget_bytes")
        if budget is not None:
            budget = top.int("budget_bytes", positive=True)
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
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValidationError(f"plan.recompute_groups[{key!r}] must be a list of op names")
            groups[key] = tuple(value)
        profile = None
        if "profile" in top.obj:
            top.used.add("profile")
            profile = Workload.from_dict(top.obj["profile"])
        plan = cls(
            workload_name=top.str("workload"), workload_fingerprint=top.str("workload_fingerprint"),
            policy=top.str("policy"), budget_bytes=budget, actions=actions, prefetch_step=prefetch,
            recompute_groups=groups, info=top.dict("info", default={}), profile=profile,
        )
        top.no_extra()
        if profile is not None:
            check_plan(profile, plan)  # the carried profile is the plan's workload
        return plan

    @classmethod
    def load(cls, path) -> "Plan":
        return cls.from_dict(read_json_file(path, "plan"))


def check_plan(workload: Workload, plan: Plan) -> None:
    """Raise PlanMismatchError or ValidationError unless ``plan`` can execute on ``workload``."""
    from .schedule import derive_recompute_groups  # schedule imports plan; keep the cycle local

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
    n = len(workload.ops)
    for name, action in plan.actions.items():
        if action is Action.SWAP:
            if name not in plan.prefetch_step:
                raise ValidationError(f"plan: swapped tensor {name!r} has no prefetch_step")
            first_use = n - 1 - workload.op_index[max(workload.tensor_by_name[name].bwd_readers, key=workload.op_index.__getitem__)]
            step = plan.prefetch_step[name]
            if not 0 <= step <= first_use:
                raise ValidationError(
                    f"plan: prefetch_step of {name!r} is {step}; it must be between 0 and {first_use}, "
                    "the backward step of its first use"
                )
        elif name in plan.prefetch_step:
            raise ValidationError(f"plan: {name!r} has a prefetch_step but is not swapped")
    expected = derive_recompute_groups(workload, plan.actions, plan.prefetch_step)
    if dict(plan.recompute_groups) != expected:
        raise ValidationError(
            "plan.recompute_groups do not match the actions and prefetch steps: make the plan again "
            "(groups are derived by slackswap.schedule.derive_recompute_groups)"
        )
