"""`full-recompute`: checkpoint every block, as Hugging Face gradient checkpointing does.

Each block keeps only the tensors that leave it (its output, which is the next block's
input) and recomputes everything it saves inside from there during backward. Ops
outside the blocks (embedding, head, loss) keep their tensors. The plan does not depend
on the budget; if it does not fit, the policy cannot reach that budget.

Checkpointing re-runs a block's forward, so it also re-runs the producer of a tensor an op reads
only for its shape (the projection before a dropout's ``empty_like``, Op.shape_inputs), which no
recompute group needs: the plan says so with a recompute region per such op and producer
(:func:`shape_input_regions`), so it re-runs what checkpointing re-runs and the runtime can run it
with plain checkpoint.
"""

from __future__ import annotations

from ..hardware import Hardware
from ..plans import Action, Plan
from ..workload import Workload
from .common import block_layers, build, facts_for, finish


def block_recompute_actions(workload: Workload, layers: set[int]) -> dict[str, Action]:
    """RECOMPUTE for every tensor made inside one of ``layers`` and read only inside it in forward."""
    w = workload
    layer_of = {op.name: op.layer for op in w.ops}
    readers: dict[str, set[int]] = {}
    for op in w.ops:
        for name in op.inputs:
            readers.setdefault(name, set()).add(op.layer)
    actions: dict[str, Action] = {}
    for name in facts_for(w).candidates:
        layer = layer_of[w.tensor_by_name[name].producer]
        if layer in layers and readers.get(name, set()) <= {layer}:
            actions[name] = Action.RECOMPUTE
    return actions


def shape_input_regions(workload: Workload) -> tuple[tuple[str, str], ...]:
    """(producer, op) for each op's shape input made by an op: re-running the op re-runs the producer,
    as a checkpointed function does (a group that re-runs neither is unchanged)."""
    by_name = workload.tensor_by_name
    return tuple((by_name[name].producer, op.name) for op in workload.ops for name in op.shape_inputs
                 if by_name[name].producer is not None)


def plan_full_recompute(workload: Workload, hardware: Hardware, budget_bytes: int) -> Plan:
    layers = block_layers(workload)
    actions = block_recompute_actions(workload, set(layers))
    plan = build(workload, hardware, actions, "full-recompute", budget_bytes,
                 info={"rule": "checkpoint every block", "blocks": len(layers)},
                 recompute_regions=shape_input_regions(workload))
    return finish(workload, hardware, plan, budget_bytes, "use a larger budget or a policy that swaps")
