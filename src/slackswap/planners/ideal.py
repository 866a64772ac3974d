"""`ideal`: keep every saved tensor and ignore the budget: the reference step time and peak."""

from __future__ import annotations

from ..hardware import Hardware
from ..plans import Plan
from ..schedule import make_plan
from ..workload import Workload


def plan_ideal(workload: Workload, hardware: Hardware, budget_bytes: int) -> Plan:
    return make_plan(workload, {}, policy="ideal", budget_bytes=None, info={"rule": "keep everything"})
