"""The compiled-path columns of vs_torch_budget.py: torch's partitioner and slackswap's on the same
joint graph (the decompositions of ``aot_eager_decomp_partition``), the same candidates and the same
FLOP counter.

- ``torch_step``: the model compiled like ``aot_eager_decomp_partition`` (same decompositions, same
  ``min_cut_rematerialization_partition``, nop compilers), with the partition function wrapped to
  read, besides, the graph's slackswap workload (``saved_set="min-cut"``) and the nodes torch's plan
  saves, so that torch's plan is simulated on the same workload as slackswap's (a cut storage torch
  saves is KEEP, the others RECOMPUTE).
- ``slackswap_step``: the model compiled the same way with slackswap's ``PlanningPartitioner``
  (``saved_set="min-cut"``): the plan chooses among the tensors PyTorch's min-cut partitioner saves
  with no matmul re-run, each rebuilt from what is kept through its forward ops.

Bytes held for backward: distinct storages the compiled forward saves, less parameters and the batch
(torch: by saved-tensor hooks; slackswap: the partition's saved layout, activations only: its RNG
states, 5,056 bytes each for a CPU generator and 16 on a CUDA one, and a swapped tensor's host copy
are not device activations). Backward FLOPs: FlopCounterMode around ``loss.backward()``.
"""

from __future__ import annotations

import torch
import torch._dynamo
import torch._functorch.config as functorch_config
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.debugging import boxed_nop
from torch._functorch.partitioners import min_cut_rematerialization_partition
from torch._prims.rng_prims import run_with_rng_state
from torch.utils.flop_counter import FlopCounterMode, _FlopCounterMode

import slackswap
from slackswap.compiled.carry_out import ACTIVATION, PARAMETER
from slackswap.compiled.fewest_flops import fewest_flops_plan
from slackswap.compiled.graph_workload import build_graph_workload
from slackswap.compiled.min_cut import in_forward, plan_of_saved_set, zero_flop_cut
from slackswap.compiled.partition import PlanningPartitioner
from slackswap.errors import BudgetError
from slackswap.schedule import make_plan
from slackswap.sim import simulate


def _replay_under_flop_counter(mode, rng_state, op, *args, **kwargs):
    # FlopCounterMode answers NotImplemented for higher-order ops it does not know (torch 2.13), so a
    # backward graph that replays a random op under it fails; a random op counts no FLOPs.
    return run_with_rng_state(rng_state, op, *args, **kwargs)


# Registered once per process: torch refuses a second handler for the same mode, and the test suite's
# compiled checks (tests/compiled_checks.py) register their own before importing this module.
if _FlopCounterMode not in run_with_rng_state.python_key_table:
    run_with_rng_state.py_impl(_FlopCounterMode)(_replay_under_flop_counter)


def _decompositions():
    from torch._inductor.compile_fx import select_decomp_table

    return select_decomp_table()


def _backend(partition_fn):
    return aot_autograd(fw_compiler=boxed_nop, bw_compiler=boxed_nop, decompositions=_decompositions,
                        partition_fn=partition_fn)


def _step(model, batch, loss_fn, backend, excluded: set[int]) -> tuple[int, int, list[tuple[int, int]]]:
    """(bytes the compiled forward saves by saved-tensor hooks, backward FLOPs, (storage pointer,
    bytes) of every tensor saved, in the order saved) of one step after a compiling one."""
    torch._dynamo.reset()
    with functorch_config.patch(unlift_effect_tokens=True):
        compiled = torch.compile(model, backend=backend)
        torch.manual_seed(1)
        loss_fn(compiled, batch).backward()  # compiles (and so partitions) forward and backward
        model.zero_grad(set_to_none=True)
        held: dict[int, int] = {}
        packed: list[tuple[int, int]] = []

        def pack(t):
            ptr = t.untyped_storage().data_ptr()
            packed.append((ptr, t.untyped_storage().nbytes()))
            if ptr not in excluded:
                held[ptr] = t.untyped_storage().nbytes()
            return t

        torch.manual_seed(1)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = loss_fn(compiled, batch)
        with FlopCounterMode(display=False) as counter:
            loss.backward()
    torch._dynamo.reset()
    return sum(held.values()), counter.get_total_flops(), packed


