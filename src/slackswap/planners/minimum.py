"""The smallest activation budget any plan can run in, and the error for budgets below it.

Definition (docs/planners.md, "Minimum budget"): whatever a plan does, the simulator
holds

- every saved step input for the whole step;
- every saved tensor from the start of its producer to the end of its last forward
  reader (an op cannot run without its inputs and outputs);
- every saved tensor from the start of its first backward reader to the end of its last.

The minimum budget is the largest sum of these at any op, forward or backward. The
plan that swaps every tensor and copies each back just in time
(``lowest_memory_plan``) reaches it exactly: it waits for copies as long as it must,
but never holds anything else. So the bound is tight, and it is the simulated peak of
that plan run under it (the tests check both).
"""

from __future__ import annotations

from ..errors import BudgetError
from ..hardware import Hardware
from ..plans import Action, Plan
from ..schedule import make_plan
from ..units import format_bytes
from ..workload import Workload
from .common import facts_for, just_in_time_prefetch


def minimum_budget_bytes(workload: Workload, hardware: Hardware | None = None) -> int:
    """Lowest activation budget any plan can fit, in bytes (``hardware`` does not change it)."""
    w = workload
    n = len(w.ops)
    delta_fwd = [0] * (n + 1)
    delta_bwd = [0] * (n + 1)
    for t in w.saved_tensors:
        if t.producer is None:
            continue
        start = w.op_index[t.producer]
        delta_fwd[start] += t.size_bytes
        delta_fwd[w.last_fwd_use[t.name] + 1] -= t.size_bytes
        readers = [w.op_index[r] for r in t.bwd_readers]
        delta_bwd[min(readers)] += t.size_bytes
        delta_bwd[max(readers) + 1] -= t.size_bytes
    live_fwd = live_bwd = best = 0
    for i in range(n):
        live_fwd += delta_fwd[i]
        live_bwd += delta_bwd[i]
        best = max(best, live_fwd, live_bwd)
    return facts_for(w).input_bytes + best


def lowest_memory_plan(workload: Workload, budget_bytes: int | None = None) -> Plan:
    """Swap every tensor and copy each back at the start of its first backward step."""
    actions = {name: Action.SWAP for name in facts_for(workload).candidates}
    return make_plan(workload, actions, policy="lowest-memory", budget_bytes=budget_bytes,
                     prefetch_step=just_in_time_prefetch(workload, actions))


def check_budget(workload: Workload, budget_bytes: int, unconstrained_peak_bytes: int) -> None:
    """Raise BudgetError when ``budget_bytes`` is below what any plan can reach."""
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes <= 0:
        raise BudgetError(f"budget must be a positive number of bytes, got {budget_bytes!r}")
    minimum = minimum_budget_bytes(workload)
    if budget_bytes < minimum:
        fraction = minimum / unconstrained_peak_bytes if unconstrained_peak_bytes else 1.0
        raise BudgetError(
            f"budget {format_bytes(budget_bytes)} ({budget_bytes} bytes) is below the minimum any plan can reach "
            f"for {workload.name}: {format_bytes(minimum)} ({minimum} bytes, {fraction:.3f} of the unconstrained "
            f"peak of {unconstrained_peak_bytes} bytes); raise the budget to at least that",
            minimum_bytes=minimum,
        )
