"""What rebuilding a saved tensor in backward re-runs, needs and holds, whatever else the plan does.

The simulator's recompute groups (schedule.derive_recompute_groups) rebuild a missing tensor from
the nearest tensors still on the device. Which tensors those are depends on the plan, except for
three facts that depend only on the workload and the backward step ``k`` of the rebuild (op index
``at``: backward runs op ``at``'s backward then):

- *dead* inputs: a saved tensor whose every backward reader has already run (op index above
  ``at``) has been freed whatever its action, and a transient one was never kept; a rebuild that
  reads one re-runs its producer too. So the ops re-run are the closure of the producer through
  dead inputs (``ops``) — longer than Facts.rebuild_ops, which stops at any saved tensor;
- *frontier* inputs: saved tensors the closure reads that are alive at ``at``. Those whose first
  backward use is later (op index below ``at``) are on the device only if the plan keeps them: if
  they are off (swapped and not yet back, or recomputed and not yet rebuilt) the group grows
  further, into their producers (``need_kept``);
- the group's other outputs: every re-run op allocates its saved outputs that are not present, and
  the group holds them until it ends. Dead ones are always absent (``dead_extra_bytes``); alive
  ones first used later are absent exactly when the plan takes them off (``need_kept`` again).

A plan that keeps every tensor in ``need_kept`` of each rebuild it makes re-runs exactly ``ops``
and holds ``dead_extra_bytes`` more than the rebuilt tensors while the group runs; that is what
the `optimal` MILP models (optimal.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from .common import Facts


@dataclass(frozen=True)
class Rebuild:
    at: int
    """Op index whose backward step runs the rebuild (the first backward reader)."""
    ops: tuple[int, ...]
    """Forward ops re-run, sorted."""
    need_kept: tuple[str, ...]
    """Saved tensors that must be on the device (kept) for the rebuild to re-run only ``ops``."""
    dead_extra_bytes: int
    """Saved outputs of ``ops`` already freed (every backward reader done): held during the group."""
    rebuilt: frozenset[str]
    """The tensors this rebuild is for (outputs of its producer)."""


def rebuild_of_op(facts: Facts, producer: int, at: int, rebuilt: frozenset[str]) -> Rebuild:
    """Re-running op ``producer`` before backward step of op ``at`` to restore ``rebuilt`` (its outputs)."""
    w = facts.workload
    by_name = w.tensor_by_name
    last_reader = w.last_bwd_reader
    first_reader = facts.first_bwd_read_index

    def dead(name: str) -> bool:
        t = by_name[name]
        return t.producer is not None and (not t.is_saved or last_reader[name] > at)

    seen = {producer}
    stack = [producer]
    alive_inputs: set[str] = set()
    while stack:
        i = stack.pop()
        for name in w.ops[i].inputs:
            t = by_name[name]
            if t.producer is None:
                continue
            if dead(name):
                j = w.op_index[t.producer]
                if j not in seen:
                    seen.add(j)
                    stack.append(j)
            else:
                alive_inputs.add(name)
    made = {o for i in seen for o in w.ops[i].outputs}
    # Alive inputs made outside the group must be present; those made inside are the group's own
    # outputs, checked below with the others.
    need = {name for name in alive_inputs - made if first_reader[name] < at}
    extra = 0
    for i in seen:
        for name in w.saved_outputs[i]:
            if name in rebuilt:
                continue
            if last_reader[name] > at:
                extra += facts.size[name]
            elif first_reader[name] < at:
                need.add(name)
    return Rebuild(at, tuple(sorted(seen)), tuple(sorted(need)), extra, rebuilt)


def rebuilds_of(facts: Facts, names: tuple[str, ...]) -> list[Rebuild]:
    """The rebuilds a plan that recomputes ``names`` makes: one per producer, at the first backward
    reader of its outputs among ``names``."""
    w = facts.workload
    by_producer: dict[int, list[str]] = {}
    for name in names:
        by_producer.setdefault(w.op_index[w.tensor_by_name[name].producer], []).append(name)
    return [rebuild_of_op(facts, p, max(facts.first_bwd_read_index[n] for n in outs), frozenset(outs))
            for p, outs in sorted(by_producer.items())]
