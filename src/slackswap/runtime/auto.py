"""Automatic mode: a plan per input signature, profiled and planned the first time it is seen.

``slackswap.auto(model, loss_fn, hardware=..., budget=..., policy=..., cache_dir=None)`` returns an
AutoRuntime. Each batch's *signature* is the tree structure of the batch with each tensor's shape,
dtype and device and every other leaf's type and (for plain scalars and strings) value, plus the
model's signature and training mode. A new signature is profiled with slackswap.profile (which
restores gradients, buffers and the RNG streams afterwards, so the step that follows trains as a
plain step would) and planned; the (workload, plan) pair is cached in memory and, with
``cache_dir``, in one JSON file per signature that another process reads instead of profiling.

Two batches of one signature can still take different code paths (a padding mask that is all
ones lets a model skip masking): the profiled ops then differ, and the runtime raises
PlanMismatchError during the forward, before any gradient. ``AutoRuntime.step`` catches it,
restores the RNG streams and buffers, profiles the batch as another *variant* of the signature
and runs the step again; the ``with auto(batch):`` form lets the error through.

On an FSDP2 (fully_shard) model in a process group of more than one rank, profiling runs FSDP's
collectives and the runtime may gather parameters for a recompute, so the ranks act together: each
step they check that they all step on batches of one signature (else PlanMismatchError, on every
rank); a new signature is looked up in ``cache_dir`` by rank 0 only and, when absent, profiled on
every rank; rank 0 plans from its profile and sends the (workload, plan) pair to every rank, and
only rank 0 writes the cache file. Every rank then applies the same plan.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten

from .._fields import read_json_file, write_text_atomic
from ..errors import BudgetError, PlanMismatchError, ValidationError
from ..hardware import DEFAULT_HARDWARE, get_hardware
from ..plans import Plan
from ..units import parse_budget
from ..workload import Workload

_SCALARS = (bool, int, float, str, type(None))
_ANY_PEAK_BYTES = 1 << 62


def batch_signature(batch: Any) -> str:
    """Hash of what decides the profiled ops and sizes: the batch's structure, each tensor's
    shape, dtype, device and requires_grad, and every other leaf's type (and value, for plain
    scalars and strings). Tensor values are not part of it."""
    leaves, spec = tree_flatten(batch)
    parts = [str(spec)]
    for x in leaves:
        if isinstance(x, torch.Tensor):
            parts.append(f"T{tuple(x.shape)}:{x.dtype}:{x.device}:{int(x.requires_grad)}")
        elif isinstance(x, _SCALARS):
            parts.append(f"{type(x).__name__}:{x!r}")
        else:
            parts.append(type(x).__qualname__)
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


@dataclass
class AutoStats:
    steps: int = 0
    profiles: int = 0
    """Signatures (and code-path variants) profiled and planned in this process."""
    disk_hits: int = 0
    """Signatures whose plan was read from ``cache_dir`` instead of profiled."""
    retries: int = 0
    """Steps run again because the batch took another code path than its signature's plans."""
    profile_time_s: float = 0.0
    plan_time_s: float = 0.0
    signatures: list[str] = field(default_factory=list)
    """Keys profiled or loaded, in order."""


@dataclass
class _Entry:
    workload: Workload
    plan: Plan


