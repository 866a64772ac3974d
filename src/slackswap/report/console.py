"""Terminal output: tables and progress bars.

rich (the optional ``rich`` extra) draws them when it is installed and the stream is a
terminal; otherwise tables are plain aligned text, so pipes, files and CI logs get
something ``grep`` and ``column`` can read, and progress is silent.
"""

from __future__ import annotations

import importlib
import re
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Sequence, TextIO, TypeVar

T = TypeVar("T")
# A cell is right-aligned when it reads as a number, with or without a unit ('12.5 ms', '96.3%').
_NUMERIC = re.compile(r"^[-+]?(\d[\d,]*\.?\d*|\.\d+)([eE][-+]?\d+)?\s*[%a-zA-Z/]*$")


def _rich():
    """The rich package, or None when it is not installed (tables then fall back to plain text)."""
    try:
        return importlib.import_module("rich")
    except ImportError:
        return None


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (ValueError, OSError):  # a closed stream
        return False


def cell_text(value: Any) -> str:
    return "-" if value is None else str(value)


def is_numeric(text: str) -> bool:
    return bool(_NUMERIC.match(text.strip()))


def render_table(
    headers: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    title: str | None = None,
    stream: TextIO | None = None,
) -> None:
    """Print a table. Cells are printed with ``str`` (None as '-'); format numbers with their
    units first (slackswap.units.format_bytes, format_seconds)."""
    stream = sys.stdout if stream is None else stream
    table = [[cell_text(v) for v in row] for row in rows]
    for i, row in enumerate(table):
        if len(row) != len(headers):
            raise ValueError(f"table row {i} has {len(row)} cells for {len(headers)} headers")
    right = [bool(col) and all(is_numeric(c) or c == "-" for c in col) for col in zip(*table)] or [False] * len(headers)
    rich = _rich() if _is_terminal(stream) else None
    if rich is not None:
        _render_rich(headers, table, right, title, stream)
    else:
        stream.write(plain_table(headers, table, right, title))


def plain_table(headers: Sequence[str], table: Sequence[Sequence[str]], right: Sequence[bool], title: str | None) -> str:
    widths = [max([len(h)] + [len(row[i]) for row in table]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        parts = [c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)]
        return "  ".join(parts).rstrip()

    out = [title] if title else []
    out.append(line(headers))
    out.append("  ".join("-" * w for w in widths))
    out.extend(line(row) for row in table)
    return "\n".join(out) + "\n"


def _render_rich(headers, table, right, title, stream) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title, title_justify="left", header_style="bold")
    for header, is_right in zip(headers, right):
        t.add_column(header, justify="right" if is_right else "left")
    for row in table:
        t.add_row(*row)
    Console(file=stream, highlight=False).print(t)


def progress(
    iterable: Iterable[T],
    total: int | None = None,
    description: str = "",
    *,
    quiet: bool = False,
    stream: TextIO | None = None,
) -> Iterator[T]:
    """Yield from ``iterable`` while showing a progress bar on ``stream`` (stderr by default).

    Silent when ``quiet`` or when the stream is not a terminal, so scripted runs and
    ``--json`` output stay clean. Uses rich when installed, else a one-line text bar.
    """
    stream = sys.stderr if stream is None else stream
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    if quiet or not _is_terminal(stream):
        yield from iterable
        return
    if _rich() is not None:
        yield from _rich_progress(iterable, total, description, stream)
    else:
        yield from _text_progress(iterable, total, description, stream)


def _rich_progress(iterable, total, description, stream):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(file=stream), transient=True) as bar:
        task = bar.add_task(description or "working", total=total)
        for item in iterable:
            yield item
            bar.advance(task)


def text_bar(done: int, total: int | None, description: str, width: int = 30) -> str:
    """'description [#######.......] 7/20' (no bar when the total is unknown)."""
    label = f"{description} " if description else ""
    if not total:
        return f"{label}{done}"
    filled = min(width, round(width * done / total))
    return f"{label}[{'#' * filled}{'.' * (width - filled)}] {done}/{total}"


def _text_progress(iterable, total, description, stream):
    done = 0
    stream.write("\r" + text_bar(done, total, description))
    stream.flush()
    try:
        for item in iterable:
            yield item
            done += 1
            stream.write("\r" + text_bar(done, total, description))
            stream.flush()
    except BaseException:  # the loop stopped early (an error, or a break): erase the bar
        stream.write("\r" + " " * len(text_bar(done, total, description)) + "\r")
        stream.flush()
        raise
    stream.write("\n")
    stream.flush()


@contextmanager
def progress_reporter(
    description: str = "", *, quiet: bool = False, stream: TextIO | None = None
) -> Iterator[Callable[[int, int, str], None]]:
    """A ``report(done, total, label)`` callback for long loops that count their own work
    (such as slackswap.experiments.sweep.run_sweep's ``progress``), drawn like ``progress``."""
    stream = sys.stderr if stream is None else stream
    if quiet or not _is_terminal(stream):
        yield lambda done, total, label="": None
        return
    if _rich() is not None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=Console(file=stream), transient=True) as bar:
            task = bar.add_task(description or "working", total=None)

            def report_rich(done: int, total: int, label: str = "") -> None:
                text = f"{description}: {label}" if description and label else (label or description)
                bar.update(task, completed=done, total=total, description=text)

            yield report_rich
        return
    width = [0]

    def report_text(done: int, total: int, label: str = "") -> None:
        line = text_bar(done, total, f"{description} {label}".strip())
        stream.write("\r" + line.ljust(width[0]))  # pad over a longer previous line
        stream.flush()
        width[0] = max(width[0], len(line))

    try:
        yield report_text
    except BaseException:
        if width[0]:  # erased, so that the error printed next is the only line
            stream.write("\r" + " " * width[0] + "\r")
            stream.flush()
        raise
    if width[0]:
        stream.write("\n")
        stream.flush()
