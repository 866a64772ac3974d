"""``slackswap.compile``: torch.compile with a plan carried out inside the compiled graph."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from ..errors import BudgetError, BudgetWarning, SlackswapError, ValidationError
from ..hardware import Hardware
from ..plans import Plan
from ..workload import Workload
from .partition import OBJECTIVES, SAVED_SETS, CompiledGraph, PlanningPartitioner, make_backend, plan_lookup

BACKENDS = ("inductor", "aot_eager")


@dataclass(frozen=True)
class CompiledPlans:
    """What ``slackswap.compile`` planned, one entry per compiled graph (a graph break or a new input
    shape adds one), in compile order. Attached to the compiled module as ``.slackswap``."""

    partitioner: PlanningPartitioner

    @property
    def graphs(self) -> list[CompiledGraph]:
        return list(self.partitioner.graphs)

    @property
    def workloads(self) -> list[Workload]:
        return [g.workload for g in self.partitioner.graphs]

    @property
    def plans(self) -> list[Plan]:
        return [g.plan for g in self.partitioner.graphs]


def compile_with_plan(model: torch.nn.Module, batch: Any = None, loss_fn: Any = None, *,
                      hardware: Hardware | str, budget: float | int | str = 0.5, policy: str = "slackswap",
                      plan: Plan | Sequence[Plan] | None = None, backend: str = "inductor",
                      saved_set: str = "autograd", objective: str = "time", plan_fn: Callable[..., Plan],
                      **compile_kwargs: Any) -> torch.nn.Module:
    # plan_fn is slackswap.plan, passed in by slackswap.compile so that this module does not
    # import the API that imports it.
    from ..hardware import get_hardware

    hw = get_hardware(hardware)
    if backend not in BACKENDS:
        raise ValidationError(f"backend {backend!r} is not supported by slackswap.compile: use one of {', '.join(BACKENDS)}")
    if saved_set not in SAVED_SETS:
        raise ValidationError(f"saved_set {saved_set!r} is not one of {', '.join(SAVED_SETS)}")
    if objective not in OBJECTIVES:
        raise ValidationError(f"objective {objective!r} is not one of {', '.join(OBJECTIVES)}")
    if objective != "time" and plan is not None:
        raise ValidationError(f"objective={objective!r} makes each graph's plan itself: drop plan= (or the objective)")
    if compile_kwargs.get("dynamic"):
        raise ValidationError("slackswap.compile plans each input shape on its own: drop dynamic=True "
                              "(each new shape compiles and plans one more graph)")
    compile_kwargs["dynamic"] = False
    budget = _as_fraction(budget)
    if plan is None and not isinstance(budget, float):
        _refuse_bytes_for_fsdp(model, budget)
    if plan is not None:
        make = plan_lookup([plan] if isinstance(plan, Plan) else list(plan))
    elif objective in ("flops", "mixed"):  # "mixed" starts from the fewest-FLOPs plan (PlanningPartitioner)
        from .fewest_flops import fewest_flops_plan

        def make(workload: Workload) -> Plan:
            if partitioner.graphs and partitioner.warming_up and not isinstance(budget, float):
                _refuse_graph_break(partitioner, budget)
            return fewest_flops_plan(workload, _held_share(workload, budget))
    else:
        def make(workload: Workload) -> Plan:
            if partitioner.graphs and partitioner.warming_up and not isinstance(budget, float):
                _refuse_graph_break(partitioner, budget)
            return plan_fn(workload, hw, _graph_share(workload, hw, budget), policy)

    sharded = _fsdp_buffers_are_state(model)
    # With torch's objective and a fraction, torch's own plan at that activation_memory_budget is added to
    # the min-cut candidates, so that its plan is one of the space's.
    widen = objective in ("flops", "mixed") and saved_set == "min-cut" and isinstance(budget, float)
    partitioner = PlanningPartitioner(hw, make, name=type(model).__name__, unit_graphs=sharded, saved_set=saved_set,
                                      objective=objective, torch_budget=budget if widen else None)
    compiled = torch.compile(model, backend=make_backend(partitioner, backend), **compile_kwargs)
    object.__setattr__(compiled, "slackswap", CompiledPlans(partitioner))
    if batch is not None and loss_fn is not None:
        partitioner.warming_up = True
        try:
            _warm_up(compiled, model, batch, loss_fn)
        finally:
            partitioner.warming_up = False
    return compiled


def _as_fraction(budget: float | int | str) -> float | int | str:
    """'0.5' reads as the fraction 0.5, as slackswap.units.parse_budget reads it."""
    if isinstance(budget, str):
        try:
            value = float(budget.strip())
        except ValueError:
            return budget
        if 0 < value <= 1:
            return value
    return budget


def _graph_share(workload: Workload, hardware: Hardware, budget: float | int | str) -> float | int | str:
    """A fraction applies to each graph's own unconstrained peak; a graph that cannot get that low (one
    that saves little besides its inputs, as a loss after a graph break) is planned at its minimum."""
    if not isinstance(budget, float):
        return budget
    from ..planners.minimum import minimum_budget_bytes
    from ..sim import simulate_ideal
    from ..units import parse_budget

    share = parse_budget(budget, simulate_ideal(workload, hardware).peak_memory_bytes)
    floor = minimum_budget_bytes(workload)
    if share >= floor:
        return share
    warnings.warn(BudgetWarning(
        f"compiled graph {workload.name!r} cannot be planned within {budget:.2f} of its peak; it is planned at "
        f"its minimum of {floor} bytes"))
    return floor


def _held_share(workload: Workload, budget: float | int | str) -> int:
    """objective="flops": the bytes a graph may hold when its forward pass ends. A fraction applies to what
    the graph holds with everything kept (its candidates and step inputs), as activation_memory_budget
    applies to what PyTorch's partitioner saves with nothing recomputed; bytes or a size apply as they are."""
    from ..units import parse_size_bytes

    everything = sum(t.size_bytes for t in workload.saved_tensors)
    if isinstance(budget, float):
        if not 0 < budget <= 1:
            raise BudgetError(f"budget {budget} must be a fraction above 0 and at most 1, or a byte count")
        return int(budget * everything)
    if isinstance(budget, int) and not isinstance(budget, bool):
        if budget <= 0:
            raise BudgetError(f"budget of {budget} bytes must be positive")
        return budget
    return parse_size_bytes(str(budget).strip())


