"""Which torch models and call contexts the profiler and the runtime accept, checked up front.

Both follow one training step through a TorchDispatchMode, saved-tensor hooks and module
hooks on the model's own parameters. Wrappers that keep the model's parameters as they are
(DistributedDataParallel, a torch.compile wrapper) are looked through; FSDP2 (fully_shard on a
1-D mesh) is followed through its hooks (fsdp.py); FSDP1, FSDP2 on a 2-D mesh, DTensor
parameters of tensor parallelism and CUDA graph capture are refused with
UnsupportedModelError, before anything runs (docs/limitations.md, "The runtime").
"""

from __future__ import annotations

import sys
import warnings

import torch

from ..errors import RuntimeFallbackWarning, UnsupportedModelError
from .fsdp import fsdp_units

_SHARDED_FIX = ("shard the model with FSDP2 (torch.distributed.fsdp.fully_shard on a 1-D mesh), or run slackswap "
                "on an unsharded model (one full replica per GPU, for example under DistributedDataParallel)")


def _distributed_types() -> dict[str, type]:
    """The sharding wrapper and tensor types, from the modules already loaded: a model cannot be
    sharded without them, and importing FSDP costs about a second."""
    found: dict[str, type] = {}
    for label, module, name in (("FullyShardedDataParallel (FSDP1)", "torch.distributed.fsdp", "FullyShardedDataParallel"),
                                ("DTensor", "torch.distributed.tensor", "DTensor")):
        kind = getattr(sys.modules.get(module), name, None)
        if isinstance(kind, type):
            found[label] = kind
    return found


def _compile_type(name: str) -> type | None:
    """A class of torch.compile's wrapper, if Dynamo is loaded (without loading it: 1-2 s)."""
    module = sys.modules.get("torch._dynamo.eval_frame")
    return getattr(module, name, None) if module is not None else None


def unwrap_model(model: torch.nn.Module, purpose: str) -> torch.nn.Module:
    """The module whose parameters and forward the profiler and runtime follow.

    DistributedDataParallel and single-device DataParallel hold the model unchanged in
    ``.module``, a torch.compile wrapper in ``._orig_mod``: their inner module is profiled and
    hooked, so a plan made for the plain model runs under the wrapper and the other way round.
    Profiling the inner module also runs no collective, so each rank can profile alone."""
    seen = 0
    while seen < 8:  # compile(DDP(model)) and the like; a cycle would be a bug in the wrapper
        seen += 1
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module
        elif isinstance(model, torch.nn.DataParallel):
            if len(model.device_ids or ()) > 1:
                raise UnsupportedModelError(
                    f"{purpose}: torch.nn.DataParallel over {len(model.device_ids)} GPUs runs the model in "
                    "several threads at once, and slackswap follows one step in one thread: use "
                    "DistributedDataParallel (one process per GPU) instead"
                )
            model = model.module
        elif _compile_type("OptimizedModule") is not None and isinstance(model, _compile_type("OptimizedModule")):
            model = model._orig_mod
        else:
            break
    check_supported(model, purpose)
    return model


def check_supported(model: torch.nn.Module, purpose: str) -> None:
    """Raise UnsupportedModelError for FSDP1, FSDP2 on a 2-D mesh and DTensor parameters that
    no fully_shard unit manages (tensor parallelism)."""
    types = _distributed_types()
    if not types:
        return
    kind = types.get("FullyShardedDataParallel (FSDP1)")
    if kind is not None:
        for path, module in model.named_modules():
            if isinstance(module, kind):
                where = f"module {path!r}" if path else "the model"
                raise UnsupportedModelError(
                    f"{purpose}: {where} is wrapped by FullyShardedDataParallel (FSDP1), whose flat parameters "
                    f"are gathered into new storage every step, which the profiler and runtime cannot follow: {_SHARDED_FIX}"
                )
    dtensor = types.get("DTensor")
    if dtensor is None:
        return
    units = [path for path, _ in fsdp_units(model)]
    for name, p in model.named_parameters():
        if not isinstance(p, dtensor):
            continue
        managed = any(path == "" or name.startswith(path + ".") for path in units)
        if not managed:
            raise UnsupportedModelError(
                f"{purpose}: parameter {name!r} is a DTensor that no fully_shard unit manages (tensor "
                f"parallel), which the profiler and runtime cannot follow: {_SHARDED_FIX}"
            )
        if p.device_mesh.ndim != 1:
            raise UnsupportedModelError(
                f"{purpose}: parameter {name!r} is sharded by fully_shard over a {p.device_mesh.ndim}-D mesh "
                f"(HSDP or FSDP with tensor parallel), which slackswap does not follow yet: {_SHARDED_FIX}"
            )


def check_not_capturing(purpose: str) -> None:
    """Raise UnsupportedModelError inside a CUDA graph capture: the runtime decides in Python at
    every saved tensor and issues copies on its own streams, none of which a graph can replay."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise UnsupportedModelError(
            f"{purpose}: a CUDA graph is being captured, and the runtime's copies and recompute "
            "decisions run in Python at every saved tensor, which a graph cannot replay: run the "
            "step outside torch.cuda.graph and outside torch.compile(mode='reduce-overhead')"
        )


def called_from_compiled_code(max_frames: int = 64) -> bool:
    """Whether the current call came through a torch.compile wrapper (its frame is on the stack).

    Dynamo runs a frame eagerly while a TorchDispatchMode is active, and the runtime records
    every step with one: a compiled model trains correctly under the runtime, but uncompiled."""
    optimize_context = _compile_type("OptimizeContext")
    if optimize_context is None:  # nothing was ever compiled in this process
        return False
    frame = sys._getframe(1)
    for _ in range(max_frames):
        if frame is None:
            return False
        if frame.f_code.co_filename.endswith("eval_frame.py") and \
                isinstance(frame.f_locals.get("self"), optimize_context):
            return True
        frame = frame.f_back
    return False


def warn_compiled_runs_eagerly(purpose: str) -> None:
    warnings.warn(
        f"{purpose}: the model is called through torch.compile, but slackswap records each step with a "
        "TorchDispatchMode and Dynamo runs frames eagerly while one is active, so this model runs "
        "uncompiled under the runtime (gradients are unaffected): compare the speed with the compiled "
        "model without slackswap (docs/limitations.md)",
        RuntimeFallbackWarning, stacklevel=3,
    )
