"""`selective-recompute`: Megatron-LM's selective activation recompute (Korthikanti et al.).

Recompute the core of attention (the tensors made and read only inside it: the softmax
probabilities, dropout mask and dropped probabilities with eager attention; the
log-sum-exp with flash attention), keep its inputs Q, K, V and its output. Core-attention
ops are those of kind 'attention' or 'bmm', and every op that reads only their outputs
(the elementwise softmax and dropout between the two batched matmuls). If that is not enough, do what
Megatron's ``--recompute-method block --recompute-num-layers N`` does: fully recompute
the first N blocks too, with the smallest N that fits.

Megatron checkpoints the core attention as one function, so its recompute re-runs all of it,
the product with V included, although only the tensors before it are dropped: each eager core
is a recompute region of the plan (Plan.recompute_regions), and the simulator charges that
product's forward time too. A flash-attention core is one op, so it needs no region.
"""

from __future__ import annotations

from ..hardware import Hardware
from ..plans import Action, Plan
from ..workload import Workload
from .common import (block_layers, build, evaluate, facts_for, fewest_that_fit, natural_peak_bytes,
                     policy_cannot_fit)
from .full_recompute import block_recompute_actions
from .selection import remembered_plan

CORE_KINDS = ("attention", "bmm")


def core_attention_ops(workload: Workload) -> set[str]:
    by_name = workload.tensor_by_name
    core: set[str] = set()
    for op in workload.ops:
        made_by_core = op.inputs and all(by_name[i].producer in core for i in op.inputs)
        if op.kind in CORE_KINDS or (op.kind == "elementwise" and made_by_core):
            core.add(op.name)
    return core


def core_attention_regions(workload: Workload) -> tuple[tuple[str, ...], ...]:
    """Each eager attention core (the core ops joined by tensors one makes and another reads, with
    two batched matmuls: QK^T and P.V), its ops in execution order: what one Megatron checkpoint
    call re-runs. A fused attention op re-runs whole anyway, so it gets no region."""
    core = core_attention_ops(workload)
    by_name = workload.tensor_by_name
    root: dict[str, str] = {}

    def find(name: str) -> str:
        while root.get(name, name) != name:
            name = root[name]
        return name

    for op in workload.ops:
        if op.name in core:
            for i in op.inputs:
                producer = by_name[i].producer
                if producer in core:
                    root[find(op.name)] = find(producer)
    members: dict[str, list[str]] = {}
    for op in workload.ops:  # execution order
        if op.name in core:
            members.setdefault(find(op.name), []).append(op.name)
    kinds = {op.name: op.kind for op in workload.ops}
    return tuple(tuple(ops) for ops in members.values() if sum(kinds[o] in CORE_KINDS for o in ops) >= 2)


def core_attention_actions(workload: Workload) -> dict[str, Action]:
    w = workload
    by_name = w.tensor_by_name
    core = core_attention_ops(w)
    actions = {}
    for name in facts_for(w).candidates:
        t = by_name[name]
        if t.producer in core and all(r in core for r in t.bwd_readers):
            actions[name] = Action.RECOMPUTE
    return actions


def plan_selective_recompute(workload: Workload, hardware: Hardware, budget_bytes: int) -> Plan:
    """The plan, remembered per workload, link and budget: `slackswap` asks for it twice in one
    call (recompute-optimal's layer-wise candidates, and rule 6's starts)."""
    return remembered_plan("selective-recompute", selective_plan, workload, hardware, budget_bytes)


def selective_plan(workload: Workload, hardware: Hardware, budget_bytes: int) -> Plan:
    base = core_attention_actions(workload)
    regions = core_attention_regions(workload)
    layers = block_layers(workload)

    def plan_with(n_blocks: int) -> Plan:
        actions = dict(base)
        actions.update(block_recompute_actions(workload, set(layers[:n_blocks])))
        return build(workload, hardware, actions, "selective-recompute", budget_bytes,
                     info={"rule": "recompute core attention, then whole blocks", "full_blocks": n_blocks},
                     recompute_regions=regions)

    # Binary search for the fewest fully recomputed blocks that fit (more blocks, less memory).
    if not evaluate(workload, hardware, plan_with(len(layers)), budget_bytes).fits:
        plan = plan_with(len(layers))
        raise policy_cannot_fit("selective-recompute", budget_bytes, natural_peak_bytes(workload, hardware, plan),
                                "use a larger budget or a policy that swaps")
    return fewest_that_fit(workload, hardware, budget_bytes, plan_with, len(layers))
