"""A Workload read off AOTAutograd's joint forward+backward graph, so plan actions map onto graph nodes.

* **Ops** are the joint graph's forward ``call_function`` nodes in graph order, except the
  ``getitem`` nodes that unpack a multi-output op (their tensors are outputs of that op). An op is
  named after its node.
* **Tensors** are *storages*, told apart by the fake tensors in ``node.meta["val"]``: a view, a
  transpose or a split output shares its base's fake storage, so it is the same tensor. A tensor is
  named after the first node that produced its storage (its *base node*). Parameters and buffers
  (the graph's static-lifetime inputs) are not activations and are left out; the other graph inputs
  (the batch) are step inputs. Parameters a graph gathers itself (a collective of parameter shards,
  as a traced FSDP or DTensor all-gather, and the ops that compute only from gathered results, such
  as its wait and copy-out) are parameters too: they are named in ``gathered_nodes`` and left out.
* **bwd_readers**: a backward node reads the storages of its forward inputs. AOTAutograd gives every
  backward node the ``seq_nr`` of the forward op whose derivative formula made it; the reader is the
  last forward op with that ``seq_nr`` (a backward node without one is attributed to the latest
  producer among the storages it reads, which makes it read them no later than it really does).
* **Layers** come from each node's module path (``h.3.attn`` is in block 3). On an FSDP2 model each
  fully_shard unit compiles alone, and a graph with no node in a numbered block is one block, layer 0.
* **Times** are roofline estimates on the chosen hardware from each node's FLOPs
  (``torch.utils.flop_counter``'s formula registry, the one ``FlopCounterMode`` uses) and the bytes of
  its tensor arguments and results; backward = 2x forward for ops with a backward, as the profiler does.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.fx as fx
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.flop_counter import flop_registry

from ..hardware import Hardware
from ..profiler.build import BACKWARD_TO_FORWARD, call_layer, op_kind, roofline_time_s
from ..workload import Op, Tensor, Workload
from .joint_nodes import is_backward_node, is_forward_op_node
from .min_cut import cut_sources

_VIEW_KIND = "view"


@dataclass(frozen=True)
class GraphWorkload:
    """The workload of one joint graph and how its names map back onto the graph's nodes."""

    workload: Workload
    storage_of_node: Mapping[str, str]
    """Forward node (or graph input) name -> the workload tensor (storage) it holds; absent for parameters."""
    base_node: Mapping[str, str]
    """Workload tensor -> the node that first produced it."""
    op_of_seq_nr: Mapping[int, str]
    """AOTAutograd seq_nr -> workload op whose backward carries it."""
    end_source: str
    """Source line ('File "...", line N, in f') of the graph's last forward op that records one."""
    gathered_nodes: frozenset[str] = frozenset()
    """Forward nodes that gather parameters (collectives of parameter shards and what computes only from them)."""


def tag_untagged_backward(graph: fx.Graph) -> None:
    """Tag ``is_backward`` the nodes a backend's joint-graph passes added without a partitioner tag
    (inductor's pattern rewrites do) when they compute from backward values or feed only backward nodes."""
    untagged = [n for n in graph.nodes if n.op == "call_function" and "partitioner_tag" not in n.meta]
    for node in untagged:
        if any(is_backward_node(a) for a in node.all_input_nodes):
            node.meta["partitioner_tag"] = "is_backward"
    for node in reversed(untagged):
        if "partitioner_tag" not in node.meta and node.users and all(is_backward_node(u) for u in node.users):
            node.meta["partitioner_tag"] = "is_backward"


_COLLECTIVE_NAMESPACES = ("_c10d_functional", "c10d_functional")


def _is_collective(node: fx.Node) -> bool:
    return getattr(node.target, "namespace", None) in _COLLECTIVE_NAMESPACES


def _fake_storage(value: Any):
    if isinstance(value, torch.Tensor):
        return StorageWeakRef(value.untyped_storage())
    return None


def _flops(node: fx.Node) -> float:
    packet = getattr(node.target, "overloadpacket", None)
    formula = flop_registry.get(packet)
    if formula is None:
        return 0.0
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))
    try:
        return float(formula(*args, **kwargs, out_val=node.meta.get("val")))
    except Exception:  # a formula that does not accept these (fake) arguments: no FLOPs known
        return 0.0


def _tensor_bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def _layer(node: fx.Node) -> int | None:
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    path = list(stack.values())[-1][0]
    return call_layer(path.replace("L['self'].", "").replace("['", ".").replace("']", ""))


