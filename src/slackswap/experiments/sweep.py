"""Throughput against budget for each policy: one row per (budget, policy).

Budgets are fractions of the unconstrained activation peak (the simulated peak of the
ideal plan). A policy that cannot reach a budget gives a row with ``fits`` false and
empty figures, with the reason in ``note``.
"""

from __future__ import annotations

import csv
import io
import time
from typing import Callable, Iterable, Sequence

from .._fields import write_text_atomic
from ..errors import BudgetError, ValidationError
from ..hardware import Hardware
from ..memory.device_plan import DeviceOptions
from ..memory.step import device_memory
from ..planners import PLANNERS, get_planner, minimum_budget_bytes, plan_workload
from ..sim import simulate, simulate_ideal
from ..workload import Workload

COLUMNS = (
    "workload", "hardware", "budget_fraction", "budget_bytes", "policy", "fits", "throughput_pct", "step_time_s",
    "peak_memory_bytes", "recompute_time_s", "stall_time_s", "d2h_bytes", "h2d_bytes", "plan_time_s", "note",
)

DEVICE_COLUMNS = ("model_state_bytes", "allocated_peak_bytes", "reserved_peak_bytes", "fits_gpu_memory")
"""Added when the sweep is given the GPU's memory (docs/memory.md)."""

Progress = Callable[[int, int, str], None]
"""Called as progress(done, total, label) after each (budget, policy) pair."""


MAX_BUDGETS = 1000  # a sweep point costs up to a second per policy; more is a typo, not a study


def parse_budgets(text: str) -> list[float]:
    """'0.2:1.0:0.05' (start:stop:step, stop included) or '0.3,0.5,0.7' into fractions."""
    text = text.strip()
    try:
        if ":" in text:
            start, stop, step = (float(x) for x in text.split(":"))
            if step <= 0 or start <= 0 or stop > 1 or start > stop:
                raise ValueError
            count = int(round((stop - start) / step)) + 1
            if count > MAX_BUDGETS:
                raise ValidationError(
                    f"budgets {text!r} ask for {count} budgets; at most {MAX_BUDGETS}: use a larger step"
                )
            values = [round(start + i * step, 10) for i in range(count)]
            values = [v for v in values if v <= stop + 1e-9]
        else:
            values = [float(x) for x in text.split(",") if x.strip()]
            if len(values) > MAX_BUDGETS:
                raise ValidationError(f"budgets {text!r} list {len(values)} budgets; at most {MAX_BUDGETS}")
    except ValidationError:
        raise
    except (ValueError, OverflowError):
        raise ValidationError(
            f"cannot read budgets {text!r}: write start:stop:step such as 0.2:1.0:0.05, or a list such as 0.3,0.5"
        ) from None
    if not values or any(not 0 < v <= 1 for v in values):
        raise ValidationError(f"budgets {text!r} must be fractions above 0 and at most 1")
    return values


def parse_policies(text: str | None) -> list[str]:
    if not text:
        return list(PLANNERS)
    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names:
        raise ValidationError(f"--policies {text!r} names no policy: list some, e.g. slackswap,capuchin")
    for name in names:
        get_planner(name)
    return names


def run_sweep(workload: Workload, hardware: Hardware, budgets: Sequence[float], policies: Iterable[str],
              progress: Progress | None = None, *, gpu_memory_bytes: int | None = None,
              options: DeviceOptions | None = None) -> list[dict]:
    """Plan and simulate every policy at every budget fraction; rows in budget, then policy order.
    With ``gpu_memory_bytes``, each row also has the DEVICE_COLUMNS: the whole step replayed
    through the allocator model under ``options``, and whether its reserved peak fits."""
    policies = list(policies)
    for name in policies:
        get_planner(name)
    ideal = simulate_ideal(workload, hardware)
    peak = ideal.peak_memory_bytes
    minimum = minimum_budget_bytes(workload)
    rows: list[dict] = []
    total = len(budgets) * len(policies)
    for fraction in budgets:
        budget = max(1, int(fraction * peak))
        for policy in policies:
            row = _row(workload, hardware, fraction, budget, policy, minimum,
                       None if gpu_memory_bytes is None else (options or DeviceOptions()))
            if gpu_memory_bytes is not None:
                reserved = row["reserved_peak_bytes"]
                row["fits_gpu_memory"] = None if reserved is None else reserved <= gpu_memory_bytes
            rows.append(row)
            if progress is not None:
                progress(len(rows), total, f"{policy} at {fraction:.2f}")
    return rows


def _row(workload: Workload, hardware: Hardware, fraction: float, budget: int, policy: str, minimum: int,
         options: DeviceOptions | None = None) -> dict:
    row = {"workload": workload.name, "hardware": hardware.name, "budget_fraction": fraction,
           "budget_bytes": budget, "policy": policy, "fits": False, "throughput_pct": None, "step_time_s": None,
           "peak_memory_bytes": None, "recompute_time_s": None, "stall_time_s": None, "d2h_bytes": None,
           "h2d_bytes": None, "plan_time_s": None, "note": ""}
    if options is not None:
        row.update(dict.fromkeys(DEVICE_COLUMNS))
    if budget < minimum and policy != "ideal":
        row["note"] = f"below the minimum budget of {minimum} bytes"
        return row
    started = time.perf_counter()
    try:
        plan = plan_workload(workload, hardware, budget, policy)
    except BudgetError as exc:
        row["note"] = str(exc)
        return row
    row["plan_time_s"] = time.perf_counter() - started
    if options is None:
        timeline = simulate(workload, hardware, plan, plan.budget_bytes, check=False)
    else:
        states = options.states(workload)
        timeline, memory = device_memory(workload, hardware, plan, states=states, budget_bytes=plan.budget_bytes,
                                         expandable_segments=options.expandable_segments)
        row.update(model_state_bytes=memory.model_state_bytes, allocated_peak_bytes=memory.allocated_peak_bytes,
                   reserved_peak_bytes=memory.reserved_peak_bytes)
    row.update(fits=True, throughput_pct=timeline.throughput_pct, step_time_s=timeline.step_time_s,
               peak_memory_bytes=timeline.peak_memory_bytes, recompute_time_s=timeline.recompute_time_s,
               stall_time_s=timeline.stall_time_s, d2h_bytes=timeline.d2h_bytes, h2d_bytes=timeline.h2d_bytes)
    return row


def rows_to_csv(rows: Sequence[dict]) -> str:
    buffer = io.StringIO()
    columns = COLUMNS + (DEVICE_COLUMNS if rows and DEVICE_COLUMNS[0] in rows[0] else ())
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in columns})
    return buffer.getvalue()


def write_csv(path, rows: Sequence[dict]) -> None:
    write_text_atomic(path, rows_to_csv(rows))
