"""Terminal tables and progress: plain text off a terminal, rich on one (when installed)."""

from __future__ import annotations

import io
import sys

import pytest

from slackswap.report.console import is_numeric, progress, render_table, text_bar


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


HEADERS = ["model", "budget", "throughput", "policy"]
ROWS = [
    ["bert-large", "6.00 GiB", "96.3%", "slackswap"],
    ["llama-7b", "120.50 GiB", "99.6%", None],
]


def test_plain_table_aligns_text_left_and_numbers_right():
    out = io.StringIO()
    render_table(HEADERS, ROWS, title="At 50% of peak", stream=out)
    assert out.getvalue() == (
        "At 50% of peak\n"
        "model           budget  throughput  policy\n"
        "----------  ----------  ----------  ---------\n"
        "bert-large    6.00 GiB       96.3%  slackswap\n"
        "llama-7b    120.50 GiB       99.6%  -\n"
    )


def test_plain_table_is_used_on_a_terminal_without_rich(monkeypatch):
    monkeypatch.setitem(sys.modules, "rich", None)
    out = FakeTerminal()
    render_table(HEADERS, ROWS, stream=out)
    assert out.getvalue().splitlines()[0] == "model           budget  throughput  policy"


def test_rich_table_on_a_terminal():
    pytest.importorskip("rich")
    out = FakeTerminal()
    render_table(HEADERS, ROWS, title="At 50% of peak", stream=out)
    text = out.getvalue()
    assert "At 50% of peak" in text and ("━" in text or "─" in text)  # rich draws box characters
    for cell in ["bert-large", "120.50 GiB", "99.6%", "slackswap", "throughput"]:
        assert cell in text
    assert "-----------" not in text  # not the plain fallback


def test_table_rejects_a_short_row():
    with pytest.raises(ValueError, match="row 1 has 2 cells for 4 headers"):
        render_table(HEADERS, [ROWS[0], ["a", "b"]], stream=io.StringIO())


@pytest.mark.parametrize("text,numeric", [
    ("12", True), ("12.5 ms", True), ("96.3%", True), ("1,024", True), ("3.2 us/MiB", True), ("-0.5 s", True),
    ("1e-3 s", True), ("bert-large", False), ("a100", False), ("", False), ("ms", False),
])
def test_numeric_cells(text, numeric):
    assert is_numeric(text) is numeric


def test_progress_is_silent_off_a_terminal_and_when_quiet():
    for stream, quiet in ((io.StringIO(), False), (FakeTerminal(), True)):
        assert list(progress(range(5), description="sweep", quiet=quiet, stream=stream)) == [0, 1, 2, 3, 4]
        assert stream.getvalue() == ""


def test_text_progress_without_rich(monkeypatch):
    monkeypatch.setitem(sys.modules, "rich", None)
    out = FakeTerminal()
    assert list(progress(iter("abc"), 3, "solving", stream=out)) == ["a", "b", "c"]
    frames = out.getvalue().split("\r")[1:]
    assert frames[0] == "solving [" + "." * 30 + "] 0/3"
    assert frames[-1] == "solving [" + "#" * 30 + "] 3/3\n"
    assert len(frames) == 4


def test_rich_progress_on_a_terminal():
    pytest.importorskip("rich")
    out = FakeTerminal()
    items = list(progress([1, 2, 3], description="sweeping budgets", stream=out))
    assert items == [1, 2, 3]
    assert out.getvalue()  # something was drawn (and cleared: the bar is transient)


def test_text_bar():
    assert text_bar(1, 4, "", width=8) == "[##......] 1/4"
    assert text_bar(7, None, "profiling") == "profiling 7"


def test_progress_reporter_callback(monkeypatch):
    from slackswap.report.console import progress_reporter

    with progress_reporter("sweep", stream=io.StringIO()) as report:  # not a terminal: silent
        report(1, 2, "slackswap at 0.50")
    monkeypatch.setitem(sys.modules, "rich", None)
    out = FakeTerminal()
    with progress_reporter("sweep", stream=out) as report:
        report(1, 2, "slackswap at 0.50")
        report(2, 2, "ideal")
    frames = out.getvalue().split("\r")[1:]
    first = "sweep slackswap at 0.50 [" + "#" * 15 + "." * 15 + "] 1/2"
    assert frames[0] == first
    assert frames[1] == ("sweep ideal [" + "#" * 30 + "] 2/2").ljust(len(first)) + "\n"


def test_progress_reporter_with_rich():
    pytest.importorskip("rich")
    from slackswap.report.console import progress_reporter

    out = FakeTerminal()
    with progress_reporter("sweep", stream=out) as report:
        for done in range(1, 4):
            report(done, 3, f"point {done}")
    assert out.getvalue()