def build_graph_workload(joint: fx.GraphModule, static_input_indices, hardware: Hardware, *,
                         name: str, unit_graphs: bool = False, cut: frozenset[str] | None = None) -> GraphWorkload:
    """The Workload of ``joint`` (AOTAutograd's joint graph) with roofline times on ``hardware``.
    ``unit_graphs``: the model is FSDP2-sharded, so a graph without numbered blocks is one unit.
    ``cut``: forward nodes backward reads from instead of what autograd's formulas read (min_cut.py):
    each backward node reads the cut nodes its forward inputs are computed from, and re-runs the
    forward ops in between (their time is added to its op's backward time)."""
    graph = joint.graph
    tag_untagged_backward(graph)
    static = set(static_input_indices or ())
    storage_name: dict[Any, str] = {}      # fake storage -> workload tensor name
    storage_of_node: dict[str, str] = {}
    parameter_storages: set[Any] = set()
    sizes: dict[str, int] = {}
    producer: dict[str, str | None] = {}
    step_inputs: list[str] = []
    primal_index = 0
    for node in graph.find_nodes(op="placeholder"):
        if is_backward_node(node):
            continue
        key = _fake_storage(node.meta.get("val"))
        if key is None:
            primal_index += 1
            continue
        if primal_index in static:
            parameter_storages.add(key)
        elif key not in storage_name:
            storage_name[key] = node.name
            sizes[node.name] = node.meta["val"].untyped_storage().nbytes()
            producer[node.name] = None
            step_inputs.append(node.name)
        if key in storage_name:
            storage_of_node[node.name] = storage_name[key]
        primal_index += 1

    forward = [n for n in graph.nodes if is_forward_op_node(n)]
    gathered = _gathered_parameters(forward, parameter_storages)
    forward = [n for n in forward if n.name not in gathered]
    op_nodes = [n for n in forward if n.target is not operator.getitem]
    op_index = {n.name: i for i, n in enumerate(op_nodes)}
    outputs: dict[str, list[str]] = {n.name: [] for n in op_nodes}
    inputs: dict[str, list[str]] = {n.name: [] for n in op_nodes}
    base_node: dict[str, str] = {name_: name_ for name_ in step_inputs}
    owner_op: dict[str, str] = {}
    for node in forward:
        owner = node.args[0].name if node.target is operator.getitem else node.name
        owner_op[node.name] = owner
        key = _fake_storage(node.meta.get("val"))
        if key is None or key in parameter_storages:
            continue
        if key not in storage_name:
            storage_name[key] = node.name
            sizes[node.name] = node.meta["val"].untyped_storage().nbytes()
            producer[node.name] = owner
            base_node[node.name] = node.name
            outputs[owner].append(node.name)
        storage_of_node[node.name] = storage_name[key]
    for node in op_nodes:
        for arg in node.all_input_nodes:
            storage = storage_of_node.get(arg.name)
            if storage is not None and storage not in inputs[node.name] and storage not in outputs[node.name]:
                inputs[node.name].append(storage)

    op_of_seq_nr: dict[int, str] = {}
    for node in op_nodes:
        if "seq_nr" in node.meta:
            op_of_seq_nr[node.meta["seq_nr"]] = node.name
    readers: dict[str, list[str]] = {}
    has_backward: set[str] = set()
    rerun_in_backward: dict[str, set[str]] = {}  # reader op -> forward ops its backward re-runs (cut only)
    sources = None if cut is None else cut_sources(
        [n for n in graph.nodes if n.op == "placeholder" and not is_backward_node(n)] + forward, cut)
    for node in graph.nodes:
        if node.op != "call_function" or not is_backward_node(node):
            continue
        forward_inputs = [a.name for a in node.all_input_nodes if not is_backward_node(a)]
        between: set[str] = set()
        if sources is not None:
            forward_inputs, between = _through_cut(forward_inputs, sources)
        read = list(dict.fromkeys(storage_of_node[a] for a in forward_inputs if a in storage_of_node))
        reader = op_of_seq_nr.get(node.meta.get("seq_nr"))
        if reader is None:
            produced = [op_index[producer[s]] for s in read if producer[s] is not None]
            if not produced:
                continue
            reader = op_nodes[max(produced)].name
        has_backward.add(reader)
        rerun_in_backward.setdefault(reader, set()).update(b for b in between if b in op_index)
        for storage in read:
            _record_read(storage, reader, producer, op_index, inputs, outputs, readers)
    if sources is not None:
        _read_cut_sources(forward, cut, sources, storage_of_node, producer, op_index, inputs, outputs, readers)

    layers = [_layer(n) for n in op_nodes]
    if unit_graphs and not any(l is not None for l in layers):
        # An FSDP2 model's graph with no op inside a numbered block is one fully_shard unit's forward:
        # one block, which layer-wise policies such as full-recompute checkpoint whole.
        layers = [0] * len(op_nodes)
    known = [l for l in layers if l is not None]
    last_layer = max(known) + 1 if known else 0
    first_layered = next((i for i, l in enumerate(layers) if l is not None), len(op_nodes))
    ops = []
    fwd_time_s: dict[str, float] = {}
    for i, node in enumerate(op_nodes):
        aten = getattr(getattr(node.target, "overloadpacket", None), "__name__", str(node.target))
        kind = op_kind(aten, not outputs[node.name])  # no new storage: a view (or a view of a parameter)
        flops = _flops(node)
        traffic = 0.0 if kind == _VIEW_KIND else float(
            _tensor_bytes(node.meta.get("val"))
            + sum(_tensor_bytes(a.meta.get("val")) for a in node.all_input_nodes))
        fwd = roofline_time_s(hardware, kind, flops, traffic)
        fwd_time_s[node.name] = fwd
        layer = layers[i] if layers[i] is not None else (-1 if i < first_layered else last_layer)
        ops.append(Op(
            name=node.name, layer=layer, kind=kind, fwd_time_s=fwd,
            bwd_time_s=BACKWARD_TO_FORWARD * fwd if node.name in has_backward else 0.0,  # re-runs added below
            flops=flops, bytes_accessed=traffic, inputs=tuple(inputs[node.name]),
            outputs=tuple(outputs[node.name]),
        ))
    if rerun_in_backward:
        ops = [dataclasses.replace(op, bwd_time_s=op.bwd_time_s + math.fsum(
            fwd_time_s[o] for o in sorted(rerun_in_backward.get(op.name, ()), key=op_index.__getitem__)))
               for op in ops]
    order = {n.name: i for i, n in enumerate(op_nodes)}
    tensors = [
        Tensor(name=s, size_bytes=sizes[s], producer=producer[s],
               bwd_readers=tuple(sorted(readers.get(s, ()), key=order.__getitem__)))
        for s in step_inputs
    ]
    for node in op_nodes:
        for s in outputs[node.name]:
            tensors.append(Tensor(name=s, size_bytes=sizes[s], producer=producer[s],
                                  bwd_readers=tuple(sorted(readers.get(s, ()), key=order.__getitem__))))
    workload = Workload(
        name=name, ops=tuple(ops), tensors=tuple(tensors),
        meta={"source": "slackswap.compiled", "times": f"roofline on {hardware.name}",
              "saved_set": "autograd" if cut is None else "min-cut"},
    )
    return GraphWorkload(workload=workload, storage_of_node=storage_of_node, base_node=base_node,
                         op_of_seq_nr=op_of_seq_nr, end_source=_end_source(op_nodes), gathered_nodes=frozenset(gathered))


