"""The compiled path (slackswap.compile, issue 13) as a Method, where this slackswap has it."""

from __future__ import annotations

import slackswap

from .training import Method


class Unavailable(Exception):
    """The compiled path cannot run here; the message says why (it becomes the row's note)."""


def has_compiled_path() -> bool:
    return hasattr(slackswap, "compile")


def compiled_method(name: str, model, batch, loss_fn, plan, workload, hardware) -> Method:
    if not has_compiled_path():
        raise Unavailable("slackswap.compile is not in this slackswap (issue 13)")
    compiled = slackswap.compile(model, batch, loss_fn, plan=plan, hardware=hardware)
    return Method(name, lambda: loss_fn(compiled, batch))
