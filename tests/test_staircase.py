"""The knapsack's staircase (planners/staircase.py) against the per-unit table it replaced: the
same values at every unit after every bundle, and the same "taken" test, on random bundles
(zero weights and costs, bundles wider than the table, equal costs included)."""

from __future__ import annotations

import math
import random

from slackswap.planners.staircase import add_to_table, lower_envelope, shifted, to_table, value_at


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


def test_held_from_and_the_ceiling_change_only_what_the_knapsack_does_not_read():
    from slackswap.planners.staircase import held_from

    rng = random.Random(11)
    for _ in range(500):
        cap = rng.randint(1, 60)
        stairs = ([0, 1], [0.0, math.inf])
        for _ in range(rng.randint(1, 6)):
            stairs = lower_envelope(stairs, shifted(stairs, rng.randint(0, cap), rng.random(), cap))
        low = rng.randint(0, cap)
        held = held_from(stairs, low)
        assert [value_at(held, b) for b in range(low, cap + 1)] == [value_at(stairs, b) for b in range(low, cap + 1)]
        assert all(value_at(held, b) == value_at(stairs, low) for b in range(low))
        assert len(held[0]) <= len(stairs[0])
        w, c, ceiling = rng.randint(0, cap + 2), rng.random(), rng.uniform(0, 4)
        plain, capped = shifted(stairs, w, c, cap), shifted(stairs, w, c, cap, ceiling)
        for b in range(cap + 1):
            want = value_at(plain, b)
            assert value_at(capped, b) == (want if want <= ceiling else math.inf)


def _knapsack_in_every_mode(monkeypatch, facts, names, need: int) -> list:
    """knapsack_min_time_of's answers with runs then the table (the default), runs only and the
    table from the first bundle, then the plain per-unit table: no ceiling, every unit updated."""
    from slackswap.planners import selection, staircase

    answers = []
    for fraction in (selection._DENSE_RUNS_FRACTION, 1, 10**9):
        with monkeypatch.context() as patched:
            patched.setattr(selection, "_DENSE_RUNS_FRACTION", fraction)
            answers.append(selection.knapsack_min_time_of(facts, names, need))
    with monkeypatch.context() as patched:
        patched.setattr(selection, "_DENSE_RUNS_FRACTION", 10**9)
        patched.setattr(selection, "_ceiling", lambda bundles, cap: math.inf)
        patched.setattr(selection, "add_to_table", lambda table, w, c, *limits: staircase.add_to_table(table, w, c))
        answers.append(selection.knapsack_min_time_of(facts, names, need))
    return answers


def test_knapsack_answers_on_the_profiled_workloads_are_the_plain_tables(monkeypatch):
    """The knapsack holds values over an upper bound of the answer as infinity and leaves alone
    what its walk back cannot read: the plain per-unit table (which does neither) gives the same
    sets, on random subsets and needs, whichever way it runs."""
    from pathlib import Path

    from slackswap.planners.common import facts_for
    from slackswap.workload import Workload

    rng = random.Random(3)
    found = 0
    for path in sorted((Path(__file__).parent / "profiled").glob("*.json")):
        facts = facts_for(Workload.load(path))
        total = sum(facts.size[n] for n in facts.candidates)
        for _ in range(4):
            names = [n for n in facts.candidates if rng.random() < 0.8]
            answers = _knapsack_in_every_mode(monkeypatch, facts, names, int(total * rng.uniform(0.05, 0.9)))
            assert all(a == answers[-1] for a in answers)
            found += answers[-1] is not None
    assert found >= 20  # of 28: the rest ask for more than the subset holds


def test_knapsack_answers_near_every_candidate_are_the_plain_tables(monkeypatch):
    """Needs close to every candidate's bytes, on random chains with few distinct sizes and
    times (ties): there the walk back reads high up (the later bundles leave little room), and
    the plain per-unit table still gives the same sets."""
    from slackswap.planners.common import facts_for
    from slackswap.workloads.synthetic import chain

    rng = random.Random(8)
    for case in range(60):
        n = rng.randint(3, 30)
        w = chain(n, fwd_time_s=[rng.choice([0.5, 1.0, 1.5, rng.random()]) for _ in range(n)],
                  size_bytes=[rng.choice([100, 250, 1000, rng.randint(1, 5000)]) for _ in range(n)],
                  name=f"chain{case}")
        facts = facts_for(w)
        total = sum(facts.size[t] for t in facts.candidates)
        answers = _knapsack_in_every_mode(monkeypatch, facts, list(facts.candidates),
                                          int(total * rng.uniform(0.85, 1.0)))
        assert all(a == answers[-1] for a in answers)


def test_a_table_bundle_from_a_low_unit_and_to_a_ceiling_is_the_whole_bundle_there():
    rng = random.Random(12)
    for _ in range(3000):
        cap = rng.randint(1, 50)
        table = [0.0] + sorted(rng.choice([rng.random() * 5, math.inf]) for _ in range(cap))
        w, c, low = rng.randint(0, cap + 3), rng.choice([0.0, 1.0, rng.random()]), rng.randint(0, cap + 1)
        ceiling = rng.choice([math.inf, rng.uniform(0, 6)])
        whole, part = list(table), list(table)
        add_to_table(whole, w, c)
        add_to_table(part, w, c, low, ceiling)
        assert part[:low] == table[:low]
        for b in range(low, cap + 1):
            assert part[b] == whole[b] if whole[b] <= ceiling else part[b] > ceiling
