"""What both runtime backends share (replay: apply.PlanRuntime; checkpoint:
checkpoint_backend.CheckpointRuntime)."""

from __future__ import annotations

import gc
import threading
import weakref

import torch
from torch.utils._pytree import tree_flatten

from ..errors import RuntimeUsageError
from ..plans import Plan
from ..profiler.fsdp import local_tensor
from ..profiler.model_support import called_from_compiled_code, check_not_capturing, warn_compiled_runs_eagerly
from ..profiler.tracer import storage_key
from ..workload import Workload
from .mapping import ExecutionMap
from .replay import ForwardRecorder, RecordingMode
from .swap import RuntimeStats, SwapManager


def device_and_param_keys(model: torch.nn.Module) -> tuple[torch.device, set]:
    """The model's device, and the storages of its parameters and buffers, which are never activations."""
    params = [local_tensor(p) for p in list(model.parameters()) + list(model.buffers())]
    device = params[0].device if params else torch.device("cpu")
    return device, {storage_key(p) for p in params}


def check_step_context(runtime) -> None:
    """At a step's start: refuse a CUDA graph capture; warn once per runtime object when the
    model is called through torch.compile, which then runs it eagerly (model_support.py)."""
    check_not_capturing("slackswap.apply")
    if not runtime._warned_compiled and called_from_compiled_code():
        runtime._warned_compiled = True
        warn_compiled_runs_eagerly("slackswap.apply")


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
    """A model call while the step's forward is under way is a second call in one step, unless the
    earlier forward was abandoned: run without its loss ops (a forward whose output was dropped,
    an evaluation under grad) and its graph gone, so no backward can reach it any more."""
    recorder = runtime.recorder
    if 0 < recorder.i < recorder.n:
        if not runtime.earlier_forward_reachable():
            return  # the caller starts the new step, which forgets the abandoned one
        at = recorder.i
        recorder.i = recorder.n
        raise RuntimeUsageError(
            f"the model was called again during its step (after forward op {at} of {recorder.n}): slackswap.apply "
            "runs one model call per training step; call the model once in loss_fn (concatenate the inputs), or "
            "wrap both calls in one module and profile that (if the earlier call was an evaluation, run it under "
            "torch.no_grad() or drop its outputs before the next step)"
        )


class RuntimeBase:
    """What both backends share: a swap manager fed by saved-tensor hooks, a forward recorder fed
    by a dispatch mode, a step that starts at the model's forward, and on leaving after an
    exception, the step abandoned (host pool released) and the recorder parked until the next
    step. ``stats`` has the manager's counters, ``execution`` the ExecutionMap (what runs for each
    planned action). A backend gives the manager and may add ``_install`` / ``_uninstall`` steps."""

    def __init__(self, model: torch.nn.Module, plan: Plan, workload: Workload, execution: ExecutionMap,
                 make_manager) -> None:
        self.model = model
        self.plan = plan
        self.workload = workload
        self.execution = execution
        device, keys = device_and_param_keys(model)
        self.manager: SwapManager = make_manager(device)
        self.manager.param_keys = keys
        self.recorder = ForwardRecorder(workload, execution, self.manager, keys)
        self._active = False
        self._warned_compiled = False
        self._outputs: list[weakref.ref] = []  # the model's outputs of the latest forward

    path = ""
    """The execution path (paths.py): "replay" or "checkpoint-recorded" here."""
    path_reason = ""

    @property
    def stats(self) -> RuntimeStats:
        return self.manager.stats

    @property
    def simulated_plan(self) -> Plan:
        """The plan as this runtime runs it, for the simulator."""
        return self.plan

    # ---- install / remove --------------------------------------------------------------------
    def _recording_mode(self) -> RecordingMode:
        return RecordingMode(self.recorder)

    def _install(self) -> None:
        """Backend-specific set-up, before the hooks."""

    def _uninstall(self) -> None:
        """Backend-specific tear-down, after the hooks are removed."""

    def _on_step(self) -> None:
        """Backend-specific work at the start of each step."""

    def __enter__(self):
        if self._active:
            raise RuntimeError(f"this {type(self).__name__} is already active")
        enter_runtime(self)
        self._active = True
        self._mode = self._recording_mode()
        self._install()
        self._pre = self.model.register_forward_pre_hook(self._begin_step)
        self._post = self.model.register_forward_hook(self._end_model_forward)
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self.manager.pack, self.manager.unpack)
        self._hooks.__enter__()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
        self._hooks.__exit__(*exc)
        self._post.remove()
        self._pre.remove()
        self._uninstall()
        self._active = False
        exit_runtime(self)
        if exc[0] is not None:
            # The step failed: release the host pool and what the step holds, and record nothing more
            # until the next step starts (docs/runtime.md, Failures).
            self.manager.abandon_step()
            self.recorder.begin_step()
            self.recorder.i = self.recorder.n

    def _begin_step(self, module, args) -> None:
        if torch.is_grad_enabled():
            check_step_context(self)
            check_new_step(self)
            self._on_step()
            self.manager.begin_step()
            self.recorder.begin_step()

    def _end_model_forward(self, module, args, output) -> None:
        # The model's last op has its autograd node by now: hook it (ops after the model, in
        # loss_fn, are hooked when the next op starts).
        self.recorder.resolve_pending()
        if torch.is_grad_enabled():
            self._outputs = [weakref.ref(t) for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor)]

    def earlier_forward_reachable(self) -> bool:
        """Whether the latest forward's graph can still run backward: autograd holds one of its
        saved tensors, or the caller holds one of the model's outputs. Collected garbage first
        (a graph in a reference cycle is unreachable but not yet freed)."""
        def alive() -> bool:
            return self.manager.holds_saved_tensors() or any(ref() is not None for ref in self._outputs)

        if not alive():
            return False
        gc.collect()
        return alive()
