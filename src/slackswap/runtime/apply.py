"""apply_plan: train a model under a Plan (see docs/runtime.md)."""

from __future__ import annotations

import threading

import torch

from ..errors import PlanMismatchError, RuntimeUsageError, UnsupportedModelError, ValidationError
from ..plans import Plan
from ..profiler.fsdp import FsdpUnits, local_tensor
from ..schedule import check_plan
from ..profiler.model_support import called_from_compiled_code, check_not_capturing, unwrap_model, \
    warn_compiled_runs_eagerly
from ..workload import Workload
from .mapping import ExecutionMap, build_execution_map
from .replay import ForwardRecorder, RecordingMode
from .swap import RuntimeStats, SwapManager


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


def device_and_param_keys(model: torch.nn.Module) -> tuple[torch.device, set]:
    """The model's device, and the storages of its parameters and buffers, which are never activations."""
    params = [local_tensor(p) for p in list(model.parameters()) + list(model.buffers())]
    device = params[0].device if params else torch.device("cpu")
    return device, {(p.device.type, p.device.index, p.untyped_storage().data_ptr()) for p in params}


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


_ACTIVE = threading.local()  # saved-tensor hooks and dispatch modes are per thread, so is the check


def enter_runtime(runtime) -> None:
    """Refuse a second runtime inside an active one: the inner hooks would see the outer step's tensors."""
    if getattr(_ACTIVE, "runtime", None) is not None:
        raise RuntimeUsageError(
            "slackswap.apply is already active in this thread: nested applies are not supported (the inner "
            "runtime would receive the outer model's saved tensors); leave the outer 'with' block first, or "
            "profile and plan the outer model as one"
        )
    _ACTIVE.runtime = runtime


def exit_runtime(runtime) -> None:
    if getattr(_ACTIVE, "runtime", None) is runtime:
        _ACTIVE.runtime = None


def check_new_step(runtime) -> None:
    """A model call while the step's forward is under way is a second call in one step."""
    recorder = runtime.recorder
    if 0 < recorder.i < recorder.n:
        at = recorder.i
        recorder.i = recorder.n
        raise RuntimeUsageError(
            f"the model was called again during its step (after forward op {at} of {recorder.n}): slackswap.apply "
            "runs one model call per training step; call the model once in loss_fn (concatenate the inputs), or "
            "wrap both calls in one module and profile that"
        )


def check_step_context(runtime) -> None:
    """At a step's start: refuse a CUDA graph capture; warn once per runtime object when the
    model is called through torch.compile, which then runs it eagerly (model_support.py)."""
    check_not_capturing("slackswap.apply")
    if not runtime._warned_compiled and called_from_compiled_code():
        runtime._warned_compiled = True
        warn_compiled_runs_eagerly("slackswap.apply")


class PlanRuntime:
    """Context manager returned by :func:`apply_plan`. ``stats`` has the manager's counters,
    ``execution`` the ExecutionMap (what runs for each planned action)."""

    def __init__(self, model: torch.nn.Module, plan: Plan, workload: Workload | None = None) -> None:
        model = unwrap_model(model, "slackswap.apply")
        workload = checked_workload(model, plan, workload)
        self.model = model
        self.plan = plan
        self.workload = workload
        self.execution: ExecutionMap = build_execution_map(workload, plan)
        device, keys = device_and_param_keys(model)
        self.manager = SwapManager(workload, plan, self.execution, device)
        self.manager.param_keys = keys
        self.manager.fsdp = FsdpUnits(model)
        if self.manager.fsdp:
            check_same_plan_on_every_rank(plan)
        self.recorder = ForwardRecorder(workload, self.execution, self.manager, keys)
        self._active = False
        self._warned_compiled = False

    @property
    def stats(self) -> RuntimeStats:
        return self.manager.stats

    # ---- install / remove --------------------------------------------------------------------
    def __enter__(self) -> "PlanRuntime":
        if self._active:
            raise RuntimeError("this PlanRuntime is already active")
        enter_runtime(self)
        self._active = True
        self.manager.fsdp.install()  # before _begin_step: FSDP gathers the root's parameters first
        self._pre = self.model.register_forward_pre_hook(self._begin_step)
        self._post = self.model.register_forward_hook(self._end_model_forward)
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self.manager.pack, self.manager.unpack)
        self._hooks.__enter__()
        self._mode = RecordingMode(self.recorder)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
        self._hooks.__exit__(*exc)
        self._post.remove()
        self._pre.remove()
        self.manager.fsdp.remove()
        self._active = False
        exit_runtime(self)
        if exc[0] is not None:
            # The step failed: release the host pool and what the step holds (docs/runtime.md, Failures).
            self.manager.abandon_step()
            self.recorder.begin_step()
            self.recorder.i = self.recorder.n

    def _begin_step(self, module, args) -> None:
        if torch.is_grad_enabled():
            check_step_context(self)
            check_new_step(self)
            self.manager.begin_step()
            self.recorder.begin_step()

    def _end_model_forward(self, module, args, output) -> None:
        # The model's last op has its autograd node by now: hook it (ops after the model, in
        # loss_fn, are hooked when the next op starts).
        self.recorder.resolve_pending()


BACKENDS = ("replay", "checkpoint")


def apply_plan(model: torch.nn.Module, plan: Plan, workload: Workload | None = None, *, backend: str = "replay",
               hardware=None):
    """Train ``model`` under ``plan`` inside the returned context manager.

    ``workload`` is the profile the plan was made from; by default the last one
    slackswap.profile measured for this model object. Raises PlanMismatchError before
    anything runs when the plan, the workload and the model do not belong together.
    ``backend`` is "replay" (default: replays recompute groups op by op, runs any plan exactly)
    or "checkpoint" (torch.utils.checkpoint with selective-checkpoint policies; refuses, with a
    CheckpointBackendError, plans it cannot run as planned). ``hardware`` (checkpoint only, default
    the planning default) is what its memory check simulates on.

    ``model`` may be wrapped by DistributedDataParallel or torch.compile: the runtime follows the
    module inside (profiler/model_support.py). FSDP2 (fully_shard) models are followed through
    FSDP's hooks; apply is then a collective (every rank must apply the same plan). FSDP1,
    tensor-parallel DTensor parameters and CUDA graph capture raise UnsupportedModelError.
    """
    model = unwrap_model(model, "slackswap.apply")
    if backend == "replay":
        if hardware is not None:
            raise ValidationError('hardware= is used by backend="checkpoint" only: drop it for the replay backend')
        return PlanRuntime(model, plan, workload)
    if backend == "checkpoint":
        from .checkpoint_backend import CheckpointRuntime

        if FsdpUnits(model):
            raise UnsupportedModelError(
                'slackswap.apply: backend="checkpoint" does not follow FSDP2 (fully_shard) models yet: '
                'use the default backend="replay"'
            )
        return CheckpointRuntime(model, plan, checked_workload(model, plan, workload), hardware)
    raise ValidationError(f"unknown runtime backend {backend!r}: use one of {', '.join(BACKENDS)}")
