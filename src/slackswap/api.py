"""The short public API: names and fractions in, Plans and Timelines out.

``slackswap.plan`` and ``slackswap.simulate`` accept a Workload or a built-in model name,
a Hardware or a preset name, and a budget given as a fraction of the unconstrained
peak (0.5), a byte count (int) or a size string ("12GiB"). ``profile`` and ``apply``
import torch only when called.
"""

from __future__ import annotations

from typing import Any

from .errors import BudgetError, ValidationError
from .hardware import DEFAULT_HARDWARE, Hardware, get_hardware
from .plans import Plan
from .timeline import Timeline
from .units import parse_budget
from .workload import Workload

__all__ = [
    "DEFAULT_HARDWARE", "apply", "device_memory", "fit", "model_states", "plan", "plan_for_gpu", "profile", "simulate",
]


def _workload(workload: Workload | str, hardware: Hardware) -> Workload:
    """A built-in model's workload, or ``workload`` with times for ``hardware``: a profile timed on
    a CPU or on another GPU is projected by the roofline (profiler.build.timed_for)."""
    if isinstance(workload, Workload):
        from .profiler.build import timed_for

        return timed_for(workload, hardware)
    if not isinstance(workload, str):
        raise ValidationError(f"workload must be a slackswap.Workload or a built-in model name, got "
                              f"{type(workload).__name__}: use Workload.load(path) for a file")
    from .workloads.models import build_model_workload

    return build_model_workload(workload, hardware)


def plan(
    workload: Workload | str,
    hardware: Hardware | str = DEFAULT_HARDWARE,
    budget: float | int | str | None = None,
    policy: str = "slackswap",
    *,
    gpu_memory: int | str | None = None,
    **device: Any,
) -> Plan:
    """Plan keep / swap / recompute for every saved tensor of ``workload`` within ``budget``
    (saved-activation bytes; default 0.5 of the unconstrained peak), or, with ``gpu_memory``
    (bytes or a size such as "80GiB"), so that the whole step's simulated reserved peak fits
    the GPU; ``device`` takes the DeviceOptions fields (optimizer, precision, shard, sharding,
    expandable_segments; docs/memory.md).

    The plan carries the backward step at which the simulation starts each copy back, which
    is when the runtime issues it (slackswap.sim.copy_starts)."""
    from .planners import plan_workload
    from .sim import simulate_ideal, with_copy_in_start_steps

    hw = get_hardware(hardware)
    w = _workload(workload, hw)
    if gpu_memory is not None:
        result = plan_for_gpu(w, hw, gpu_memory, policy, budget=budget, **device).plan
    else:
        _no_device_options(device)
        peak = simulate_ideal(w, hw).peak_memory_bytes
        result = plan_workload(w, hw, parse_budget(0.5 if budget is None else budget, peak), policy)
    result = with_copy_in_start_steps(w, hw, result)
    if w.meta.get("source") == "slackswap.profiler":
        import dataclasses

        # The plan carries the profile, so it applies to the model in another process (docs/runtime.md).
        result = dataclasses.replace(result, profile=w)
    return result


_plan_fn = plan
"""``plan``, for functions whose own ``plan`` argument hides it."""


def simulate(
    workload: Workload | str,
    hardware: Hardware | str = DEFAULT_HARDWARE,
    plan: Plan | None = None,
    budget: float | int | str | None = None,
    *,
    policy: str | None = None,
    gpu_memory: int | str | None = None,
    **device: Any,
) -> Timeline:
    """Simulate one step under ``plan`` (or under ``policy``, planned on the fly; ideal if neither).
    With ``gpu_memory`` and no plan, ``policy`` plans so that the step fits the GPU (as ``plan``);
    ``device_memory`` gives the step's memory beyond activations."""
    from .sim import simulate as simulate_plan, simulate_ideal

    hw = get_hardware(hardware)
    w = _workload(workload, hw)
    if gpu_memory is not None and plan is None:
        return plan_for_gpu(w, hw, gpu_memory, policy or "ideal", budget=budget, **device).timeline
    _no_device_options(device)
    ideal = simulate_ideal(w, hw)
    budget_bytes = None if budget is None else parse_budget(budget, ideal.peak_memory_bytes)
    if plan is None and policy in (None, "ideal"):
        return ideal
    if plan is None:
        from .planners import plan_workload

        if budget_bytes is None:
            raise BudgetError(f"policy {policy!r} needs a budget: pass budget=0.5 or a byte count")
        plan = plan_workload(w, hw, budget_bytes, policy)
    return simulate_plan(w, hw, plan, budget_bytes)


