"""Shared test fixtures.

``summary_lines`` lets a test report a figure (for example how many random cases a
property test generated) in pytest's terminal summary, whether or not output capture
is on. ``process_group`` is a one-process gloo group for the tests of distributed wrappers.
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


@pytest.fixture(scope="module")
def process_group(tmp_path_factory):
    """A one-process gloo group, initialized through a file (no port to collide on)."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():  # pragma: no cover - torch built without distributed
        pytest.skip("torch.distributed is not available")
    if dist.is_initialized():  # pragma: no cover - another module left one behind
        pytest.skip("a process group is already initialized")
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
