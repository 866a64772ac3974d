"""Re-simulate the steps behind a reproduce result, for the report's traces and step figures.

run_reproduce returns numbers only; the report also shows what one step of each model
looked like. Each row carries its model configuration, budget and hardware, so the plan
can be made again exactly: the same inputs give the same plan and Timeline.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from ..errors import BudgetError
from ..hardware import Hardware, get_hardware
from ..plans import Plan
from ..timeline import Timeline
from ..workload import Workload


def reproduce_steps(
    result: Mapping[str, Any],
    *,
    policy: str = "slackswap",
    progress: Callable[[str], None] | None = None,
) -> tuple[dict[str, Timeline], dict[str, Workload], dict[str, Plan]]:
    """(timelines, workloads, plans) keyed '<model> <policy>', for the rows where ``policy`` fits."""
    from ..planners import plan_workload
    from ..sim import simulate
    from ..workloads.models import build_model_workload

    hardware = _hardware(result)
    timelines: dict[str, Timeline] = {}
    workloads: dict[str, Workload] = {}
    plans: dict[str, Plan] = {}
    for row in result.get("rows", ()):
        if not row.get("policies", {}).get(policy, {}).get("fits", True):
            continue
        hw = hardware or get_hardware(row["hardware"])
        if progress:
            progress(f"{row['model']}: simulating one step under {policy}")
        overrides = {k: v for k, v in row.get("config", {}).items() if k != "name"}
        workload = build_model_workload(row["model"], hw, **overrides)
        try:
            plan = plan_workload(workload, hw, row["budget_bytes"], policy)
        except BudgetError:
            continue
        label = f"{row['model']} {policy}"
        timelines[label] = simulate(workload, hw, plan, row["budget_bytes"], check=False)
        workloads[label], plans[label] = workload, plan
    return timelines, workloads, plans


def _hardware(result: Mapping[str, Any]) -> Hardware | None:
    raw = result.get("parametrization", {}).get("hardware")
    return Hardware.from_dict(raw) if isinstance(raw, Mapping) else None