def profile(model: Any, example_batch: Any, loss_fn: Any, **options: Any) -> Workload:
    """Measure one training step of a torch model (needs the torch extra)."""
    from .errors import require

    require("torch", "torch", "profiling a PyTorch model")
    from .profiler import profile_model

    return profile_model(model, example_batch, loss_fn, **options)


def apply(model: Any, plan: Plan, *, backend: str = "auto", **options: Any):
    """Context manager: train ``model`` under ``plan`` (needs the torch extra).

    ``backend="auto"`` (default) takes the fastest path that runs the plan exactly (the runtime's
    ``path``: "keep", "checkpoint" or "replay"); ``backend="replay"`` runs any plan exactly;
    ``backend="checkpoint"`` recomputes through torch.utils.checkpoint and refuses plans it cannot
    run as planned (docs/runtime.md, Backends)."""
    from .errors import require

    require("torch", "torch", "running a plan on a PyTorch model")
    from .runtime import apply_plan

    return apply_plan(model, plan, backend=backend, **options)


def auto(model: Any, loss_fn: Any, *, hardware: Hardware | str = DEFAULT_HARDWARE, budget: float | int | str = 0.5,
         policy: str = "slackswap", cache_dir: Any = None, **options: Any):
    """Train under a plan per input signature, each profiled and planned once (needs the torch extra).

    ``auto(batch)`` is a context manager for one step on ``batch``; ``auto.step(batch)`` runs
    ``loss_fn(model, batch).backward()`` and also handles a batch that takes another code path.
    Plans are cached in memory and, with ``cache_dir``, in files (docs/runtime.md, Automatic mode)."""
    from .errors import require

    require("torch", "torch", "running a plan on a PyTorch model")
    from .runtime.auto import AutoRuntime

    return AutoRuntime(model, loss_fn, plan_fn=plan, hardware=hardware, budget=budget, policy=policy,
                       cache_dir=cache_dir, **options)


def model_states(
    model: Workload | str | Any,
    *,
    optimizer: str = "adam",
    precision: str = "bf16-mixed",
    shard: int = 1,
    sharding: str = "fsdp",
):
    """Per-rank parameter, gradient and optimizer-state bytes (a ``slackswap.memory.ModelStates``)
    of a built-in model name, a Workload (built-in or profiled), a TransformerSpec or a parameter
    count, with ``optimizer`` ('sgd', 'sgd-momentum', 'adam', 'adamw'), ``precision`` ('fp32',
    'bf16', 'bf16-mixed') and the states sharded over ``shard`` ranks by ``sharding`` ('none',
    'zero1', 'zero2', 'zero3', 'fsdp'). docs/memory.md gives the accounting."""
    from .memory import model_states as states_of

    if isinstance(model, str):
        from .workloads.models import model_spec

        model = model_spec(model)
    return states_of(model, optimizer=optimizer, precision=precision, ranks=shard, sharding=sharding)


def _device_options(device: dict[str, Any]):
    from .memory.device_plan import DeviceOptions

    try:
        return DeviceOptions(**device)
    except TypeError:
        from .errors import ValidationError

        raise ValidationError(
            f"unknown device option(s) {', '.join(sorted(device))}: use optimizer, precision, shard, sharding, "
            "expandable_segments"
        ) from None


def _no_device_options(device: dict[str, Any]) -> None:
    if device:
        raise BudgetError(f"{', '.join(sorted(device))} need gpu_memory: give the GPU's memory (for example '80GiB')")


def gpu_memory_bytes_for(gpu_memory: int | str) -> int:
    """A GPU's memory as bytes, from an int or a size string ("80GiB")."""
    from .units import parse_size_bytes

    if isinstance(gpu_memory, bool) or not isinstance(gpu_memory, (int, str)):
        raise BudgetError(f"GPU memory must be a byte count or a size such as 80GiB, got {gpu_memory!r}")
    if isinstance(gpu_memory, str):
        return parse_size_bytes(gpu_memory)
    if gpu_memory <= 0:
        raise BudgetError(f"GPU memory of {gpu_memory} bytes must be positive")
    return gpu_memory


def plan_for_gpu(
    workload: Workload | str,
    hardware: Hardware | str = DEFAULT_HARDWARE,
    gpu_memory: int | str = "80GiB",
    policy: str = "slackswap",
    *,
    budget: Any = None,
    **device: Any,
):
    """A ``slackswap.memory.DevicePlan``: the ``policy`` plan whose simulated reserved peak (model
    states, activations, gradients, workspaces, allocator rounding) fits ``gpu_memory``, with its
    Timeline and DeviceMemory. Raises BudgetError saying what does not fit."""
    from .memory.device_plan import plan_for_device

    if budget is not None:
        raise BudgetError("give either an activation budget or the GPU's memory, not both")
    hw = get_hardware(hardware)
    return plan_for_device(_workload(workload, hw), hw, gpu_memory_bytes_for(gpu_memory), policy,
                           _device_options(device))


