"""Carry a Plan out on a joint graph: recompute tags before partitioning, offload marks and copy-back
placement after it.

* Before partitioning every forward node gets a ``node.meta["recompute"]`` tag (the tags selective
  activation checkpointing uses): the base node of a KEEP or SWAP tensor is ``MUST_SAVE``; every other
  forward node of an activation (RECOMPUTE tensors, tensors no backward reads, and views of a SWAP
  tensor, which backward re-derives from the copy brought back) is ``MUST_RECOMPUTE``. PyTorch's
  default partitioner then saves exactly the MUST_SAVE nodes backward needs and re-runs the others in
  the backward graph, each just before its first use. Nodes that gather parameters inside the graph
  (graph_workload.py) are parameters, not activations: they keep whatever tag the model gave them.
* The plan re-runs a recompute group at the backward step that needs it and drops the group's
  transient results afterwards; PyTorch's backward graph computes a node once and keeps it until its
  last use. Where a transient node feeds groups of two different steps, it is cloned in the backward
  graph, one copy per group, so backward re-runs exactly the plan's ops.
* After partitioning, the SWAP tensors' saved nodes are marked ``saved_for_offloading`` and PyTorch's
  own pass inserts the copies (``ao.offload`` / ``ao.reload`` / ``ao.wait_tensor`` on an accelerator,
  ``prims.device_put`` on a CPU-only build, where the "copy" to the host is the tensor itself). Each
  copy back is then moved to the start of the plan's ``prefetch_step`` (its wait stays at the first
  use); on an accelerator each copy out is moved to right after the tensor is produced, as the
  simulator starts it (its wait, which frees the device memory, stays after the last forward use).
"""

from __future__ import annotations

import operator
import torch
import torch.fx as fx
from torch.utils.checkpoint import CheckpointPolicy

from ..plans import Action, Plan
from ..schedule import backward_step_of
from .graph_workload import GraphWorkload, is_backward_node, is_forward_op_node

OFFLOAD_PREFIX = "cpu_offload_"
RELOAD_PREFIX = "gpu_reload_"


def tag_joint_graph(joint: fx.GraphModule, graph_workload: GraphWorkload, plan: Plan) -> None:
    """Set every forward node's recompute tag from ``plan`` (replacing any tag the model set)."""
    storage_of = graph_workload.storage_of_node
    base = graph_workload.base_node
    actions = plan.actions
    for node in joint.graph.nodes:
        if not is_forward_op_node(node) or node.name in graph_workload.gathered_nodes:
            continue  # a gathered parameter keeps the model's tag (FSDP-style reshard after forward)
        node.meta.pop("ac_graph_id", None)  # the plan replaces any checkpointing inside the model
        node.meta.pop("should_offload", None)
        storage = storage_of.get(node.name)
        if storage is None:
            if isinstance(node.meta.get("val"), (tuple, list)):
                node.meta["recompute"] = _multi_output_tag(node, storage_of, base, actions)
            else:
                node.meta.pop("recompute", None)  # a view of a parameter: left to the partitioner
            continue
        action = actions.get(storage)
        is_base = base.get(storage) == node.name
        if action is Action.KEEP or (action is Action.SWAP and is_base):
            node.meta["recompute"] = CheckpointPolicy.MUST_SAVE
            if action is Action.SWAP:
                node.meta["should_offload"] = True
        else:
            node.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE


def _multi_output_tag(node: fx.Node, storage_of, base, actions) -> CheckpointPolicy:
    # A tuple-valued node is never saved itself; it must be re-run when one of its outputs is.
    for user in node.users:
        storage = storage_of.get(user.name)
        if storage is None:
            continue
        action = actions.get(storage)
        if not (action is Action.KEEP or (action is Action.SWAP and base.get(storage) == user.name)):
            return CheckpointPolicy.MUST_RECOMPUTE
    return CheckpointPolicy.MUST_SAVE