def torch_step(model, batch, loss_fn, budget: float, hardware, excluded: set[int]):
    """(bytes held, backward FLOPs, per graph: (bytes its forward saves, its activations only; its
    simulated throughput and peak, or None where its saved set is not one of the workload's plans))
    under ``activation_memory_budget=budget``."""
    seen = []

    def partition(joint, joint_inputs, **kwargs):
        cut = zero_flop_cut(joint, joint_inputs, num_fwd_outputs=kwargs["num_fwd_outputs"],
                            static_lifetime_input_indices=kwargs.get("static_lifetime_input_indices"))
        graph_workload = build_graph_workload(joint, kwargs.get("static_lifetime_input_indices"), hardware,
                                              name=f"torch.graph{len(seen)}", cut=cut)
        fw, bw = min_cut_rematerialization_partition(joint, joint_inputs, compiler="inductor", **kwargs)
        outputs = fw.graph.find_nodes(op="output")[0].args[0][kwargs["num_fwd_outputs"]:]
        seen.append((graph_workload, in_forward(joint, {n.name for n in outputs if isinstance(n, torch.fx.Node)})))
        return fw, bw

    with functorch_config.patch(activation_memory_budget=budget):
        held, flops, _ = _step(model, batch, loss_fn, _backend(partition), excluded)
    return held, flops, [_graph_saved(graph_workload, saved, hardware) for graph_workload, saved in seen]


def shared_budgets(graphs) -> list[int]:
    """Each graph's budget: torch's bytes in it, raised to the least any plan of it reaches where they are
    below (a loss graph whose rebuilt tensors torch does not count at the boundary), the raise taken from
    the largest graph's, so that the budgets add up to torch's bytes."""
    shares = [max(1, share) for share, _, _ in graphs]
    budgets = [max(share, minimum) for share, (_, _, minimum) in zip(shares, graphs)]
    largest = max(range(len(budgets)), key=budgets.__getitem__)
    budgets[largest] -= sum(budgets) - sum(shares)
    return budgets


def _graph_saved(graph_workload, saved_names, hardware):
    """(bytes of the activations and step inputs the graph saves, the simulation of its saved set as a
    plan of the workload or None where it saves an activation that is no candidate, the least budget
    any plan of the workload reaches)."""
    from slackswap.planners import minimum_budget_bytes

    workload = graph_workload.workload
    storages = {graph_workload.storage_of_node[n] for n in saved_names if n in graph_workload.storage_of_node}
    held = sum(workload.size_bytes_of[s] for s in storages)  # step inputs too: slackswap's peak counts them
    plan = plan_of_saved_set(graph_workload, saved_names)
    return (held, None if plan is None else simulate(workload, hardware, plan, check=False),
            minimum_budget_bytes(workload))


def step_throughput_pct(timelines) -> float:
    """Throughput of a step of several graphs: their ideal times over their simulated times."""
    step = sum(t.step_time_s for t in timelines)
    return 100.0 * sum(t.ideal_step_time_s for t in timelines) / step if step > 0 else 100.0


class NoPlan(Exception):
    """Why a policy made no plan for a graph ("below minimum", "refuses")."""


