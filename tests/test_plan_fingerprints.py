"""Planning-speed work must not change a plan: a quick subset of the recorded plan fingerprints
(tests/plan_fingerprints.py; the whole grid, every heuristic and `slackswap` on every built-in
and profiled workload at budgets 0.1-0.9, runs with ``--check``).

A change meant to alter plans (a new simulator rule, a planner change) re-records the table with
``python tests/plan_fingerprints.py --write`` and says why in its commit."""

from __future__ import annotations

import json

import pytest

from plan_fingerprints import TABLE, case_key, fingerprint, workloads

# Each case plans in well under a second; together they cover the profiled models (small, the wide
# search on), a built-in model with swaps and recompute, and the heuristic starts of rule 6.
CASES = [("profiled/hf-gpt2", "slackswap", f) for f in (0.2, 0.5, 0.8)] + [
    ("profiled/hf-llama", "slackswap", 0.3), ("profiled/example-gpt2", "slackswap", 0.4),
    ("profiled/example-gpt2", "capuchin", 0.4), ("bert-large", "slackswap", 0.5),
    ("bert-large", "slackswap-paper", 0.3),
]


@pytest.fixture(scope="module")
def recorded() -> dict[str, str]:
    return json.loads(TABLE.read_text())


@pytest.fixture(scope="module")
def by_name():
    return workloads()


@pytest.mark.parametrize("name,policy,fraction", CASES)
def test_plan_is_as_recorded(recorded, by_name, name, policy, fraction):
    key = case_key(name, policy, fraction)
    assert fingerprint(by_name[name], policy, fraction) == recorded[key], (
        f"{key}: the plan changed; if that is meant, re-record with `python tests/plan_fingerprints.py --write`")