def backward_steps(bw: fx.GraphModule, graph_workload: GraphWorkload) -> dict[fx.Node, int]:
    """Backward step of every node of the backward graph: a backward node's step comes from its
    seq_nr (step k is the backward of op n-1-k); any other node (a re-run forward node, a getitem)
    belongs to the earliest step among its users."""
    workload = graph_workload.workload
    n = len(workload.ops)
    step: dict[fx.Node, int] = {}
    for node in reversed(list(bw.graph.nodes)):
        if node.op in ("placeholder", "output"):
            continue
        op_name = graph_workload.op_of_seq_nr.get(node.meta.get("seq_nr")) if is_backward_node(node) else None
        if op_name is not None:
            step[node] = backward_step_of(n, workload.op_index[op_name])
        else:
            user_steps = [step[u] for u in node.users if u in step]
            step[node] = min(user_steps) if user_steps else n
    return step


def split_shared_recompute(bw: fx.GraphModule, graph_workload: GraphWorkload, plan: Plan) -> int:
    """Clone re-run transient nodes that feed groups of different backward steps, one copy per step
    (the plan re-runs them per group). Returns how many copies were made."""
    storage_of = graph_workload.storage_of_node
    step = backward_steps(bw, graph_workload)
    copies = 0
    for node in reversed(list(bw.graph.nodes)):
        if node.op != "call_function" or is_backward_node(node):
            continue
        storage = storage_of.get(node.name)
        if storage is not None and plan.actions.get(storage) is not None:
            continue  # a RECOMPUTE tensor stays until its last reader, in the plan as in the graph
        by_step: dict[int, list[fx.Node]] = {}
        for user in node.users:
            by_step.setdefault(step.get(user, len(graph_workload.workload.ops)), []).append(user)
        if len(by_step) < 2:
            continue
        order = {n_: i for i, n_ in enumerate(bw.graph.nodes)}
        for s in sorted(by_step)[1:]:
            # An output the plan keeps after its group (a RECOMPUTE tensor) rides on the first run.
            users = sorted((u for u in by_step[s] if not _stays_resident(u, storage_of, plan)), key=order.__getitem__)
            if not users:
                continue
            with bw.graph.inserting_before(users[0]):
                copy = bw.graph.node_copy(node)
            for user in users:
                user.replace_input_with(node, copy)
            step[copy] = s
            copies += 1
    if copies:
        bw.graph.lint()
        bw.recompile()
    return copies


def _stays_resident(node: fx.Node, storage_of, plan: Plan) -> bool:
    return node.target is operator.getitem and plan.actions.get(storage_of.get(node.name, "")) is not None


def offload_swapped(fw: fx.GraphModule, bw: fx.GraphModule, graph_workload: GraphWorkload, plan: Plan,
                    *, use_streams: bool) -> dict[str, int]:
    """Mark the saved nodes of SWAP tensors and let PyTorch insert the copies. Returns, per
    offloaded node name, its size in bytes."""
    from torch._functorch._activation_offloading import activation_offloading as ao

    base = graph_workload.base_node
    swapped_nodes = {base[s] for s, a in plan.actions.items() if a is Action.SWAP}
    outputs = fw.graph.find_nodes(op="output")[0].args[0]
    marked: dict[str, int] = {}
    for node in outputs:
        if isinstance(node, fx.Node) and node.name in swapped_nodes:
            node.meta["saved_for_offloading"] = True
            marked[node.name] = node.meta["val"].untyped_storage().nbytes()
    if not marked:
        return marked
    if use_streams:
        ao.offload_chosen_sets_async(fw, bw)
        _issue_offloads_at_production(fw)
    else:
        ao.offload_chosen_sets(fw, bw)
    return marked


def _issue_offloads_at_production(fw: fx.GraphModule) -> None:
    for node in list(fw.graph.nodes):
        if node.op == "call_function" and node.target is torch.ops.ao.offload.default:
            source = node.args[0]
            source.append(node)  # the wait (which frees the device copy) stays after the last use
    fw.graph.lint()
    fw.recompile()


