"""The partition function that plans each joint graph and carries the plan out, and the two
torch.compile backends built on it (``aot_eager`` and ``inductor`` with this partitioner)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx
from torch._functorch.partitioners import default_partition

from ..errors import PlanMismatchError, ValidationError
from ..hardware import Hardware
from ..plans import Action, Plan
from ..schedule import check_plan, make_plan
from ..workload import Workload
from . import carry_out
from .graph_workload import GraphWorkload, build_graph_workload, tag_untagged_backward
from .fewest_flops import rebuild_chains, recompute_flops
from .min_cut import budget_cut, plan_of_saved_set, twins, zero_flop_cut
from .mixed_held import mixed_held_plan
from .recompute_holding import recompute_plan_holding

SAVED_SETS = ("autograd", "min-cut")
OBJECTIVES = ("time", "flops", "mixed")


@dataclass
class CompiledGraph:
    """What slackswap did to one compiled graph: its workload, its plan and what the partition holds."""

    workload: Workload
    plan: Plan
    saved: list[tuple[str, int, str]]
    """(node, storage bytes, kind) of every tensor the forward graph saves, in save order
    (kinds: slackswap.compiled.carry_out.ACTIVATION, OFFLOADED, RNG_STATE, PARAMETER)."""
    offloaded_bytes: dict[str, int]
    reload_positions: dict[str, int]
    recompute_copies: int
    graph_recompute_flops: float
    plan_recompute_flops: float
    graph_workload: GraphWorkload = field(repr=False)
    backward_graph: fx.GraphModule = field(repr=False)
    """The partitioned backward graph as slackswap left it (before the backend compiles it)."""

    @property
    def kept_bytes(self) -> int:
        return self.plan.bytes_with(self.workload, Action.KEEP)

    @property
    def swapped_bytes(self) -> int:
        return self.plan.bytes_with(self.workload, Action.SWAP)


PlanFn = Callable[[Workload], Plan]


class PlanningPartitioner:
    """AOTAutograd partition function: profile the joint graph, plan it, tag it, partition it with
    PyTorch's default partitioner, then insert the plan's copies. One instance per ``slackswap.compile``."""

    def __init__(self, hardware: Hardware, make_plan: PlanFn, *, name: str, unit_graphs: bool = False,
                 saved_set: str = "autograd", objective: str = "time", torch_budget: float | None = None) -> None:
        if saved_set not in SAVED_SETS:
            raise ValidationError(f"saved_set {saved_set!r} is not one of {', '.join(SAVED_SETS)}")
        if objective not in OBJECTIVES:
            raise ValidationError(f"objective {objective!r} is not one of {', '.join(OBJECTIVES)}")
        if torch_budget is not None and saved_set != "min-cut":
            raise ValidationError("torch_budget widens the min-cut saved set: give saved_set='min-cut' with it")
        self.hardware = hardware
        self.saved_set = saved_set
        """What the plan chooses from: "autograd", what the derivative formulas read; "min-cut", what
        PyTorch's min-cut partitioner saves with no matmul re-run (min_cut.py)."""
        self.objective = objective
        """"time": backward re-runs each recompute group as the plan's schedule does (a node shared by
        groups of two steps is run once per group, as the simulator counts it); "flops": each re-run
        node once, kept until its last use, as PyTorch's partitioner does (fewest_flops.py's count);
        "mixed": the same bound on what is held when the forward pass ends, the plan the fastest found in
        the simulator with swaps and recomputes mixed (mixed_held.py), descending from ``make_plan``'s
        recompute-only plan (whose info gives the bound, "held_budget_bytes"), from recompute-optimal's plan
        holding at most that bound (recompute_holding.py) and, with torch_budget, from PyTorch's own plan;
        re-run nodes are run once as with "flops"."""
        self.torch_budget = torch_budget
        """Where set, the candidates also hold what PyTorch's own plan at activation_memory_budget =
        torch_budget saves (min_cut.budget_cut), so that plan is one of the space's."""
        self.unit_graphs = unit_graphs
        """The model is FSDP2-sharded: a graph without numbered blocks is one fully_shard unit (graph_workload.py)."""
        self.make_plan = make_plan
        self.name = name
        self.graphs: list[CompiledGraph] = []
        self.warming_up = False
        """True while slackswap.compile runs its warm-up step (graphs compiled then are one model's graphs)."""

    def __call__(self, joint: fx.GraphModule, joint_inputs: Sequence[Any], *, num_fwd_outputs: int,
                 static_lifetime_input_indices: list[int] | None = None, **_: Any):
        cut = torch_saved = None
        if self.saved_set == "min-cut":
            tag_untagged_backward(joint.graph)
            cut = zero_flop_cut(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs,
                                static_lifetime_input_indices=static_lifetime_input_indices)
            if self.torch_budget is not None:
                torch_saved = budget_cut(joint, joint_inputs, self.torch_budget, num_fwd_outputs=num_fwd_outputs,
                                         static_lifetime_input_indices=static_lifetime_input_indices)
                cut |= torch_saved
        graph_workload = build_graph_workload(
            joint, static_lifetime_input_indices, self.hardware, name=f"{self.name}.graph{len(self.graphs)}",
            unit_graphs=self.unit_graphs, cut=cut)
        workload = graph_workload.workload
        if any(t.producer is not None for t in workload.saved_tensors):
            plan = self.make_plan(workload)
        else:  # it saves only its inputs (a graph after a break, say): nothing to plan, all kept
            plan = make_plan(workload, {}, policy="ideal", budget_bytes=None)
        if self.objective == "mixed":
            plan = self._mixed(joint, graph_workload, plan, torch_saved)
        check_plan(graph_workload.workload, plan)
        carry_out.tag_joint_graph(joint, graph_workload, plan)
        fw, bw = default_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs,
                                   static_lifetime_input_indices=static_lifetime_input_indices)
        copies = carry_out.split_shared_recompute(bw, graph_workload, plan) if self.objective == "time" else 0
        use_streams = _accelerator_graph(fw)
        offloaded = carry_out.offload_swapped(fw, bw, graph_workload, plan, use_streams=use_streams)
        positions = carry_out.place_reloads(bw, graph_workload, plan) if offloaded else {}
        self.graphs.append(CompiledGraph(
            workload=graph_workload.workload, plan=plan,
            saved=carry_out.saved_tensor_layout(fw, num_fwd_outputs, graph_workload), offloaded_bytes=offloaded,
            reload_positions=positions, recompute_copies=copies,
            graph_recompute_flops=carry_out.graph_recompute_flops(bw),
            plan_recompute_flops=self._plan_recompute_flops(workload, plan),
            graph_workload=graph_workload, backward_graph=bw,
        ))
        return fw, bw

    def _mixed(self, joint: fx.GraphModule, graph_workload: GraphWorkload, plan: Plan, torch_saved) -> Plan:
        """objective="mixed": the fastest plan found holding what ``plan`` may hold at the boundary."""
        budget = plan.info.get("held_budget_bytes")
        if budget is None or Action.RECOMPUTE not in plan.actions.values():
            return plan  # nothing recomputed (the keep-all plan, say): nothing to turn into a swap
        starts = [plan]
        if torch_saved is not None:
            torch_plan = plan_of_saved_set(graph_workload, set(torch_saved), twin_of=twins(joint))
            if torch_plan is not None:
                starts.append(torch_plan)
        recompute_plan = recompute_plan_holding(graph_workload.workload, self.hardware, budget)
        if recompute_plan is not None:
            starts.append(recompute_plan)
        return mixed_held_plan(graph_workload.workload, self.hardware, budget, starts)

    def _plan_recompute_flops(self, workload: Workload, plan: Plan) -> float:
        if self.objective == "time":
            return plan.recompute_flops(workload)
        recomputed = [name for name, action in plan.actions.items() if action is Action.RECOMPUTE]
        return recompute_flops(workload, recomputed, rebuild_chains(workload))


