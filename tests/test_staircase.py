"""The knapsack's staircase (planners/staircase.py) against the per-unit table it replaced: the
same values at every unit after every bundle, and the same "taken" test, on random bundles
(zero weights and costs, bundles wider than the table, equal costs included)."""

from __future__ import annotations

import math
import random

from slackswap.planners.staircase import lower_envelope, shifted, to_table, value_at


def _table_step(best: list[float], w: int, c: float) -> bytearray:
    """One bundle added to the per-unit table (0-1: every read sees the table before it)."""
    cap = len(best) - 1
    old = list(best)
    taken = bytearray(cap + 1)
    for b in range(1, cap + 1):
        candidate = old[max(0, b - w)] + c
        if candidate < old[b]:
            best[b] = candidate
            taken[b] = 1
    return taken


def test_staircase_matches_the_per_unit_table():
    rng = random.Random(5)
    for _ in range(1500):
        cap = rng.randint(1, 50)
        best = [0.0] + [math.inf] * cap
        stairs = ([0, 1], [0.0, math.inf])
        for _ in range(rng.randint(1, 8)):
            w = rng.randint(0, cap + 3)
            c = rng.choice([0.0, 0.25, 1.0, rng.random()])
            taken = _table_step(best, w, c)
            before = stairs
            stairs = lower_envelope(stairs, shifted(stairs, w, c, cap))
            assert [value_at(stairs, b) for b in range(cap + 1)] == best
            assert bytearray(int(b > 0 and value_at(before, max(0, b - w)) + c < value_at(before, b))
                             for b in range(cap + 1)) == taken
            assert to_table(stairs, cap) == best


def test_knapsack_same_answer_with_runs_or_per_unit_table(monkeypatch):
    """knapsack_min_time switches from the runs to the per-unit table when the runs fill up; the
    answer must not depend on where it switches (all runs, all table, the default)."""
    from slackswap.hardware import PRESETS
    from slackswap.planners import selection
    from slackswap.planners.common import facts_for
    from slackswap.workloads.models import build_model_workload

    facts = facts_for(build_model_workload("gpt2-xl", PRESETS["a100-80gb-pcie4"], layers=12))
    total = sum(facts.size[n] for n in facts.candidates)
    rng = random.Random(2)
    cases = [([n for n in facts.candidates if rng.random() < 0.7], int(total * rng.uniform(0.02, 0.5)))
             for _ in range(6)]
    answers = []
    for fraction in (selection._DENSE_RUNS_FRACTION, 10**9, 1):  # default, table at once, runs only
        monkeypatch.setattr(selection, "_DENSE_RUNS_FRACTION", fraction)
        answers.append([selection.knapsack_min_time(facts, names, need) for names, need in cases])
    assert answers[0] == answers[1] == answers[2]
    assert all(a for a in answers[0])
