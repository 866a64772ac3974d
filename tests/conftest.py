"""Shared test fixtures.

``summary_lines`` lets a test report a figure (for example how many random cases a
property test generated) in pytest's terminal summary, whether or not output capture
is on.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def summary_lines(pytestconfig) -> list[str]:
    lines = getattr(pytestconfig, "_slackswap_summary", None)
    if lines is None:
        lines = []
        pytestconfig._slackswap_summary = lines
    return lines


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    lines = getattr(config, "_slackswap_summary", None)
    if lines:
        terminalreporter.section("slackswap test figures")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def generated_cases(summary_lines):
    """Counter of generated cases (fuzz inputs, random workloads) by label.

    Tests add to it (``generated_cases["loader workload: mutated"] += 1``); the totals are
    printed in the terminal summary, as issue 6 asks, when the session ends.
    """
    from collections import Counter

    counts: Counter = Counter()
    yield counts
    if counts:
        summary_lines.append(f"generated cases: {sum(counts.values())} in total")
        for label in sorted(counts):
            summary_lines.append(f"  {counts[label]:>6}  {label}")
