"""Checks of slackswap.compile against the uncompiled model, shared by the compiled-path tests.

Oracles are independent of the partitioner's own bookkeeping where they can be: gradients against the
eager model, backward FLOPs from FlopCounterMode against the eager backward, saved bytes from
saved-tensor hooks around the compiled call.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode, _FlopCounterMode

import slackswap
from slackswap.compiled import carry_out
from slackswap.errors import RuntimeFallbackWarning

HARDWARE = "a100-80gb-pcie4"


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Autouse in the test modules that import it: each test compiles from a clean dynamo cache."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _decompositions():
    from torch._inductor.compile_fx import select_decomp_table

    return select_decomp_table()


def step_with_partition(model, batch, loss, partition_fn):
    """One training step of ``model`` compiled with ``partition_fn`` on the decomposed joint graph (as
    backend aot_eager_decomp_partition builds it); returns the gradients."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.debugging import boxed_nop

    backend = aot_autograd(fw_compiler=boxed_nop, bw_compiler=boxed_nop, decompositions=_decompositions,
                           partition_fn=partition_fn)
    loss(torch.compile(model, backend=backend), batch).backward()
    return [p.grad.clone() for p in model.parameters()]


def _count_rng_replays() -> None:
    """Let FlopCounterMode run the HOP that replays a recomputed random op (it counts no FLOPs of its own:
    dropout has no FLOP formula; the op inside is counted as usual)."""
    from torch._prims.rng_prims import run_with_rng_state

    if _FlopCounterMode in run_with_rng_state.python_key_table:
        return

    @run_with_rng_state.py_impl(_FlopCounterMode)
    def _replay(mode, rng_state, op, *args, **kwargs):
        current = torch.get_rng_state()
        torch.set_rng_state(rng_state)
        try:
            with mode:
                return op(*args, **kwargs)
        finally:
            torch.set_rng_state(current)


def backward_flops(loss: torch.Tensor) -> int:
    _count_rng_replays()
    with FlopCounterMode(display=False) as counter:
        loss.backward()
    return counter.get_total_flops()


def saved_storages(model: torch.nn.Module, run) -> list[tuple[torch.Tensor, bool]]:
    """Every tensor autograd saves during ``run()``, with whether it shares storage with a parameter or buffer."""
    states = {t.untyped_storage().data_ptr() for t in list(model.parameters()) + list(model.buffers())}
    seen: list[tuple[torch.Tensor, bool]] = []

    def pack(t):
        seen.append((t, t.untyped_storage().data_ptr() in states))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run()
    return seen, out


def check_compiled(model: torch.nn.Module, batch, loss_fn, *, policy: str, backend: str = "aot_eager",
                   budget=0.5, exact: bool = True, atol: float = 1e-6, graphs: int = 1):
    """Compile ``model`` under ``policy`` and check the plans are what runs. Returns the graphs' records."""
    reference = copy.deepcopy(model)
    torch._dynamo.utils.counters.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = slackswap.compile(model, batch, loss_fn, hardware=HARDWARE, budget=budget, policy=policy,
                                     backend=backend)
        records = compiled.slackswap.graphs
        assert len(records) == graphs

        # Gradients and loss against the uncompiled model, with the same RNG stream (dropout included).
        torch.manual_seed(7)
        saved, loss = saved_storages(model, lambda: loss_fn(compiled, batch))
        torch.manual_seed(7)
        ref_loss = loss_fn(reference, batch)
        flops = backward_flops(loss)
        ref_flops = backward_flops(ref_loss)
    # Nothing ran uncompiled but what a graph break leaves out, and nothing fell back to eager.
    assert bool(torch._dynamo.utils.counters["graph_break"]) == (graphs > 1)
    assert not [w for w in caught if "eager" in str(w.message) or issubclass(w.category, RuntimeFallbackWarning)]
    assert len(compiled.slackswap.graphs) == graphs  # no recompile
    for p, q in zip(model.parameters(), reference.parameters()):
        if exact:
            assert torch.equal(p.grad, q.grad)
        else:
            torch.testing.assert_close(p.grad, q.grad, atol=atol, rtol=1e-5)
    if exact:
        assert torch.equal(loss, ref_loss)

    # Backward FLOPs added by recompute equal the plans' recompute groups' FLOPs.
    assert flops - ref_flops == sum(g.plan_recompute_flops for g in records)
    assert all(g.graph_recompute_flops == g.plan_recompute_flops for g in records)

    # What the forwards save, seen by hooks at the forward/backward boundary, by storage.
    layout = [row for g in records for row in g.saved]
    assert len(saved) == len(layout)
    kept: dict[int, int] = {}
    offloaded: dict[int, int] = {}
    for (tensor, is_state), (_, size, kind) in zip(saved, layout):
        assert tensor.untyped_storage().nbytes() == size
        assert is_state == (kind == carry_out.PARAMETER)
        if kind == carry_out.ACTIVATION:
            kept[tensor.untyped_storage().data_ptr()] = size
        elif kind == carry_out.OFFLOADED:
            offloaded[tensor.untyped_storage().data_ptr()] = size
    assert sum(kept.values()) == sum(g.plan.bytes_with(g.workload, slackswap.Action.KEEP) for g in records)
    swapped = sum(g.plan.bytes_with(g.workload, slackswap.Action.SWAP) for g in records)
    assert sum(offloaded.values()) == swapped
    assert sum(b for g in records for b in g.offloaded_bytes.values()) == swapped
    return records


def check_reload_steps(graph) -> None:
    """Each copy back is issued at the start of its step: every backward node before it belongs to an
    earlier step, and it comes before its first use."""
    bw = graph.backward_graph
    steps = carry_out.backward_steps(bw, graph.graph_workload)
    nodes = list(bw.graph.nodes)
    reloads = [n for n in nodes if n.op == "call_function" and carry_out.is_reload(n)]
    assert len(reloads) == graph.plan.count(slackswap.Action.SWAP)
    for reload in reloads:
        storage = graph.graph_workload.storage_of_node[reload.args[0].name.removeprefix(carry_out.OFFLOAD_PREFIX)]
        issue = carry_out.issue_step(graph.plan, storage)
        at = nodes.index(reload)
        before = [n for n in nodes[:at] if n.op != "placeholder" and not carry_out.is_reload(n)]
        assert all(steps[n] < issue for n in before), storage
        assert all(nodes.index(u) > at for u in reload.users)
