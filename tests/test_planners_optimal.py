"""`optimal` is repeatable bit for bit, also when its branch-and-bound search stops early.

HiGHS stops after ``optimal.NODE_LIMIT`` nodes (not after a time limit, which stops wherever a
loaded machine happens to be): the incumbent, and so the plan, must be the same in two separate
processes. The test lowers the node limit so that it binds on a small instance in well under a
second, and checks that it did bind (``milp_proven_optimal`` false), so the case where a time
limit used to make plans differ is the case exercised.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("scipy")  # the 'milp' extra; the test extra installs it

SCRIPT = textwrap.dedent("""
    import json
    from slackswap.hardware import PRESETS
    from slackswap.planners import minimum_budget_bytes, optimal, plan_workload
    from slackswap.sim import simulate, simulate_ideal
    from slackswap.workloads.models import build_model_workload

    optimal.NODE_LIMIT = 10
    hw = PRESETS["a100-80gb-pcie4"]
    w = build_model_workload("bert-large", hw, layers=4)
    low, peak = minimum_budget_bytes(w), simulate_ideal(w, hw).peak_memory_bytes
    budget = low + int(0.3 * (peak - low))
    plan = plan_workload(w, hw, budget, "optimal")
    data = plan.to_dict(w)
    # Wall-clock solve time is the one field that is not a function of the inputs.
    data["info"].pop("milp_solve_time_s")
    timeline = simulate(w, hw, plan, budget)
    print(json.dumps({"plan": data, "timeline": timeline.to_dict()}, sort_keys=True))
""")


def _run(seed: str) -> dict:
    import json

    env = dict(os.environ, PYTHONHASHSEED=seed)
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def test_optimal_plan_is_identical_across_processes_when_the_node_limit_binds():
    first, second = _run("1"), _run("2")
    info = first["plan"]["info"]
    assert info["milp_proven_optimal"] is False, "the node limit did not bind: the test would not exercise it"
    assert any(row["action"] != "keep" for row in first["plan"]["tensors"])
    assert first == second


def test_optimal_uses_a_node_limit_not_a_time_limit():
    import scipy.optimize

    from slackswap.hardware import PRESETS
    from slackswap.planners import optimal, plan_workload
    from slackswap.workloads.synthetic import chain

    seen = []
    real = scipy.optimize.milp

    def spy(*args, **kwargs):
        seen.append(dict(kwargs.get("options") or {}))
        return real(*args, **kwargs)

    scipy.optimize.milp = spy
    try:
        plan_workload(chain(4), PRESETS["a100-80gb-pcie4"], 250, "optimal")
    finally:
        scipy.optimize.milp = real
    assert seen and all("time_limit" not in o and o["node_limit"] == optimal.NODE_LIMIT for o in seen)