def device_memory(
    workload: Workload | str,
    hardware: Hardware | str = DEFAULT_HARDWARE,
    plan: Plan | None = None,
    **device: Any,
):
    """The step's whole device memory under ``plan`` (everything kept if None), a
    ``slackswap.memory.DeviceMemory``: model states, activation peak, allocated and reserved peaks."""
    from .memory.step import device_memory as replay_step
    from .schedule import make_plan

    hw = get_hardware(hardware)
    w = _workload(workload, hw)
    options = _device_options(device)
    if plan is None:
        plan = make_plan(w, {}, policy="ideal", budget_bytes=None)
    return replay_step(w, hw, plan, states=options.states(w), expandable_segments=options.expandable_segments)[1]


def fit(
    model: str,
    hardware: Hardware | str = DEFAULT_HARDWARE,
    gpu_memory: int | str = "80GiB",
    *,
    micro_batches: Any = None,
    seq_lens: Any = None,
    policies: Any = None,
    progress: Any = None,
    layout: dict[str, Any] | None = None,
    pipeline_micro_batches: int | None = None,
    **device: Any,
):
    """Which micro-batch sizes and sequence lengths of built-in ``model`` fit ``gpu_memory`` under
    each policy, and at what simulated throughput (a ``slackswap.experiments.fit.FitResult``).
    ``layout`` overrides model spec fields, such as ``{"tensor_parallel": 8, "pipeline_parallel": 2}``
    (the table is then one rank's); ``pipeline_micro_batches`` is m for the 1F1B bubble (default 4p)."""
    from .experiments.fit import DEFAULT_MICRO_BATCHES, DEFAULT_POLICIES, fit as fit_table

    return fit_table(model, get_hardware(hardware), gpu_memory_bytes_for(gpu_memory),
                     micro_batches=micro_batches or DEFAULT_MICRO_BATCHES, seq_lens=seq_lens,
                     policies=policies or DEFAULT_POLICIES, options=_device_options(device), progress=progress,
                     pipeline_micro_batches=pipeline_micro_batches, **(layout or {}))


def compile(model: Any, batch: Any = None, loss_fn: Any = None, *, hardware: Hardware | str = DEFAULT_HARDWARE,
            budget: float | int | str = 0.5, policy: str = "slackswap", plan: Plan | list[Plan] | None = None,
            backend: str = "inductor", saved_set: str = "autograd", objective: str = "time", **compile_kwargs: Any):
    """``torch.compile(model)`` with each compiled graph planned and the plan carried out by the
    partitioner (needs the torch extra). Use the result in place of ``torch.compile(model)``.

    Each graph's forward nodes form its workload (times from the roofline on ``hardware``); the plan
    (``policy`` within ``budget``, or ``plan=`` made for those workloads) becomes recompute tags and
    offload marks. ``saved_set``: the tensors a plan chooses among, "autograd" (what the derivative
    formulas read) or "min-cut" (what PyTorch's min-cut partitioner saves with no matmul re-run; a
    plan then keeps, say, a matmul output and re-runs the pointwise ops after it in backward).
    ``objective``: "time" plans with ``policy`` (the fastest plan in the simulator within a peak
    budget); "flops" is PyTorch's ``activation_memory_budget`` objective: the recompute-only plan that
    re-runs the fewest FLOPs (FlopCounterMode's count) while what each graph holds when its forward pass
    ends is within ``budget`` (a fraction of what it holds with everything kept, or bytes), found
    exactly (compiled/fewest_flops.py), each re-run node run once; with saved_set="min-cut" and a
    fraction, what PyTorch's own plan at that budget saves is among the candidates; "mixed" holds the
    same bound with swaps allowed (a swapped tensor is not held at the boundary): the fastest plan the
    simulator finds from the fewest-FLOPs plan and PyTorch's (compiled/mixed_held.py). With
    ``batch`` and ``loss_fn`` one step is compiled now and its effects undone (gradients, buffers,
    RNG). ``compiled.slackswap`` lists each graph's workload and plan (docs/runtime.md, The compiled path)."""
    from .errors import require

    require("torch", "torch", "compiling a PyTorch model under a plan")
    from .compiled.compile import compile_with_plan

    return compile_with_plan(model, batch, loss_fn, hardware=hardware, budget=budget, policy=policy, plan=plan,
                             backend=backend, saved_set=saved_set, objective=objective, plan_fn=_plan_fn,
                             **compile_kwargs)
