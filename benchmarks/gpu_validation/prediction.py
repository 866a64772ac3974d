"""What slackswap predicts for a plan: the simulated step and, where this slackswap models the whole
device memory (slackswap.memory.step: model states, transients, the caching allocator), the
allocated and reserved peaks of the step as gpu_validate runs it (bf16 parameters and gradients,
no optimizer state: its steps stop before the optimizer)."""

from __future__ import annotations

import slackswap
from slackswap import make_plan


def ideal_plan(workload):
    """Everything kept, no budget: plain training's plan."""
    return make_plan(workload, {}, policy="ideal", budget_bytes=None)


def _device_memory(workload, hardware, plan, parameter_count: int):
    """(timeline, DeviceMemory, note): the memory is None, with the reason in the note, where this
    slackswap has no whole-step memory model or it fails on this workload."""
    try:
        from slackswap.memory import model_states
        from slackswap.memory.step import device_memory
    except ImportError:
        return None, None, "this slackswap does not predict allocated and reserved memory"
    try:
        states = model_states(parameter_count, optimizer="sgd", precision="bf16")
        timeline, memory = device_memory(workload, hardware, plan, states=states)
    except Exception as exc:  # a failing memory model must not cost the step's other figures
        return None, None, f"allocated/reserved prediction failed: {type(exc).__name__}: {exc}"
    return timeline, memory, ""


def predict(workload, hardware, plan, parameter_count: int) -> dict:
    timeline, memory, note = _device_memory(workload, hardware, plan, parameter_count)
    if timeline is None:
        timeline = slackswap.simulate(workload, hardware, plan)
    return {"step_time_s": timeline.step_time_s, "activation_peak_bytes": timeline.peak_memory_bytes,
            "model_state_bytes": memory.model_state_bytes if memory else None,
            "allocated_peak_bytes": memory.allocated_peak_bytes if memory else None,
            "reserved_peak_bytes": memory.reserved_peak_bytes if memory else None,
            "memory_note": note,
            "d2h_bytes": timeline.d2h_bytes, "h2d_bytes": timeline.h2d_bytes,
            "recompute_time_s": timeline.recompute_time_s, "stall_time_s": timeline.stall_time_s}
