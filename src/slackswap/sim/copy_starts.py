"""When each copy back starts in the simulation, as a backward step: the runtime issues it then.

A copy back is issued at its ``prefetch_step`` but waits on the in-order copy stream (and
for memory), and the simulator counts its bytes from its start. The runtime allocates a
copy's destination when it issues it, so it issues each copy at the step the simulated copy
starts to hold what the simulation holds (docs/runtime.md).
"""

from __future__ import annotations

import bisect

from ..hardware import Hardware
from ..plans import Plan
from ..schedule import rescheduled
from ..workload import Workload
from .simulator import simulate


def copy_in_start_steps(workload: Workload, hardware: Hardware, plan: Plan) -> dict[str, int]:
    """For each swapped tensor, the backward step at whose trigger its simulated copy back starts."""
    if not plan.prefetch_step:
        return {}
    timeline = simulate(workload, hardware, plan, check=False)
    n = len(workload.ops)
    last_end = [0.0] * (n + 1)  # last_end[k + 1]: when the last task of backward step k ends
    for e in timeline.events:
        if e.stream == "compute" and e.kind in ("forward", "recompute", "backward"):
            last_end[e.step + 1] = max(last_end[e.step + 1], e.end_s)
    # Step k is triggered when the last task before it ends (docs/simulator.md).
    triggers = [max(last_end[: k + 1]) for k in range(n)]
    return {e.name: max(plan.prefetch_step[e.name], bisect.bisect_right(triggers, e.start_s) - 1)
            for e in timeline.events if e.kind == "copy_in"}


def with_copy_in_start_steps(workload: Workload, hardware: Hardware, plan: Plan) -> Plan:
    """``plan`` whose schedule carries the step at which the simulation starts each copy back."""
    starts = copy_in_start_steps(workload, hardware, plan)
    return rescheduled(workload, plan, start_step=starts) if starts else plan
