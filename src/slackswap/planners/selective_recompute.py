"""`selective-recompute`: Megatron-LM's selective activation recompute (Korthikanti et al.).

Recompute the core of attention (the tensors made and read only inside it: the softmax
probabilities, dropout mask and dropped probabilities with eager attention; the
log-sum-exp with flash attention), keep its inputs Q, K, V and its output. Core-attention
ops are those of kind 'attention' or 'bmm', and every op that reads only their outputs
(the elementwise softmax and dropout between the two batched matmuls). If that is not enough, do what
Megatron's ``--recompute-method block --recompute-num-layers N`` does: fully recompute
the first N blocks too, with the smallest N that fits.
"""

from __future__ import annotations

from ..hardware import Hardware
from ..plans import Action, Plan
from ..workload import Workload
from .common import (block_layers, build, evaluate, facts_for, fewest_that_fit, natural_peak_bytes,
                     policy_cannot_fit)
from .full_recompute import block_recompute_actions

CORE_KINDS = ("attention", "bmm")


def core_attention_actions(workload: Workload) -> dict[str, Action]:
    w = workload
    by_name = w.tensor_by_name
    core: set[str] = set()
    for op in w.ops:
        made_by_core = op.inputs and all(by_name[i].producer in core for i in op.inputs)
        if op.kind in CORE_KINDS or (op.kind == "elementwise" and made_by_core):
            core.add(op.name)
    actions = {}
    for name in facts_for(w).candidates:
        t = by_name[name]
        if t.producer in core and all(r in core for r in t.bwd_readers):
            actions[name] = Action.RECOMPUTE
    return actions


def plan_selective_recompute(workload: Workload, hardware: Hardware, budget_bytes: int) -> Plan:
    base = core_attention_actions(workload)
    layers = block_layers(workload)

    def plan_with(n_blocks: int) -> Plan:
        actions = dict(base)
        actions.update(block_recompute_actions(workload, set(layers[:n_blocks])))
        return build(workload, hardware, actions, "selective-recompute", budget_bytes,
                     info={"rule": "recompute core attention, then whole blocks", "full_blocks": n_blocks})

    # Binary search for the fewest fully recomputed blocks that fit (more blocks, less memory).
    if not evaluate(workload, hardware, plan_with(len(layers)), budget_bytes).fits:
        plan = plan_with(len(layers))
        raise policy_cannot_fit("selective-recompute", budget_bytes, natural_peak_bytes(workload, hardware, plan),
                                "use a larger budget or a policy that swaps")
    return fewest_that_fit(workload, hardware, budget_bytes, plan_with, len(layers))