def _record_read(storage, reader, producer, op_index, inputs, outputs, readers) -> None:
    made_by = producer[storage]
    op_name = reader
    if made_by is not None and op_index[made_by] > op_index[reader]:
        op_name = made_by  # read no earlier than the op that made it
    if storage not in inputs[op_name] and storage not in outputs[op_name]:
        inputs[op_name].append(storage)
    bucket = readers.setdefault(storage, [])
    if op_name not in bucket:
        bucket.append(op_name)


def _read_cut_sources(forward, cut, sources, storage_of_node, producer, op_index, inputs, outputs, readers) -> None:
    """A cut node no backward node reads (a softmax's row max and sum, where the cut also holds the
    softmax output: PyTorch's plan at a low budget saves them to rebuild that output) is read where the
    cut nodes computed from it are: keeping it lets their rebuild stop there, as in that plan."""
    read_by_backward = set(readers)
    for node in reversed(forward):
        storage = storage_of_node.get(node.name)
        if node.name not in cut or storage is None or storage not in readers:
            continue
        for arg in node.all_input_nodes:
            got = sources.get(arg.name)
            for source in (() if got is None else got[0]):
                source_storage = storage_of_node.get(source)
                if source not in cut or source_storage is None or source_storage in read_by_backward \
                        or producer.get(source_storage) is None:
                    continue
                for reader in list(readers[storage]):
                    _record_read(source_storage, reader, producer, op_index, inputs, outputs, readers)


def _through_cut(forward_inputs: list[str], sources) -> tuple[list[str], set[str]]:
    """The cut nodes (and graph inputs) ``forward_inputs`` are computed from, and the forward nodes in between."""
    read: list[str] = []
    between: set[str] = set()
    for name in forward_inputs:
        got = sources.get(name)
        if got is None:
            read.append(name)
            continue
        read.extend(sorted(got[0]))
        between |= got[1]
    return read, between


def _gathered_parameters(forward: list[fx.Node], parameter_storages: set) -> set[str]:
    """Names of the forward nodes that gather parameters; their storages join ``parameter_storages``.

    A node is gathered when it is a collective whose tensor inputs are all parameters or gathered,
    or any op whose tensor inputs are all gathered (the collective's wait, a copy-out of the
    gathered buffer, a getitem of either). A parameter used in a computation without a collective
    (``weight * 2``) is not gathered: its result is an activation, as without FSDP."""
    gathered: set[str] = set()
    gathered_storages: set = set()
    for node in forward:
        sources = [a for a in node.all_input_nodes if isinstance(a.meta.get("val"), (torch.Tensor, tuple, list))]
        if not sources:
            continue
        storages = [_fake_storage(a.meta.get("val")) for a in sources]
        from_gathered = all(a.name in gathered for a in sources)
        from_parameters = all(a.name in gathered or k in parameter_storages for a, k in zip(sources, storages))
        if from_gathered or (_is_collective(node) and from_parameters):
            gathered.add(node.name)
            key = _fake_storage(node.meta.get("val"))
            if key is not None:
                gathered_storages.add(key)
    parameter_storages |= gathered_storages
    return gathered


def _end_source(op_nodes: list[fx.Node]) -> str:
    for node in reversed(op_nodes):
        lines = [line.strip() for line in str(node.meta.get("stack_trace") or "").splitlines()
                 if line.strip().startswith("File")]
        if lines:
            return lines[-1]
    return ""
