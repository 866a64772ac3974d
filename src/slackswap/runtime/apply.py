"""apply_plan: train a model under a Plan (see docs/runtime.md)."""

from __future__ import annotations

import torch

from ..errors import PlanMismatchError, UnsupportedModelError, ValidationError
from ..hardware import DEFAULT_HARDWARE, get_hardware
from ..plans import Plan
from ..profiler.fsdp import FsdpUnits
from ..profiler.model_support import unwrap_model
from ..schedule import check_plan
from ..workload import Workload
from .base import RuntimeBase
from .checkpoint_backend import CheckpointRuntime
from .mapping import build_execution_map
from .paths import CHECKPOINT_PATH, KEEP_PATH, REPLAY_PATH, choose_path
from .swap import SwapManager


def checked_workload(model: torch.nn.Module, plan: Plan, workload: Workload | None) -> Workload:
    """The profile ``plan`` runs on, checked against the model: ``workload``, else the model object's
    last profile if the plan was made for it, else the profile the plan carries."""
    from ..profiler.profile import model_signature, workload_for

    if workload is None:
        workload = workload_for(model)
        if (workload is None or workload.fingerprint != getattr(plan, "workload_fingerprint", None)) \
                and getattr(plan, "profile", None) is not None:
            workload = plan.profile  # the profile the plan carries (saved in its file)
        if workload is None:
            raise PlanMismatchError(
                "no profile of this model object is known and the plan carries none: make the plan with "
                "slackswap.plan from slackswap.profile of this model, or pass workload="
            )
    check_plan(workload, plan)
    profiled = workload.meta.get("model_signature")
    if profiled is None:
        raise PlanMismatchError(
            f"workload {workload.name!r} was not measured by slackswap.profile: the runtime needs a profiled workload"
        )
    if profiled != model_signature(model):
        raise PlanMismatchError(
            f"the plan's workload was profiled from another model (signature {profiled}, this model "
            f"{model_signature(model)}): profile this model and make the plan again"
        )
    return workload


def check_same_plan_on_every_rank(plan: Plan) -> None:
    """Refuse, on every rank, a plan that differs between ranks of an FSDP2 model.

    A recompute group may need a unit's parameters before FSDP gathers them for its backward;
    the runtime gathers them then, and a gather is a collective that every rank must run at the
    same point. This is itself a collective: apply is called on every rank, as FSDP's forward is."""
    import hashlib
    import json

    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    digest = hashlib.sha256(json.dumps(plan.to_dict(), sort_keys=True).encode()).hexdigest()[:16]
    digests: list = [None] * dist.get_world_size()
    dist.all_gather_object(digests, digest)
    others = sorted({rank for rank, d in enumerate(digests) if d != digests[0]})
    if others:
        raise PlanMismatchError(
            f"slackswap.apply on an FSDP2 model: rank {others[0]} applies another plan than rank 0 (plan digest "
            f"{digests[others[0]]}, rank 0 {digests[0]}); the runtime may gather parameters for recompute, a "
            "collective every rank must run alike: make the plan on one rank and broadcast it to all"
        )


class PlanRuntime(RuntimeBase):
    """Context manager returned by :func:`apply_plan` for the replay backend."""

    path = REPLAY_PATH
    path_reason = 'backend="replay"'

    def __init__(self, model: torch.nn.Module, plan: Plan, workload: Workload | None = None) -> None:
        model = unwrap_model(model, "slackswap.apply")
        workload = checked_workload(model, plan, workload)
        execution = build_execution_map(workload, plan)
        super().__init__(model, plan, workload, execution,
                         lambda device: SwapManager(workload, plan, execution, device))
        self.manager.fsdp = FsdpUnits(model)
        if self.manager.fsdp:
            check_same_plan_on_every_rank(plan)

    def _install(self) -> None:
        self.manager.fsdp.install()  # before the step's pre-hook: FSDP gathers the root's parameters first

    def _uninstall(self) -> None:
        self.manager.fsdp.remove()


BACKENDS = ("auto", "replay", "checkpoint")


def apply_plan(model: torch.nn.Module, plan: Plan, workload: Workload | None = None, *, backend: str = "auto",
               hardware=None):
    """Train ``model`` under ``plan`` inside the returned context manager.

    ``workload`` is the profile the plan was made from; by default the last one
    slackswap.profile measured for this model object. Raises PlanMismatchError before
    anything runs when the plan, the workload and the model do not belong together.
    ``backend`` is "auto" (default: the fastest path that runs the plan exactly, paths.py: nothing
    installed for an all-keep plan, torch.utils.checkpoint alone for module-aligned recompute
    without swaps, else replay), "replay" (replays recompute groups op by op, runs any plan
    exactly) or "checkpoint" (torch.utils.checkpoint with selective-checkpoint policies plus the
    replay backend's recorder and swap hooks; refuses, with a CheckpointBackendError, plans it
    cannot run as planned). The returned runtime's ``path`` says which ran. ``hardware`` (auto and
    checkpoint, default the planning default) is what the checkpoint memory check simulates on.

    ``model`` may be wrapped by DistributedDataParallel or torch.compile: the runtime follows the
    module inside (profiler/model_support.py). FSDP2 (fully_shard) models are followed through
    FSDP's hooks; apply is then a collective (every rank must apply the same plan). FSDP1,
    tensor-parallel DTensor parameters and CUDA graph capture raise UnsupportedModelError.
    """
    model = unwrap_model(model, "slackswap.apply")
    if backend == "auto":
        return auto_runtime(model, plan, workload, hardware)
    if backend == "replay":
        if hardware is not None:
            raise ValidationError('hardware= is used by backend="auto" and "checkpoint" only: drop it for the '
                                  'replay backend')
        return PlanRuntime(model, plan, workload)
    if backend == "checkpoint":
        if FsdpUnits(model):
            raise UnsupportedModelError(
                'slackswap.apply: backend="checkpoint" does not follow FSDP2 (fully_shard) models yet: '
                'use backend="replay" or the default "auto"'
            )
        return CheckpointRuntime(model, plan, checked_workload(model, plan, workload), hardware)
    raise ValidationError(f"unknown runtime backend {backend!r}: use one of {', '.join(BACKENDS)}")


def auto_runtime(model: torch.nn.Module, plan: Plan, workload: Workload | None, hardware):
    """The runtime of the path choose_path picks (paths.py)."""
    from .fast import CheckpointPathRuntime, KeepRuntime

    workload = checked_workload(model, plan, workload)
    hw = get_hardware(hardware if hardware is not None else DEFAULT_HARDWARE)
    choice = choose_path(workload, plan, hw, fsdp=bool(FsdpUnits(model)))
    if choice.path == KEEP_PATH:
        return KeepRuntime(model, plan, workload, choice)
    if choice.path == CHECKPOINT_PATH:
        return CheckpointPathRuntime(model, plan, workload, choice)
    runtime = PlanRuntime(model, plan, workload)
    runtime.path_reason = choice.reason
    return runtime