def _warm_up(compiled: torch.nn.Module, model: torch.nn.Module, batch: Any, loss_fn: Any) -> None:
    """Compile (and so plan) now with one training step whose effects are undone: gradients,
    buffers and the RNG streams are as they were before."""
    params = list(model.parameters())
    grads = [None if p.grad is None else p.grad.detach().clone() for p in params]
    buffers = [b.detach().clone() for b in model.buffers()]
    devices = sorted({p.device.index or 0 for p in params if p.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices):
        try:
            loss = loss_fn(compiled, batch)
            loss.backward()
        except torch._dynamo.exc.BackendCompilerFailed as exc:
            inner = getattr(exc, "inner_exception", None)
            if isinstance(inner, SlackswapError):
                raise inner from None  # the planning error itself, not torch.compile's wrapper
            raise
    with torch.no_grad():
        for p, g in zip(params, grads):
            p.grad = g
        for b, saved in zip(model.buffers(), buffers):
            b.copy_(saved)


def _refuse_graph_break(partitioner: PlanningPartitioner, budget) -> None:
    """A budget in bytes cannot be shared among graphs planned one at a time (each compiles, and is
    planned, before the next one is seen)."""
    where = _graph_end(partitioner.graphs[0])
    raise BudgetError(
        f"the model compiles into more than one graph (the first graph break is after {where}), and a budget "
        f"in bytes ({budget!r}) cannot be shared among graphs planned one at a time: give the budget as a "
        "fraction (each graph gets that fraction of its own peak) or remove the graph break (fullgraph=True "
        "names its cause)")


def _refuse_bytes_for_fsdp(model: torch.nn.Module, budget) -> None:
    """FSDP2 runs its hooks outside torch.compile's graphs (they are excluded from tracing), so each
    fully_shard unit's forward compiles as its own graph, and one graph may serve several units
    (every block of a stack): a budget in bytes would be given to each of them."""
    from ..profiler.fsdp import fsdp_units

    units = fsdp_units(model)
    if units:
        raise BudgetError(
            f"slackswap.compile on an FSDP2 model: each fully_shard unit ({len(units)} here) compiles as its own "
            f"graph, and a budget in bytes ({budget!r}) cannot be shared among graphs planned one at a time: give "
            "the budget as a fraction (each graph gets that fraction of its own peak)")


def _fsdp_buffers_are_state(model: torch.nn.Module) -> bool:
    """torch.compile passes the buffers of a fully_shard unit (which FSDP does not shard) as ordinary
    graph inputs, not as the static module state it passes for an unsharded model; marking them static
    (unguarded, as torch._dynamo.mark_static_address does) makes them state, not step inputs, in the
    graph's workload, as without FSDP. True when ``model`` is FSDP2-sharded."""
    from ..profiler.fsdp import fsdp_units

    if not fsdp_units(model):
        return False
    for buffer in model.buffers():
        torch._dynamo.mark_static_address(buffer, guard=False)
    return True


def _graph_end(graph: CompiledGraph) -> str:
    return graph.graph_workload.end_source or f"graph {graph.workload.name!r}"
