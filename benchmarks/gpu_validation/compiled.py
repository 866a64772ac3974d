"""The compiled path (slackswap.compile, issue 13) as a Method, where this slackswap has it.

The compiled path plans the graphs torch.compile makes (their workloads come from the joint graph,
times from the roofline on the hardware), not the eager profile: its rows are predicted from
those graphs' own workloads and plans."""

from __future__ import annotations

import slackswap

from .prediction import predict
from .training import Method


class Unavailable(Exception):
    """The compiled path cannot run here; the message says why (it becomes the row's note)."""


def has_compiled_path() -> bool:
    return hasattr(slackswap, "compile")


def compiled_method(name: str, model, batch, loss_fn, *, hardware, budget: float, policy: str, backend: str,
                    parameter_count: int) -> tuple[Method, dict]:
    """(the Method, the prediction for its graph). Compiles, and so plans, before returning."""
    if not has_compiled_path():
        raise Unavailable("slackswap.compile is not in this slackswap (issue 13)")
    import torch

    # Each configuration compiles the same forward again: without a reset, dynamo's recompile limit
    # would make later configurations run eagerly.
    torch._dynamo.reset()
    compiled = slackswap.compile(model, batch, loss_fn, hardware=hardware, budget=budget, policy=policy,
                                 backend=backend)
    graphs = compiled.slackswap.graphs
    if len(graphs) != 1:
        raise Unavailable(f"the model compiled into {len(graphs)} graphs; the prediction covers one graph")
    graph = graphs[0]
    predicted = predict(graph.workload, hardware, graph.plan, parameter_count)
    predicted["graph_ops"] = len(graph.workload.ops)
    return Method(name, lambda: loss_fn(compiled, batch)), predicted