def place_reloads(bw: fx.GraphModule, graph_workload: GraphWorkload, plan: Plan) -> dict[str, int]:
    """Move each copy back to the start of its prefetch step. Returns, per swapped tensor, the index in
    the backward graph's node order where its copy back is issued."""
    step = backward_steps(bw, graph_workload)
    storage_of = graph_workload.storage_of_node
    reloads = [n for n in bw.graph.nodes if n.op == "call_function" and is_reload(n)]
    placed: dict[str, int] = {}
    for reload in reloads:
        source = reload.args[0]
        saved_name = source.name.removeprefix(OFFLOAD_PREFIX)
        storage = storage_of.get(saved_name)
        if storage is None or storage not in plan.prefetch_step:
            continue
        prefetch = issue_step(plan, storage)
        target = next((n for n in bw.graph.nodes
                       if n.op not in ("placeholder", "output") and not is_reload(n) and step.get(n, -1) >= prefetch),
                      None)
        first_use = min((u for u in reload.users), key=list(bw.graph.nodes).index, default=None)
        order = {n_: i for i, n_ in enumerate(bw.graph.nodes)}
        if target is None or (first_use is not None and order[target] > order[first_use]):
            target = first_use
        if target is not None and target is not reload:
            target.prepend(reload)
    order = {n_: i for i, n_ in enumerate(bw.graph.nodes)}
    for reload in reloads:
        storage = storage_of.get(reload.args[0].name.removeprefix(OFFLOAD_PREFIX))
        if storage is not None:
            placed[storage] = order[reload]
    bw.graph.lint()
    bw.recompile()
    return placed


def issue_step(plan: Plan, storage: str) -> int:
    """Backward step at which the copy back of ``storage`` is issued: where the simulation starts it
    (its start step in ``plan.schedule``, which slackswap.plan records), else the plan's prefetch step."""
    return plan.schedule.start_steps().get(storage, plan.prefetch_step[storage])


def is_reload(node: fx.Node) -> bool:
    if node.target is torch.ops.prims.device_put.default:
        return node.name.startswith(RELOAD_PREFIX)
    ao_reload = getattr(getattr(torch.ops, "ao", None), "reload", None)
    return ao_reload is not None and node.target is ao_reload.default


ACTIVATION = "activation"
OFFLOADED = "offloaded"
RNG_STATE = "rng_state"
PARAMETER = "parameter"
"""Kinds of saved tensors: a kept activation, an offloaded one (its host copy), the RNG state that
replays a re-run random op (PyTorch saves it as eager checkpointing does), a parameter or a view of one."""


def saved_tensor_layout(fw: fx.GraphModule, num_fwd_outputs: int,
                        graph_workload: GraphWorkload) -> list[tuple[str, int, str]]:
    """(node name, storage bytes, kind) of every tensor the forward graph saves for backward, in the
    order autograd saves them (after the model's outputs)."""
    from torch._prims.rng_prims import run_and_save_rng_state

    storage_of = graph_workload.storage_of_node
    outputs = fw.graph.find_nodes(op="output")[0].args[0]
    rows = []
    for node in outputs[num_fwd_outputs:]:
        if not isinstance(node, fx.Node) or not isinstance(node.meta.get("val"), torch.Tensor):
            continue
        name = node.name.removeprefix(OFFLOAD_PREFIX)
        size = node.meta["val"].untyped_storage().nbytes()
        if node.name.startswith(OFFLOAD_PREFIX):
            kind = OFFLOADED
        elif name in storage_of:
            kind = ACTIVATION
        elif node.target is operator.getitem and getattr(node.args[0], "target", None) is run_and_save_rng_state:
            kind = RNG_STATE
        else:
            kind = PARAMETER
        rows.append((name, size, kind))
    return rows


def graph_recompute_flops(bw: fx.GraphModule) -> float:
    """FLOPs of the forward nodes the backward graph re-runs (formula registry, as FlopCounterMode)."""
    from .graph_workload import _flops

    return sum(_flops(n) for n in bw.graph.nodes if n.op == "call_function" and not is_backward_node(n)
               and n.meta.get("partitioner_tag") == "is_forward")

