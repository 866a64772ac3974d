"""The compiled path's FLOPs objective (``PlanningPartitioner(objective="flops", torch_budget=...)``,
``slackswap.compile(..., objective="flops")``): on the joint graph torch partitions, the fewest-FLOPs
plan holding torch's bytes re-runs no more FLOPs than torch's own ``activation_memory_budget`` plan,
and its gradients are the plain step's. The mixed objective (``objective="mixed"``): holding torch's
bytes, it simulates at least as fast as torch's plan, swaps carried out, gradients the plain step's."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

import torch._functorch.config as functorch_config  # noqa: E402
from torch._functorch.partitioners import min_cut_rematerialization_partition  # noqa: E402

from compiled_checks import fresh_dynamo, step_with_partition  # noqa: E402,F401 (fresh_dynamo: autouse)

import slackswap  # noqa: E402
from slackswap.compiled.carry_out import ACTIVATION, graph_recompute_flops  # noqa: E402
from slackswap.compiled.fewest_flops import fewest_flops_plan  # noqa: E402
from slackswap.compiled.graph_workload import build_graph_workload  # noqa: E402
from slackswap.compiled.min_cut import budget_cut, in_forward, plan_of_saved_set, twins, zero_flop_cut  # noqa: E402
from slackswap.compiled.mixed_held import held_bytes  # noqa: E402
from slackswap.compiled.partition import PlanningPartitioner  # noqa: E402
from slackswap.compiled.recompute_holding import recompute_plan_holding  # noqa: E402
from slackswap.errors import ValidationError  # noqa: E402
from slackswap.sim import simulate  # noqa: E402
from slackswap.examples.models import ExampleConfig, loss_fn, make_batch, make_example  # noqa: E402

HARDWARE = slackswap.get_hardware("a100-80gb-pcie4")
SMALL = ExampleConfig(layers=2, hidden=16, heads=2, ffn=32, seq_len=8, vocab=32, dropout=0.0)


def _compile_step(kind, partition_fn):
    """One training step of the SMALL example ``kind`` compiled with ``partition_fn``; its gradients."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    return step_with_partition(make_example(kind, SMALL), make_batch(SMALL), loss_fn, partition_fn)


def _plain_grads(kind):
    torch.manual_seed(0)
    model = make_example(kind, SMALL)
    loss_fn(model, make_batch(SMALL)).backward()
    return [p.grad.clone() for p in model.parameters()]


def _torch_partition(kind, budget, hardware=HARDWARE):
    """torch's partition under ``activation_memory_budget``: per graph (what its forward saves: storage name
    -> bytes, the FLOPs its backward graph re-runs, its saved set as a plan of the widened space or None, the graph's workload)."""
    seen = []

    def partition(joint, joint_inputs, **kwargs):
        static = kwargs.get("static_lifetime_input_indices")
        options = dict(num_fwd_outputs=kwargs["num_fwd_outputs"], static_lifetime_input_indices=static)
        cut = zero_flop_cut(joint, joint_inputs, **options) | budget_cut(joint, joint_inputs, budget, **options)
        graph_workload = build_graph_workload(joint, static, hardware, name="graph", cut=cut)
        twin_of = twins(joint)
        fw, bw = min_cut_rematerialization_partition(joint, joint_inputs, compiler="inductor", **kwargs)
        outputs = fw.graph.find_nodes(op="output")[0].args[0][kwargs["num_fwd_outputs"]:]
        saved = in_forward(joint, {n.name for n in outputs if isinstance(n, torch.fx.Node)})
        workload = graph_workload.workload
        held = {graph_workload.storage_of_node[n]: workload.size_bytes_of[graph_workload.storage_of_node[n]]
                for n in saved if n in graph_workload.storage_of_node}
        seen.append((held, graph_recompute_flops(bw), plan_of_saved_set(graph_workload, saved, twin_of=twin_of),
                     workload))
        return fw, bw

    with functorch_config.patch(activation_memory_budget=budget):
        _compile_step(kind, partition)
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gpt2", "bert"])
def test_no_more_flops_than_torch_at_its_bytes(kind):
    plain = _plain_grads(kind)
    for budget in (0.2, 0.4, 0.6):
        (torch_graph,) = _torch_partition(kind, budget)
        torch_held, torch_flops, torch_plan, _ = torch_graph
        assert torch_plan is not None, budget  # torch's own saved set is among the widened candidates

        def plan(workload, held_bytes=sum(torch_held.values())):
            return fewest_flops_plan(workload, held_bytes)

        partitioner = PlanningPartitioner(HARDWARE, plan, name=kind, saved_set="min-cut", objective="flops",
                                          torch_budget=budget)
        grads = _compile_step(kind, partitioner)
        (graph,) = partitioner.graphs
        assert graph.plan.info["search"] == "complete"
        assert graph.plan.info["held_bytes"] <= sum(torch_held.values()), budget
        # The graph holds the plan's kept activations and re-runs the FLOPs the solver counted.
        produced = {t.name for t in graph.workload.tensors if t.producer is not None}
        kept = {graph.graph_workload.storage_of_node.get(n, n): size for n, size, kind_ in graph.saved
                if kind_ == ACTIVATION}
        assert sum(s for name, s in kept.items() if name in produced) <= graph.plan.info["held_bytes"]
        assert graph.graph_recompute_flops == graph.plan_recompute_flops == graph.plan.info["recompute_flops_once"]
        assert graph.graph_recompute_flops <= torch_flops, budget
        for got, want in zip(grads, plain):
            torch.testing.assert_close(got, want)


