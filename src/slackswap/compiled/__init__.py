"""The compiled path: ``slackswap.compile`` plans each graph torch.compile makes and carries the plan
out in the partitioner (recompute tags, PyTorch's activation-offloading ops). docs/runtime.md."""

from __future__ import annotations

__all__ = ["compile_with_plan", "CompiledPlans", "CompiledGraph"]


def __getattr__(name):
    # torch is imported only when the compiled path is used.
    if name in __all__:
        from . import compile as _compile, partition

        return {"compile_with_plan": _compile.compile_with_plan, "CompiledPlans": _compile.CompiledPlans,
                "CompiledGraph": partition.CompiledGraph}[name]
    raise AttributeError(name)
