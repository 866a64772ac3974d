"""The ``slackswap`` command line.

Each ``*_cmd.py`` module in this package is one subcommand: it defines
``register(subparsers)``, which adds its parser and sets ``func`` to a function
taking the parsed arguments and returning an exit code. A new command is one file.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from .._outputs import outputs_together
from ..errors import SlackswapError

EXIT_BAD_INPUT = 2


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line naming the fix, like every other bad input."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_BAD_INPUT, f"slackswap: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="slackswap", description="Plan, simulate and run keep / swap / recompute of saved activations.")
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"slackswap {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    subparsers.required = True
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.endswith("_cmd"):
            importlib.import_module(f"{__name__}.{info.name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):
        # A file name that is not valid in the terminal's encoding (bytes from a non-UTF-8 file
        # system) is printed escaped rather than failing after the files are written.
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with outputs_together():  # every file of the command, or none
            return int(args.func(args) or 0)
    except SlackswapError as exc:
        print(f"slackswap: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("slackswap: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
