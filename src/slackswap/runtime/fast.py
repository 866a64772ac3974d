"""The fast paths of ``slackswap.apply`` (paths.py says when each is taken).

Neither installs a dispatch mode or saved-tensor hooks, so a step pays no Python per aten op:

* KeepRuntime: a model pre-hook only, for the checks below.
* CheckpointPathRuntime: the forward of each module call that holds a recompute group is wrapped,
  for the step, in non-reentrant ``torch.utils.checkpoint`` with ``preserve_rng_state=True``
  (dropout redraws the same masks, so gradients are bit-identical); a selective-checkpoint
  policy (checkpoint_backend._RegionPolicy, which also checks each op against the profile) is
  added only in calls where the plan keeps some tensors made inside the call.

What they check: the model and plan at apply (as every path), and at each step's start the
byte size of each positional tensor input of the model against the profile's. They do not check
the forward op by op (the replay path does): keeping everything is right for any ops, and
checkpoint re-runs whatever the call ran, so a changed model changes memory, never gradients.
``stats`` counts steps, checkpointed calls and their recomputes; the byte counters of the
replay path's swap manager stay 0 (nothing is tracked per tensor).
"""

from __future__ import annotations

import warnings

import torch
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

from ..errors import PlanMismatchError
from ..plans import Plan
from ..profile_trace import ROOT_CALL
from ..workload import Workload
from ..errors import RuntimeFallbackWarning
from ..profiler.model_support import called_from_compiled_code, check_not_capturing
from .base import enter_runtime, exit_runtime
from .checkpoint_backend import RegionWrapping, _RegionPolicy
from .checkpoint_map import Region
from .mapping import build_execution_map, profile_trace
from .paths import CHECKPOINT_PATH, KEEP_PATH, PathChoice
from .swap import RuntimeStats


def profiled_input_sizes(workload: Workload) -> tuple[tuple[str | None, int | None], ...]:
    """(name, storage bytes) of each positional tensor argument of the profiled model call
    (bytes None: a parameter or buffer)."""
    by_name = workload.tensor_by_name
    names = profile_trace(workload).call_args.get(ROOT_CALL, ())
    return tuple((name, by_name[name].size_bytes if name in by_name else None) for name in names)


class FastRuntime:
    """What both fast paths share: the nesting and step checks, and ``stats``."""

    path = ""

    def __init__(self, model: torch.nn.Module, plan: Plan, workload: Workload, choice: PathChoice) -> None:
        self.model = model
        self.plan = plan
        self.workload = workload
        self.choice = choice
        self.path_reason = choice.reason
        self.simulated_plan = choice.simulated_plan
        self.execution = (choice.checkpoint_map.execution if choice.checkpoint_map is not None
                          else build_execution_map(workload, plan))
        self.stats = RuntimeStats()
        self._inputs = profiled_input_sizes(workload)
        self._active = False
        self._warned_compiled = False

    def _install(self) -> None:
        """Path-specific set-up."""

    def _uninstall(self) -> None:
        """Path-specific tear-down."""

    def _on_step(self) -> None:
        """Path-specific work at each step's start."""

    def _check_compiled(self) -> None:
        """Nothing to say under torch.compile: the model compiles as without slackswap."""

    def __enter__(self):
        if self._active:
            raise RuntimeError(f"this {type(self).__name__} is already active")
        enter_runtime(self)
        self._active = True
        self._install()
        # Run as Python under torch.compile too (Dynamo compiles the model itself: no dispatch mode here).
        self._pre = self.model.register_forward_pre_hook(torch.compiler.disable(self._begin_step))
        return self

    def __exit__(self, *exc) -> None:
        self._pre.remove()
        self._uninstall()
        self._active = False
        exit_runtime(self)

    def _begin_step(self, module, args) -> None:
        if not torch.is_grad_enabled():
            return
        check_not_capturing("slackswap.apply")
        self._check_compiled()
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if len(tensors) != len(self._inputs):
            raise PlanMismatchError(
                f"the model was called with {len(tensors)} positional tensor argument(s), the profile has "
                f"{len(self._inputs)}: the model's inputs changed since profiling; profile again and make a new plan"
            )
        for k, (t, (name, size)) in enumerate(zip(tensors, self._inputs)):
            if size is not None and t.untyped_storage().nbytes() != size:
                raise PlanMismatchError(
                    f"model input #{k} ({name!r}) has {t.untyped_storage().nbytes()} bytes, the profile has {size}: "
                    "the model or batch shape changed since profiling; profile again and make a new plan"
                )
        self.stats.steps += 1
        self.stats.step_recompute_ops = 0
        self._on_step()


class KeepRuntime(FastRuntime):
    """All-keep plans: nothing runs during the step but the checks at its start."""

    path = KEEP_PATH


class CheckpointPathRuntime(RegionWrapping, FastRuntime):
    """Module-aligned recompute plans without swaps, run by torch.utils.checkpoint alone."""

    path = CHECKPOINT_PATH

    def __init__(self, model: torch.nn.Module, plan: Plan, workload: Workload, choice: PathChoice) -> None:
        super().__init__(model, plan, workload, choice)
        self.checkpoint_map = choice.checkpoint_map
        index = workload.op_index
        group_ops = {index[g] for group in plan.recompute_groups.values() for g in group}
        # Counted as the replay path counts: the plan's group ops (a call also re-runs views, no FLOPs).
        self._group_ops_in = {r.call: sum(1 for i in r.rerun if i in group_ops) for r in choice.checkpoint_map.regions}
        self._calls: dict[str, int] = {}
        self._wrapped: list = []

    def _check_compiled(self) -> None:
        if not self._warned_compiled and called_from_compiled_code():
            self._warned_compiled = True
            warnings.warn(
                "slackswap.apply: the model is called through torch.compile; the module calls the plan "
                "recomputes run eagerly under torch.utils.checkpoint (Dynamo breaks the graph around them), the "
                "rest compiles (gradients are unaffected): use slackswap.compile to plan a compiled model",
                RuntimeFallbackWarning, stacklevel=3,
            )

    def _wrap(self, forward, path: str, regions: dict[int, Region]):
        calls, stats, group_ops_in = self._calls, self.stats, self._group_ops_in

        @torch.compiler.disable
        def run(*args, **kwargs):
            if not torch.is_grad_enabled():
                return forward(*args, **kwargs)
            k = calls.get(path, 0)
            calls[path] = k + 1
            region = regions.get(k)
            if region is None:
                return forward(*args, **kwargs)
            runs = [0]

            def inner(*a, **kw):
                # checkpoint calls this once in forward and again for each recompute in backward.
                runs[0] += 1
                if runs[0] > 1:
                    stats.region_recomputes += 1
                    stats.recompute_ops += group_ops_in[region.call]
                    stats.step_recompute_ops += group_ops_in[region.call]
                return forward(*a, **kw)

            stats.checkpointed_calls += 1
            if all(region.recompute):
                return checkpoint(inner, *args, use_reentrant=False, preserve_rng_state=True, **kwargs)
            policy = _RegionPolicy(region)
            return checkpoint(inner, *args, use_reentrant=False, preserve_rng_state=True,
                              context_fn=lambda: create_selective_checkpoint_contexts(policy), **kwargs)

        return run
