"""apply_plan: train a model under a Plan (see docs/runtime.md)."""

from __future__ import annotations

from collections import defaultdict

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from ..errors import PlanMismatchError
from ..plans import Plan, check_plan
from ..workload import Workload
from .mapping import ExecutionMap, Region, build_execution_map
from .swap import RuntimeStats, SwapManager


class _RegionPolicy:
    """SAC policy of one region call: MUST_SAVE or PREFER_RECOMPUTE per aten op, by position."""

    def __init__(self, region: Region) -> None:
        self.region = region
        self.i = 0

    def __call__(self, ctx, func, *args, **kwargs) -> CheckpointPolicy:
        r = self.region
        aten = getattr(func, "overloadpacket", func).__name__
        if self.i >= len(r.save_policy) or aten != r.aten[self.i]:
            raise PlanMismatchError(
                f"module call {r.call!r} ran {aten} as its op #{self.i}, the profile has "
                f"{r.aten[self.i] if self.i < len(r.aten) else 'no more ops'}: the model changed; profile again"
            )
        save = r.save_policy[self.i]
        self.i += 1
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE


class PlanRuntime:
    """Context manager returned by :func:`apply_plan`. ``stats`` has the manager's counters,
    ``execution`` the ExecutionMap (what runs for each planned action)."""

    def __init__(self, model: torch.nn.Module, plan: Plan, workload: Workload | None = None) -> None:
        from ..profiler.profile import model_signature, workload_for

        if workload is None:
            workload = workload_for(model)
            if workload is None:
                raise PlanMismatchError(
                    "no profile of this model object is known: pass workload= (the Workload the plan was made from)"
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
        self.model = model
        self.plan = plan
        self.workload = workload
        self.execution: ExecutionMap = build_execution_map(workload, plan)
        params = list(model.parameters()) + list(model.buffers())
        device = params[0].device if params else torch.device("cpu")
        self.manager = SwapManager(workload, plan, self.execution, device)
        self.manager.param_keys = {(p.device.type, p.device.index, p.untyped_storage().data_ptr()) for p in params}
        self._active = False

    @property
    def stats(self) -> RuntimeStats:
        return self.manager.stats

    # ---- install / remove --------------------------------------------------------------------
    def __enter__(self) -> "PlanRuntime":
        if self._active:
            raise RuntimeError("this PlanRuntime is already active")
        self._active = True
        by_path: dict[str, dict[int, Region]] = defaultdict(dict)
        for region in self.execution.regions:
            path, _, k = region.call.partition("@")
            by_path["" if path == "model" else path][int(k or 0)] = region
        self._calls: dict[str, int] = defaultdict(int)
        self._wrapped = []
        for path, regions in by_path.items():
            module = self.model.get_submodule(path) if path else self.model
            self._wrapped.append((module, "forward" in module.__dict__, module.__dict__.get("forward")))
            module.forward = self._wrap(module.forward, path, regions)
        self._pre = self.model.register_forward_pre_hook(self._begin_step)
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self.manager.pack, self.manager.unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
        self._pre.remove()
        for module, had, previous in self._wrapped:
            if had:
                module.forward = previous
            else:
                del module.forward
        self._active = False

    def _begin_step(self, module, args) -> None:
        if torch.is_grad_enabled():
            self._calls.clear()
            self.manager.begin_step()

    def _wrap(self, forward, path: str, regions: dict[int, Region]):
        manager = self.manager
        calls = self._calls

        def run(*args, **kwargs):
            k = calls[path]
            calls[path] += 1
            region = regions.get(k)
            if region is None or not torch.is_grad_enabled():
                return forward(*args, **kwargs)
            manager.region_forward(region.call)
            policy = _RegionPolicy(region)
            return checkpoint(forward, *args, use_reentrant=False, preserve_rng_state=True,
                              context_fn=lambda: create_selective_checkpoint_contexts(policy), **kwargs)

        return run


def apply_plan(model: torch.nn.Module, plan: Plan, workload: Workload | None = None) -> PlanRuntime:
    """Train ``model`` under ``plan`` inside the returned context manager.

    ``workload`` is the profile the plan was made from; by default the last one
    slackswap.profile measured for this model object. Raises PlanMismatchError before
    anything runs when the plan, the workload and the model do not belong together.
    """
    return PlanRuntime(model, plan, workload)