# A device 10,000 times slower at compute than the A100 (its host link as fast): on SMALL's graphs a step
# then lasts tens of microseconds, long enough for copies out (6 us latency each) to end within the forward.
SLOW_COMPUTE = dataclasses.replace(HARDWARE, name="a100-compute-over-10000",
                                   peak_flops_per_s=HARDWARE.peak_flops_per_s / 1e4,
                                   hbm_bytes_per_s=HARDWARE.hbm_bytes_per_s / 1e4)


@pytest.mark.parametrize("kind, budget, hardware, swaps", [
    ("gpt2", 0.4, SLOW_COMPUTE, True),
    # On the A100 no copy out of these graphs ends before the forward pass does (steps under a
    # microsecond): the plan is the faster of the fewest-FLOPs plan and torch's, here torch's (the
    # fewest-FLOPs plan simulates slower: its keep-back is greedy).
    ("llama", 0.6, HARDWARE, False),
    # Here recompute-optimal's plan holding torch's bytes simulates faster than the descents from the
    # fewest-FLOPs plan and torch's (0.447 against 0.475 us): it is a start of the search, so the result.
    ("gpt2", 0.6, HARDWARE, False),
])
def test_mixed_plan_holds_torchs_bytes_and_simulates_at_least_as_fast(kind, budget, hardware, swaps):
    (torch_graph,) = _torch_partition(kind, budget, hardware)
    torch_held, _, torch_plan, torch_workload = torch_graph
    held_budget = sum(torch_held.values())

    def plan(workload):
        return fewest_flops_plan(workload, held_budget)

    partitioner = PlanningPartitioner(hardware, plan, name=kind, saved_set="min-cut", objective="mixed",
                                      torch_budget=budget)
    grads = _compile_step(kind, partitioner)
    (graph,) = partitioner.graphs
    assert graph.plan.policy == "mixed-held"
    assert held_bytes(graph.workload, graph.plan) <= held_budget
    assert (graph.plan.count(slackswap.Action.SWAP) > 0) == swaps
    mixed_s = simulate(graph.workload, hardware, graph.plan, check=False).step_time_s
    assert mixed_s <= simulate(torch_workload, hardware, torch_plan, check=False).step_time_s
    assert mixed_s < simulate(graph.workload, hardware, plan(graph.workload), check=False).step_time_s
    # recompute-optimal's plan holding the same bytes is one of the search's starts.
    holding = recompute_plan_holding(graph.workload, hardware, held_budget)
    assert holding is not None and held_bytes(graph.workload, holding) <= held_budget
    assert mixed_s <= simulate(graph.workload, hardware, holding, check=False).step_time_s
    # The partition saves the kept activations; the swapped ones leave as host copies.
    produced = {t.name for t in graph.workload.tensors if t.producer is not None}
    kept = {graph.graph_workload.storage_of_node.get(n, n): size for n, size, kind_ in graph.saved
            if kind_ == ACTIVATION}
    assert sum(s for name, s in kept.items() if name in produced) <= graph.plan.bytes_with(graph.workload,
                                                                                         slackswap.Action.KEEP)
    assert (sum(graph.offloaded_bytes.values()) > 0) == swaps
    for got, want in zip(grads, _plain_grads(kind)):
        torch.testing.assert_close(got, want)


def test_slackswap_compile_with_the_flops_objective():
    # A fraction of what the graph holds with everything kept; the plan is recompute-only and exact.
    compiled = slackswap.compile(make_example("gpt2", SMALL), make_batch(SMALL), loss_fn, hardware=HARDWARE,
                                 budget=0.5, saved_set="min-cut", objective="flops", backend="aot_eager")
    (graph,) = compiled.slackswap.graphs
    everything = sum(t.size_bytes for t in graph.workload.saved_tensors)
    assert graph.plan.policy == "fewest-flops" and graph.plan.info["search"] == "complete"
    assert graph.plan.info["held_bytes"] <= int(0.5 * everything)
    assert set(graph.plan.actions.values()) <= {slackswap.Action.KEEP, slackswap.Action.RECOMPUTE}
    assert graph.graph_recompute_flops == graph.plan.info["recompute_flops_once"]


def test_slackswap_compile_with_the_mixed_objective():
    # Half of what the graph holds with everything kept, torch's plan at 0.5 among the starts.
    compiled = slackswap.compile(make_example("gpt2", SMALL), make_batch(SMALL), loss_fn, hardware=SLOW_COMPUTE,
                                 budget=0.5, saved_set="min-cut", objective="mixed", backend="aot_eager")
    (graph,) = compiled.slackswap.graphs
    everything = sum(t.size_bytes for t in graph.workload.saved_tensors)
    assert graph.plan.policy == "mixed-held" and graph.plan.info["held_budget_bytes"] == int(0.5 * everything)
    assert held_bytes(graph.workload, graph.plan) <= int(0.5 * everything)
    assert graph.plan.count(slackswap.Action.SWAP) > 0 and graph.offloaded_bytes
    with pytest.raises(ValidationError, match="objective='mixed' makes each graph's plan itself"):
        slackswap.compile(make_example("gpt2", SMALL), hardware=HARDWARE, objective="mixed", plan=graph.plan)


def test_objective_errors_are_typed():
    with pytest.raises(ValidationError, match="objective 'speed' is not one of time, flops"):
        slackswap.compile(make_example("gpt2", SMALL), hardware=HARDWARE, objective="speed")
    with pytest.raises(ValidationError, match="torch_budget widens the min-cut saved set"):
        PlanningPartitioner(HARDWARE, lambda w: None, name="m", saved_set="autograd", torch_budget=0.5)
