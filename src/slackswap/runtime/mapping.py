"""What the runtime will do for a Plan, worked out without running anything (pure Python, no torch).

Every tensor autograd saves goes through the swap manager's saved_tensors_hooks, in the order
the profiler recorded (slackswap.profile_trace): it is kept, swapped or recomputed exactly as the
plan says. A recompute group is re-run op by op, at the start of the backward step the plan
gives it, from a record of each op's arguments the runtime takes in forward (see replay.py),
so the runtime re-runs exactly the plan's ops: its recompute FLOPs are the plan's, and what it
holds follows the plan's memory rules (docs/simulator.md).

``build_execution_map`` checks that a plan can run this way and lists, in order, the tensors
the manager will see. ``notes`` says why not where it cannot; ``aligned`` is True when the
runtime runs the plan exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ..errors import PlanMismatchError
from ..plans import Action, Plan
from ..profile_trace import STORAGE_VERSIONS, ProfileTrace, aten_of
from ..workload import Workload

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
    reader: int
    """Op index whose backward reads it through this save."""


@dataclass(frozen=True)
class ExecutionMap:
    realized: Mapping[str, Action]
    """What happens to each saved tensor of the workload (the plan's action when aligned)."""
    pack_sequence: tuple[PackEntry, ...]
    group_ops: frozenset[int]
    """Op indices some recompute group re-runs: the runtime records their arguments in forward."""
    random_ops: frozenset[int]
    """Those among group_ops that draw random numbers: their RNG state is recorded too."""
    plan_recompute_flops: float
    runtime_recompute_flops: float
    swap_bytes: int
    """Bytes copied out (and back) per step."""
    notes: tuple[str, ...] = field(default=())

    @property
    def aligned(self) -> bool:
        return not self.notes


def profile_trace(workload: Workload) -> ProfileTrace:
    """The profiler's trace of ``workload``, or a PlanMismatchError naming the fix."""
    try:
        trace = ProfileTrace.from_meta(workload.meta)
    except KeyError as missing:
        raise PlanMismatchError(
            f"workload {workload.name!r} has no profiler trace (meta.{missing.args[0]}): the runtime needs a "
            "workload from slackswap.profile for this model"
        ) from None
    except (ValueError, TypeError, AttributeError) as exc:
        raise PlanMismatchError(
            f"workload {workload.name!r} has a malformed profiler trace ({exc}): profile the model again"
        ) from None
    if trace.storage_versions != STORAGE_VERSIONS:
        raise PlanMismatchError(
            f"workload {workload.name!r} was profiled by an older slackswap (in-place writes are not tensor "
            "versions): profile the model again and make the plan again"
        )
    return trace


def build_execution_map(workload: Workload, plan: Plan) -> ExecutionMap:
    trace = profile_trace(workload)
    ops = workload.ops
    index = workload.op_index
    actions = plan.actions
    sequence = tuple(
        PackEntry(save.tensor, actions[save.tensor], index[save.reader])
        for save in trace.saves if save.tensor is not None
    )
    group_ops = frozenset(index[g] for group in plan.recompute_groups.values() for g in group)
    random_ops = frozenset(i for i in group_ops if aten_of(ops[i].name) in RANDOM_OPS)
    notes: list[str] = []
    seen = {e.name for e in sequence}
    unseen = [t.name for t in workload.saved_tensors if t.producer is not None and t.name not in seen]
    if unseen:
        notes.append(f"{len(unseen)} saved tensor(s) never reach the saved-tensor hooks (first: {unseen[0]!r}): "
                     "profile again")
    plan_flops = plan.recompute_flops(workload)
    swap_bytes = plan.bytes_with(workload, Action.SWAP)
    return ExecutionMap(realized=dict(actions), pack_sequence=sequence, group_ops=group_ops, random_ops=random_ops,
                        plan_recompute_flops=plan_flops, runtime_recompute_flops=plan_flops,
                        swap_bytes=swap_bytes, notes=tuple(notes))


def runtime_prefetch_steps(workload: Workload, plan_or_actions) -> dict[str, int]:
    """Prefetch steps for swapped tensors when no hardware says when to copy: a plan's own steps
    (the runtime follows them exactly); for bare actions, the first backward step that reads
    each swapped tensor, either in backward or as the input of a recompute group (so groups
    rebuild from the copy rather than re-running its producer)."""
    from ..schedule import first_need_step

    if isinstance(plan_or_actions, Plan):
        return dict(plan_or_actions.prefetch_step)
    return first_need_step(workload, plan_or_actions)