def _accelerator_graph(fw: fx.GraphModule) -> bool:
    for node in fw.graph.find_nodes(op="placeholder"):
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor) and value.device.type != "cpu":
            return True
    return False


def plan_lookup(plans: Sequence[Plan]) -> PlanFn:
    """A PlanFn that returns the given plan made for a graph's workload (matched by fingerprint)."""
    by_fingerprint = {p.workload_fingerprint: p for p in plans}

    def lookup(workload: Workload) -> Plan:
        plan = by_fingerprint.get(workload.fingerprint)
        if plan is None:
            raise PlanMismatchError(
                f"no given plan was made for compiled graph {workload.name!r} (fingerprint {workload.fingerprint}): "
                "make the plans from slackswap.compile's own workloads (compiled.slackswap.workloads)")
        return plan

    return lookup


def make_backend(partitioner: PlanningPartitioner, backend: str) -> Callable:
    """A torch.compile backend that partitions through ``partitioner``."""
    if backend == "aot_eager":
        from torch._dynamo.backends.common import aot_autograd
        from torch._dynamo.backends.debugging import boxed_nop

        return aot_autograd(fw_compiler=boxed_nop, bw_compiler=boxed_nop, partition_fn=partitioner,
                            keep_inference_input_mutations=True)
    if backend == "inductor":
        from torch._inductor.compile_fx import compile_fx
        from torch._inductor.custom_graph_pass import CustomPartitionerFn

        class _Partitioner(CustomPartitionerFn):
            def __call__(self, gm, joint_inputs, **kwargs):
                kwargs.pop("compiler", None)
                return partitioner(gm, joint_inputs, **kwargs)

            def uuid(self):
                return None  # never served from a cache: the plan depends on more than the graph

        custom = _Partitioner()

        def inductor_backend(gm, example_inputs, **kwargs):
            with torch._inductor.config.patch(custom_partitioner_fn=custom, fx_graph_cache=False), \
                    torch._functorch.config.patch(enable_autograd_cache=False):
                return compile_fx(gm, example_inputs, **kwargs)

        return inductor_backend
    raise ValidationError(f"backend {backend!r} is not supported by slackswap.compile: use 'inductor' or 'aot_eager'")