def slackswap_step(model, batch, loss_fn, make, hardware, excluded: set[int], *, objective: str = "time",
                   torch_budget: float | None = None):
    """(bytes held, backward FLOPs, simulated throughput %, the plans) of one step under the plans
    ``make(workload)`` returns for each graph; a string saying why when it makes none. ``objective`` and
    ``torch_budget``: PlanningPartitioner's."""
    partitioner = PlanningPartitioner(hardware, make, name=type(model).__name__, saved_set="min-cut",
                                      objective=objective, torch_budget=torch_budget)
    try:
        _, flops, packed = _step(model, batch, loss_fn, _backend(partitioner), excluded)
    except torch._dynamo.exc.BackendCompilerFailed as exc:
        inner = getattr(exc, "inner_exception", None)
        if isinstance(inner, NoPlan):
            return str(inner)
        if isinstance(inner, BudgetError):
            return "refuses"
        raise
    # Saved-tensor hooks see the graphs' saved tensors in their layout's order: drop RNG states and
    # host copies by their kind there.
    # A graph compiled again (a guard failed on the measured step) saves its tensors in its last layout:
    # the layouts are those of the last graphs compiled whose count of saved tensors is the step's.
    graphs = list(partitioner.graphs)
    while graphs and sum(len(g.saved) for g in graphs) > len(packed):
        graphs.pop(0)
    kinds = [kind for graph in graphs for _, _, kind in graph.saved]
    if len(kinds) != len(packed):
        raise RuntimeError(f"{len(packed)} tensors saved, {len(kinds)} in the partitions' layouts")
    held = sum(dict((ptr, size) for (ptr, size), kind in zip(packed, kinds)
                    if kind in (ACTIVATION, PARAMETER) and ptr not in excluded).values())
    timelines = [simulate(g.workload, hardware, g.plan, check=False) for g in graphs]
    return held, flops, step_throughput_pct(timelines), partitioner.graphs


HOLDING = "recompute-optimal holding torch's bytes"
FEWEST_FLOPS = "fewest FLOPs holding torch's bytes"
"""slackswap.compiled.fewest_flops on the min-cut candidates widened with torch's own saved set at the
row's budget (PlanningPartitioner(objective="flops", torch_budget=...))."""
MIXED = "mixed holding torch's bytes"
"""slackswap.compiled.mixed_held from the fewest-FLOPs plan, torch's own plan and recompute-optimal's plan
holding those bytes, swaps allowed, what each
graph holds when its forward pass ends at most torch's bytes there (PlanningPartitioner(objective="mixed",
torch_budget=...))."""


def holding_plan(workload, held_bytes: int, hardware):
    """`recompute-optimal`'s plan for the largest budget whose kept tensors and step inputs, what it
    holds when the forward pass ends, are at most ``held_bytes``
    (slackswap.compiled.recompute_holding): slackswap's budget bounds the peak over the whole step,
    torch's figure is what it holds at the boundary, so this is the plan that holds what torch holds."""
    from slackswap.compiled.recompute_holding import recompute_plan_holding

    best = recompute_plan_holding(workload, hardware, held_bytes)
    if best is None:
        raise NoPlan("none found")
    return best


def plan_maker(policy: str, budgets_bytes: list[int], hardware, least_flops_plan):
    """A PlanFn: for the i-th graph compiled, ``policy``'s plan for ``budgets_bytes[i]``, the keep-all
    plan where everything fits, NoPlan below the least any plan holds."""
    from slackswap.planners import minimum_budget_bytes
    from slackswap.sim import simulate_ideal

    made = []

    def make(workload):
        budget_bytes = budgets_bytes[len(made)] if budgets_bytes else 0
        made.append(workload.name)
        if budget_bytes >= simulate_ideal(workload, hardware).peak_memory_bytes or policy == "keep-all":
            return make_plan(workload, {}, policy="ideal", budget_bytes=None)
        if policy == HOLDING:  # a bound on what it holds at the boundary, not on its peak
            return holding_plan(workload, budget_bytes, hardware)
        if policy in (FEWEST_FLOPS, MIXED):  # likewise, found exactly (the partitioner mixes in swaps from it)
            try:
                return fewest_flops_plan(workload, budget_bytes)
            except BudgetError:
                raise NoPlan("below its step inputs") from None
        if budget_bytes < minimum_budget_bytes(workload):
            raise NoPlan("below minimum")
        if policy == "least-flops":
            plan = least_flops_plan(workload, budget_bytes)
            if plan is None:
                raise NoPlan("none found")
            return plan
        return slackswap.plan(workload, budget=budget_bytes, policy=policy, hardware=hardware)

    return make
