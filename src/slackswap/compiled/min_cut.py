"""The saved set of PyTorch's min-cut partitioner with no matmul re-run: the candidates a plan on the
compiled path chooses from when it is built with ``saved_set="min-cut"`` (graph_workload.py).

Autograd's derivative formulas read what they read: a GELU's backward its input, the next linear
layer's backward the GELU's output, a log-softmax's backward its output. A min-cut partitioner may
save anything in the forward pass and rebuild the rest: it keeps the matmul output ahead of the
GELU and re-runs the pointwise ops for both readers, the logits and two row statistics instead of
the log-softmax, and so holds less with no FLOP re-run. This module asks PyTorch's own partitioner
(``min_cut_rematerialization_partition``, the one behind ``activation_memory_budget``) for that cut
with every ban on re-running cheap ops lifted except the one on ops outside its list of cheap ones
(matmuls, attention, random ops): the fewest bytes it saves with nothing that counts FLOPs re-run.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch.fx as fx

from .joint_nodes import is_backward_node, is_forward_op_node

MIN_CUT_OPTIONS = {
    "activation_memory_budget": 1.0,
    "ban_recompute_used_far_apart": False,
    "ban_recompute_long_fusible_chains": False,
    "ban_recompute_materialized_backward": False,
    "ban_recompute_not_in_allowlist": True,
    # Node names must stay those of the joint graph the plan tags (CSE would merge and rename).
    "cse": False,
}
"""torch._functorch.config for the cut: the options PyTorch's own budget search tries second
("more aggressive", before it lets matmuls re-run)."""


def zero_flop_cut(joint: fx.GraphModule, joint_inputs: Sequence[Any], *, num_fwd_outputs: int,
                  static_lifetime_input_indices: Sequence[int] | None) -> frozenset[str]:
    """Names of the joint graph's forward nodes PyTorch's min-cut partitioner saves for backward
    under MIN_CUT_OPTIONS (run on a copy: ``joint`` is left as it is)."""
    return _saved_by_partitioner(joint, joint_inputs, MIN_CUT_OPTIONS, num_fwd_outputs=num_fwd_outputs,
                                 static_lifetime_input_indices=static_lifetime_input_indices)


def budget_cut(joint: fx.GraphModule, joint_inputs: Sequence[Any], budget: float, *, num_fwd_outputs: int,
               static_lifetime_input_indices: Sequence[int] | None) -> frozenset[str]:
    """Names of the forward nodes PyTorch's own plan at ``activation_memory_budget=budget`` saves (its
    min-cut partitioner with its default options, on a copy of ``joint``). Added to the zero-FLOP cut,
    they put that plan in the space a plan chooses from (``PlanningPartitioner(torch_budget=...)``). Its
    partitioner first merges duplicate nodes (CSE) and may save a node whose unmerged twin is what
    backward reads here (the label mask of HF ViT's loss): every twin of a saved node is in the result."""
    saved = _saved_by_partitioner(joint, joint_inputs, {"activation_memory_budget": budget},
                                  num_fwd_outputs=num_fwd_outputs,
                                  static_lifetime_input_indices=static_lifetime_input_indices)
    return frozenset(with_twins(saved, twins(joint)))


def twins(joint: fx.GraphModule) -> dict[str, str]:
    """Forward node -> the first forward node computing the same value (same op, same arguments), the
    node PyTorch's CSE pass would merge it into; random ops are never merged."""
    from torch._functorch.compile_utils import get_aten_target, rand_ops

    first: dict[tuple[Any, str, str], str] = {}
    result: dict[str, str] = {}

    def same_as(arg):
        return result.get(arg.name, arg.name)

    for node in joint.graph.nodes:
        if not is_forward_op_node(node) or get_aten_target(node) in rand_ops:
            continue
        key = (node.target, repr(fx.node.map_arg(node.args, same_as)), repr(fx.node.map_arg(node.kwargs, same_as)))
        original = first.setdefault(key, node.name)
        if original != node.name:
            result[node.name] = original
    return result


def with_twins(saved, twin_of: dict[str, str]) -> set[str]:
    """``saved`` and every twin (twins()) of a node in it."""
    groups = {twin_of.get(name, name) for name in saved}
    return set(saved) | {name for name, original in twin_of.items() if original in groups} | groups


def _saved_by_partitioner(joint: fx.GraphModule, joint_inputs: Sequence[Any], options: dict, *, num_fwd_outputs: int,
                          static_lifetime_input_indices: Sequence[int] | None) -> frozenset[str]:
    from torch._functorch import config as functorch_config
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    copy = fx.GraphModule(joint, _copy_graph(joint.graph))
    with functorch_config.patch(options):
        fw, _ = min_cut_rematerialization_partition(
            copy, joint_inputs, compiler="inductor", num_fwd_outputs=num_fwd_outputs,
            static_lifetime_input_indices=list(static_lifetime_input_indices or ()))
    outputs = fw.graph.find_nodes(op="output")[0].args[0]
    saved = {n.name for n in outputs[num_fwd_outputs:] if isinstance(n, fx.Node)}
    return frozenset(in_forward(joint, saved))


def in_forward(joint: fx.GraphModule, saved: set[str]) -> set[str]:
    """``saved`` with each backward node the partitioner moved into the forward pass (a transpose of a
    saved value, say) replaced by the forward nodes it is computed from: the plan tags forward nodes."""
    by_name = {n.name: n for n in joint.graph.nodes}
    result: set[str] = set()
    pending = [by_name[name] for name in saved if name in by_name]
    while pending:
        node = pending.pop()
        if not is_backward_node(node):
            result.add(node.name)
        else:
            pending.extend(node.all_input_nodes)
    return result


def _copy_graph(graph: fx.Graph) -> fx.Graph:
    # Graph.graph_copy keeps node names and copies each node's meta dict, so the partitioner's
    # changes to tags and meta stay on the copy.
    copy = fx.Graph()
    value_remap: dict[fx.Node, fx.Node] = {}
    output = copy.graph_copy(graph, value_remap)
    copy.output(output)
    return copy


def cut_sources(forward_nodes: Sequence[fx.Node], cut: frozenset[str]) -> dict[str, tuple[frozenset[str], frozenset[str]]]:
    """Per forward node: (the cut nodes and graph inputs it is computed from, the forward nodes re-run
    in between). A node in the cut, or a graph input, is its own source."""
    result: dict[str, tuple[frozenset[str], frozenset[str]]] = {}
    for node in forward_nodes:
        if node.name in cut or node.op == "placeholder":
            result[node.name] = (frozenset((node.name,)), frozenset())
            continue
        sources: set[str] = set()
        between: set[str] = {node.name}
        for arg in node.all_input_nodes:
            got = result.get(arg.name)
            if got is None:  # a graph input or a node outside the forward pass
                sources.add(arg.name)
                continue
            sources |= got[0]
            between |= got[1]
        result[node.name] = (frozenset(sources), frozenset(between))
    return result



def plan_of_saved_set(graph_workload, saved: set[str], *, policy: str = "torch", twin_of: dict[str, str] | None = None):
    """The recompute-only Plan of ``graph_workload`` (built with a cut) that keeps what a partition
    saves (forward node names, as ``in_forward`` returns them) and recomputes the other candidates;
    None where the partition saves an activation that is no candidate (then no plan says the same),
    other than a constant. ``twin_of`` (twins() of the joint graph): a saved node stands for its twins
    too, and one that is no candidate is left out where a twin is one."""
    from ..plans import Action
    from ..schedule import make_plan

    workload = graph_workload.workload
    candidates = {t.name for t in workload.saved_tensors}
    storage_of = graph_workload.storage_of_node
    if twin_of:
        saved = with_twins(saved, twin_of)
        stood_for = {twin_of.get(n, n) for n in saved if storage_of.get(n) in candidates}
        saved = {n for n in saved if storage_of.get(n) in candidates or twin_of.get(n, n) not in stood_for}
    storages = {storage_of[n] for n in saved if n in storage_of}
    others = storages - candidates
    # A constant (an op with no inputs, as scalar_tensor) is made again from nothing wherever it is not saved.
    if any(workload.ops[workload.op_index[workload.tensor_by_name[s].producer]].inputs for s in others):
        return None
    actions = {t.name: Action.KEEP if t.name in storages else Action.RECOMPUTE
               for t in workload.saved_tensors if t.producer is not None}
    return make_plan(workload, actions, policy=policy, budget_bytes=None)