class AutoRuntime:
    """Plans per input signature; see the module docstring. ``stats`` counts what it did."""

    def __init__(self, model: torch.nn.Module, loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor], *,
                 plan_fn: Callable[..., Plan], hardware=None, budget: float | int | str = 0.5,
                 policy: str = "slackswap", cache_dir: str | os.PathLike | None = None, warmup: int = 1,
                 repeats: int = 3) -> None:
        """``plan_fn`` is slackswap.plan (passed in by slackswap.auto, so that this module does not
        import the API that imports it)."""
        if not isinstance(model, torch.nn.Module):
            raise ValidationError(f"auto needs a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self.loss_fn = loss_fn
        self.plan_fn = plan_fn
        self.hardware = get_hardware(hardware if hardware is not None else DEFAULT_HARDWARE)
        parse_budget(budget, _ANY_PEAK_BYTES)  # a malformed budget fails here, not at the first step
        self.budget = budget
        self.policy = policy
        self.cache_dir = os.fspath(cache_dir) if cache_dir is not None else None
        self.warmup, self.repeats = warmup, repeats
        self.stats = AutoStats()
        self._variants: dict[str, list[_Entry]] = {}
        self._group = _fsdp_group(model)

    # ---- keys and the caches -----------------------------------------------------------------
    def key(self, batch: Any) -> str:
        from ..profiler.profile import model_signature
        from ..profiler.model_support import unwrap_model

        inner = unwrap_model(self.model, "slackswap.auto")
        what = json.dumps([model_signature(inner), inner.training, batch_signature(batch), self.hardware.name,
                           repr(self.budget), self.policy], separators=(",", ":"))
        return hashlib.sha256(what.encode()).hexdigest()[:20]

    def _path(self, key: str, variant: int) -> str:
        return os.path.join(self.cache_dir, f"{key}-{variant}.json")

    def _load(self, key: str) -> list[_Entry]:
        if self._group is None:
            return self._read(key)
        # rank 0 reads: another rank must not skip a profile (a collective) rank 0 runs
        shared = [[(e.workload.to_dict(), e.plan.to_dict(e.workload)) for e in self._read(key)]
                  if self._group.rank == 0 else None]
        self._group.broadcast(shared)
        entries = [_Entry(Workload.from_dict(w), Plan.from_dict(p)) for w, p in shared[0]]
        if entries and self._group.rank != 0:
            self.stats.disk_hits += 1
            self.stats.signatures.append(key)
        return entries

    def _read(self, key: str) -> list[_Entry]:
        entries: list[_Entry] = []
        if self.cache_dir is None:
            return entries
        while os.path.exists(self._path(key, len(entries))):
            data = read_json_file(self._path(key, len(entries)), "auto cache entry")
            if not isinstance(data, dict) or "workload" not in data or "plan" not in data:
                raise ValidationError(f"{self._path(key, len(entries))} is not a slackswap.auto cache entry: "
                                      "delete it (it is made again)")
            entries.append(_Entry(Workload.from_dict(data["workload"]), Plan.from_dict(data["plan"])))
        if entries:
            self.stats.disk_hits += 1
            self.stats.signatures.append(key)
        return entries

    def _profile(self, key: str, batch: Any) -> _Entry:
        from ..profiler import profile_model

        start = time.perf_counter()
        workload = profile_model(self.model, batch, self.loss_fn, warmup=self.warmup, repeats=self.repeats)
        planned = time.perf_counter()
        if self._group is None:
            plan = self._plan(workload)
        else:  # rank 0's profile and plan for every rank: the ranks' timings differ, their plans must not
            shared = [(workload.to_dict(), self._plan(workload).to_dict(workload)) if self._group.rank == 0 else None]
            self._group.broadcast(shared)
            workload, plan = Workload.from_dict(shared[0][0]), Plan.from_dict(shared[0][1])
        done = time.perf_counter()
        self.stats.profiles += 1
        self.stats.profile_time_s += planned - start
        self.stats.plan_time_s += done - planned
        self.stats.signatures.append(key)
        entry = _Entry(workload, plan)
        variants = self._variants.setdefault(key, [])
        variants.append(entry)
        if self.cache_dir is not None and (self._group is None or self._group.rank == 0):
            os.makedirs(self.cache_dir, exist_ok=True)
            text = json.dumps({"workload": workload.to_dict(), "plan": plan.to_dict(workload)})
            write_text_atomic(self._path(key, len(variants) - 1), text + "\n")
        return entry

    def _plan(self, workload: Workload) -> Plan:
        """The policy's plan; a byte budget above this shape's unconstrained peak keeps everything."""
        from ..sim import simulate_ideal

        peak = simulate_ideal(workload, self.hardware).peak_memory_bytes
        try:
            budget = parse_budget(self.budget, peak)
        except BudgetError:
            if parse_budget(self.budget, _ANY_PEAK_BYTES) <= peak:
                raise
            budget = peak  # a smaller shape than the budget was chosen for: everything fits
        return self.plan_fn(workload, self.hardware, budget, self.policy)

    def entries(self, batch: Any) -> tuple[str, list[_Entry]]:
        """The key of ``batch`` and its known variants (read from ``cache_dir`` the first time)."""
        key = self.key(batch)
        if self._group is not None:
            self._group.check_same_key(key)
        if key not in self._variants:
            self._variants[key] = self._load(key)
        return key, self._variants[key]

    # ---- running steps ----------------------------------------------------------------------
    def __call__(self, batch: Any):
        """Context manager for one step on ``batch``: its signature's plan, profiled if new."""
        key, variants = self.entries(batch)
        entry = variants[0] if variants else self._profile(key, batch)
        self.stats.steps += 1
        return self._runtime(entry)

    def _runtime(self, entry: _Entry):
        from .apply import apply_plan

        return apply_plan(self.model, entry.plan, entry.workload)

    def step(self, batch: Any) -> torch.Tensor:
        """``loss_fn(model, batch).backward()`` under the batch's plan; returns the loss (detached).

        A batch that takes another code path than its signature's known plans is profiled as a
        new variant and the step is run again from the same RNG state and buffers."""
        key, variants = self.entries(batch)
        self.stats.steps += 1
        if not variants:
            variants = [self._profile(key, batch)]
        rng = _RngAndBuffers(self.model)
        for entry in list(variants):
            try:
                return self._run(entry, batch)
            except PlanMismatchError:
                rng.restore()
                self.stats.retries += 1
        entry = self._profile(key, batch)
        return self._run(entry, batch)

    def _run(self, entry: _Entry, batch: Any) -> torch.Tensor:
        with self._runtime(entry):
            loss = self.loss_fn(self.model, batch)
            loss.backward()
        return loss.detach()

    def __enter__(self) -> "AutoRuntime":
        return self

    def __exit__(self, *exc) -> None:
        return None


class _RngAndBuffers:
    """The CPU and CUDA RNG states and the model's buffers at a step's start (a failed forward
    may have drawn dropout masks and updated running statistics)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        self.buffers = {name: b.detach().clone() for name, b in model.named_buffers()}

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)
        with torch.no_grad():
            for name, b in self.model.named_buffers():
                b.copy_(self.buffers[name])



@dataclass(frozen=True)
class _RankGroup:
    """The default process group, as an FSDP2 model's ranks agree through it."""

    rank: int
    world_size: int

    def broadcast(self, objects: list) -> None:
        import torch.distributed as dist

        dist.broadcast_object_list(objects, src=0)

    def check_same_key(self, key: str) -> None:
        import torch.distributed as dist

        keys: list = [None] * self.world_size
        dist.all_gather_object(keys, key)
        others = [rank for rank, k in enumerate(keys) if k != keys[0]]
        if others:
            raise PlanMismatchError(
                f"slackswap.auto on an FSDP2 model: rank {others[0]} steps on a batch of another signature than "
                "rank 0 (shapes, dtypes or structure differ); every rank must run the same plan: pad the batches "
                "of one step to the same shapes on every rank")


def _fsdp_group(model: torch.nn.Module) -> _RankGroup | None:
    """A _RankGroup when ``model`` is FSDP2-sharded in a process group of more than one rank."""
    from ..profiler.fsdp import fsdp_units
    from ..profiler.model_support import unwrap_model

    if not fsdp_units(unwrap_model(model, "slackswap.auto")):
        return None
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    return _RankGroup(dist.get_rank(), dist.get_world_size())
