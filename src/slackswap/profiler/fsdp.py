"""FSDP2 (``torch.distributed.fsdp.fully_shard``) as the profiler and the runtime see it.

A unit wrapped by ``fully_shard`` all-gathers its parameters in its forward pre-hook, frees
them in its forward post-hook (``reshard_after_forward``) and gathers them again in backward.
That work is FSDP's, not the model's, and the gathered parameters are parameters, not
activations. ``FsdpUnits`` brackets each unit's forward hooks so the dispatch modes skip the
ops inside them (all-gather, copy-out, reshard), and notes the storages of the gathered
parameters once a unit's pre-hook ran, so that saves of them are never swapped or recomputed.

FSDP keeps one storage object per gathered parameter and resizes it to 0 and back, so those
storages are recognised by identity, not by address: after a reshard an activation may be
allocated at the address a parameter had.
"""

from __future__ import annotations

import sys

import torch


def fsdp_module_type() -> type | None:
    """FSDPModule, if FSDP was imported (a model cannot be sharded without it)."""
    kind = getattr(sys.modules.get("torch.distributed.fsdp"), "FSDPModule", None)
    return kind if isinstance(kind, type) else None


def dtensor_type() -> type | None:
    kind = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
    return kind if isinstance(kind, type) else None


def fsdp_units(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(path, module) of every module of ``model`` wrapped by fully_shard, outermost first."""
    kind = fsdp_module_type()
    if kind is None:
        return []
    return [(path, m) for path, m in model.named_modules() if isinstance(m, kind)]


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The tensor that holds ``t``'s memory on this rank (a DTensor's local shard)."""
    kind = dtensor_type()
    if kind is not None and isinstance(t, kind):
        with torch.no_grad():
            return t.to_local()
    return t


def storage_id(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


class FsdpUnits:
    """While installed: ``inside`` > 0 while one of FSDP's forward hooks runs, and ``gathered``
    maps the storage of every gathered parameter seen so far to the unit that owns it."""

    def __init__(self, model: torch.nn.Module | None = None) -> None:
        self.units = [m for _, m in fsdp_units(model)] if model is not None else []
        self._unit_ids = {id(m) for m in self.units}
        self.inside = 0
        self.gathered: dict[int, torch.nn.Module] = {}
        self._handles: list = []

    def __bool__(self) -> bool:
        return bool(self.units)

    def install(self) -> None:
        """Hooks around FSDP's own: its pre-hook is prepended and its post-hook appended when
        fully_shard runs, so a prepended hook runs before each and an appended one after."""
        for unit in self.units:
            self._handles += [
                unit.register_forward_pre_hook(self._enter_pre, prepend=True),
                unit.register_forward_pre_hook(self._leave_pre),
                unit.register_forward_hook(self._enter_post, prepend=True),
                unit.register_forward_hook(self._leave_post),
            ]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.inside = 0

    def _enter_pre(self, unit, args) -> None:
        self.inside += 1

    def _leave_pre(self, unit, args) -> None:
        self.inside -= 1
        for p in self._own_parameters(unit):
            if p.untyped_storage().nbytes():
                self.gathered.setdefault(storage_id(p), unit)

    def _enter_post(self, unit, args, output) -> None:
        self.inside += 1

    def _leave_post(self, unit, args, output) -> None:
        self.inside -= 1

    def _own_parameters(self, unit):
        """The parameters ``unit`` gathers: its modules' own, not those of units nested in it."""
        kind = dtensor_type()
        stack = [unit]
        while stack:
            module = stack.pop()
            for p in module.parameters(recurse=False):
                if kind is None or not isinstance(p, kind):
                    yield p
            stack.extend(c for c in module.children() if id(c) not in self._unit_ids)

    def is_gathered(self, t: torch.Tensor) -> bool:
        return bool(self.gathered) and storage_id(t) in self.gathered

    def regather(self, t: torch.Tensor) -> bool:
        """Gather the unit that owns ``t`` again if FSDP freed it after forward.

        A recompute group may re-run a unit's ops in the backward of a later unit, before
        FSDP gathers this one for its own backward. FSDPModule.unshard is a collective, so
        every rank must run the same plan (PlanRuntime checks it); FSDP's own pre-backward
        gather of the unit then finds it gathered and does nothing. True when it gathered."""
        if not self.gathered or t.untyped_storage().nbytes() != 0:
            return False
        unit = self.gathered.get(storage_id(t))
        if unit is None:
            return False
        unit.unshard()
        return True
