"""Run a training step under a Plan: recompute by replaying groups op by op (default) or through
selective checkpointing (backend="checkpoint"), swap through our own saved_tensors_hooks manager.
``apply_plan(model, plan, workload=None, backend="replay")`` is the entry point; ``build_execution_map``
and ``build_checkpoint_map`` say what each backend will run for each planned action (torch-free)."""

from __future__ import annotations

from ..errors import CheckpointBackendError
from .checkpoint_map import CheckpointMap, build_checkpoint_map
from .mapping import ExecutionMap, build_execution_map, runtime_prefetch_steps

__all__ = ["ExecutionMap", "apply_plan", "build_execution_map", "runtime_prefetch_steps", "PlanRuntime",
           "CheckpointBackendError", "CheckpointMap", "build_checkpoint_map"]


def __getattr__(name):
    # torch is imported only when the runtime itself is used.
    if name in ("apply_plan", "PlanRuntime", "RuntimeStats"):
        from . import apply, swap

        return {"apply_plan": apply.apply_plan, "PlanRuntime": apply.PlanRuntime,
                "RuntimeStats": swap.RuntimeStats}[name]
    raise AttributeError(name)
