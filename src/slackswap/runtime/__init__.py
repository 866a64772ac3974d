"""Run a training step under a Plan: on a fast path where the plan allows (nothing installed for an
all-keep plan; torch.utils.checkpoint alone for module-aligned recompute, paths.py), else by
replaying groups op by op or through selective checkpointing (backend="checkpoint"), swapping
through our own saved_tensors_hooks manager. ``apply_plan(model, plan, workload=None,
backend="auto")`` is the entry point; ``choose_path``, ``build_execution_map`` and
``build_checkpoint_map`` say what will run for each planned action (torch-free)."""

from __future__ import annotations

from ..errors import CheckpointBackendError
from .checkpoint_map import CheckpointMap, build_checkpoint_map
from .mapping import ExecutionMap, build_execution_map, runtime_prefetch_steps
from .paths import PathChoice, choose_path

__all__ = ["ExecutionMap", "apply_plan", "build_execution_map", "runtime_prefetch_steps", "PlanRuntime",
           "CheckpointBackendError", "CheckpointMap", "build_checkpoint_map", "PathChoice", "choose_path"]


def __getattr__(name):
    # torch is imported only when the runtime itself is used.
    if name in ("apply_plan", "PlanRuntime", "RuntimeStats"):
        from . import apply, swap

        return {"apply_plan": apply.apply_plan, "PlanRuntime": apply.PlanRuntime,
                "RuntimeStats": swap.RuntimeStats}[name]
    raise AttributeError(name)
