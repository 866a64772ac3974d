"""Fingerprints of the plans every heuristic policy and `slackswap` make, so a change meant only
to make planning faster can be checked to leave every plan as it was.

A case is (workload, policy, budget fraction); its fingerprint is a SHA-256 of the plan's JSON
(actions, prefetch steps, recompute groups, schedule, and the plan's info without wall-clock
fields) and of the simulated step time, peak and traffic under the budget, written exactly
(float.hex). ``python tests/plan_fingerprints.py --write`` records the table in
tests/data/plan-fingerprints.json; ``--check`` compares every case with it (minutes: the
whole grid); tests/test_plan_fingerprints.py compares a quick subset in the suite.

The table holds every case of the grid: it was recorded at commit 3a45c8d on the workloads of
that time, and the profiled fixtures added since were recorded with ``--write --only NAME``
(which merges into the table). Cases were re-recorded where a later planner change meant to
change plans (its commit says which); ``--check`` over the whole grid matched every entry when
the last missing ones were added. Workloads added later need ``--write --only NAME`` too.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from slackswap.errors import BudgetError
from slackswap.hardware import PRESETS
from slackswap.planners import HEURISTICS, plan_workload
from slackswap.sim import simulate, simulate_ideal
from slackswap.workload import Workload
from slackswap.workloads.models import MODELS, build_model_workload

HARDWARE = "a100-80gb-pcie4"
FRACTIONS = tuple(round(0.1 * i, 1) for i in range(1, 10))
POLICIES = tuple(HEURISTICS) + ("slackswap",)
PROFILED = Path(__file__).resolve().parent / "profiled"
TABLE = Path(__file__).resolve().parent / "data" / "plan-fingerprints.json"


def workloads() -> dict[str, Workload]:
    hw = PRESETS[HARDWARE]
    found = {model: build_model_workload(model, hw) for model in MODELS}
    for path in sorted(PROFILED.glob("*.json")):
        found[f"profiled/{path.stem}"] = Workload.load(path)
    return found


def fingerprint(workload: Workload, policy: str, fraction: float) -> str:
    hw = PRESETS[HARDWARE]
    budget = int(fraction * simulate_ideal(workload, hw).peak_memory_bytes)
    try:
        plan = plan_workload(workload, hw, budget, policy)
    except BudgetError as exc:
        return "refused:" + hashlib.sha256(str(exc).encode()).hexdigest()[:16]
    data = plan.to_dict(workload)
    data["info"] = {k: v for k, v in data.get("info", {}).items() if not k.endswith("wall_s")}
    t = simulate(workload, hw, plan, budget)
    data["simulated"] = [x.hex() for x in (t.step_time_s, float(t.peak_memory_bytes), float(t.d2h_bytes),
                                           float(t.h2d_bytes), t.recompute_time_s)]
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def case_key(name: str, policy: str, fraction: float) -> str:
    return f"{name} {policy} {fraction:.1f}"


def compute(names: list[str] | None = None, policies=POLICIES, fractions=FRACTIONS) -> dict[str, str]:
    table = {}
    for name, workload in workloads().items():
        if names is not None and name not in names:
            continue
        for policy in policies:
            for fraction in fractions:
                table[case_key(name, policy, fraction)] = fingerprint(workload, policy, fraction)
                print(case_key(name, policy, fraction), table[case_key(name, policy, fraction)], flush=True)
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="record the table")
    parser.add_argument("--check", action="store_true", help="compare every case with the table")
    parser.add_argument("--only", nargs="*", help="workload names (default: all)")
    parser.add_argument("--policies", nargs="*", default=list(POLICIES))
    args = parser.parse_args()
    table = compute(args.only, tuple(args.policies))
    if args.write:
        old = json.loads(TABLE.read_text()) if TABLE.exists() else {}
        TABLE.write_text(json.dumps({**old, **table}, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(table)} cases to {TABLE}")
    if args.check:
        recorded = json.loads(TABLE.read_text())
        differ = [k for k, v in table.items() if recorded.get(k) != v]
        print(f"{len(table) - len(differ)} of {len(table)} cases as recorded; differ: {differ}")
        return 1 if differ else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
