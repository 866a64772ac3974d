"""`optimal`: an exact MILP over keep / swap / recompute on a linearized cost model.

Solved with scipy's HiGHS (``scipy.optimize.milp``, the ``milp`` extra). Decisions are
coarsened (coarse_items): all saved outputs of an op share an action (re-running the op
rebuilds all of them), and the same op in consecutive blocks shares one too, with the
blocks cut into LAYER_GROUPS groups. Sizes, times and copy costs of a unit are the sums
over its members; its copies are placed at its last member's production and its first
member's first use, which is conservative for the copy constraints. The model is:

- variables: s_i (swap) and r_i (recompute) in {0, 1}, s_i + r_i <= 1 (else keep);
- memory: step inputs + sum size_i (1 - s_i - r_i) <= budget - margin, the bytes on the
  device when the forward pass ends (the keep-all peak point), where margin covers what
  backward adds back and starts at 0;
- copies out hide: in production order, for every op i,
  tau_i + sum over j made at or after i of s_j (latency + size_j / D2H) <= forward time;
- copies back hide: in order of first backward use, for every op i,
  sum over j used no later than i of s_j (latency + size_j / H2D) <= first use of i;
- objective: minimize sum r_i x rebuild time_i (the step time above ideal).

The solution is simulated. If its simulated peak is over the budget, the margin grows by
the overshoot and the MILP is solved again (at most ``ROUNDS`` times); the fastest plan
that fits is returned. Plan.info records the MILP objective, the predicted step time,
the solve time and the simulated step time.
"""

from __future__ import annotations

import time

from ..errors import require
from ..hardware import Hardware
from ..plans import Action, Plan
from ..workload import Workload
from .common import Facts, build, evaluate, facts_for, natural_peak_bytes, policy_cannot_fit, with_info
from .copies import d2h_time_s
from .selection import op_items

ROUNDS = 4
TIME_LIMIT_S = 10.0
LAYER_GROUPS = 8
"""Blocks are coarsened into this many contiguous groups: one decision per (op position in its
block, group of blocks). Measured: per-op decisions on gpt2-xl (about 1000 binaries) took
55 s to solve in HiGHS; 8 groups solve in seconds."""


def coarse_items(facts: Facts) -> list[tuple[str, ...]]:
    """Decision units: the saved outputs of the ops at the same position of every block in one group
    of consecutive blocks; ops outside the blocks (embedding, head) each decide alone."""
    from .common import block_layers

    w = facts.workload
    blocks = block_layers(w)
    per_group = max(1, -(-len(blocks) // LAYER_GROUPS))
    group_of = {layer: i // per_group for i, layer in enumerate(blocks)}
    position: dict[str, int] = {}
    seen: dict[int, int] = {}
    for op in w.ops:
        position[op.name] = seen.get(op.layer, 0)
        seen[op.layer] = position[op.name] + 1
    units: dict[tuple, list[str]] = {}
    for item in op_items(facts, facts.candidates):
        op = w.ops[w.op_index[w.tensor_by_name[item[0]].producer]]
        key = ("block", group_of[op.layer], position[op.name]) if op.layer in group_of else ("op", op.name)
        units.setdefault(key, []).extend(item)
    return [tuple(v) for v in units.values()]


def _solve(facts: Facts, hardware: Hardware, items: list[tuple[str, ...]], limit_bytes: int):
    """Solve the MILP for a memory limit at the end of the forward pass; (actions, objective) or None."""
    np = require("numpy", "milp", "the optimal planner")
    optimize = require("scipy.optimize", "milp", "the optimal planner")
    sparse = require("scipy.sparse", "milp", "the optimal planner")
    n = len(items)
    size = np.array([sum(facts.size[t] for t in it) for it in items], dtype=float)
    cost = np.array([facts.recompute_time_s(it) for it in items])
    made = np.array([max(facts.produced_at_s[t] for t in it) for it in items])
    first_use = np.array([min(facts.first_use_s[t] for t in it) for it in items])
    out_s = np.array([sum(d2h_time_s(hardware, facts.size[t]) for t in it) for it in items])
    back_s = np.array([sum(hardware.copy_latency_s + facts.size[t] / hardware.h2d_bytes_per_s for t in it)
                       for it in items])
    rows, cols, vals, lower, upper = [], [], [], [], []
    row = 0

    def add_row(entries, lo, hi):
        nonlocal row
        for col, val in entries:
            rows.append(row)
            cols.append(col)
            vals.append(val)
        lower.append(lo)
        upper.append(hi)
        row += 1

    for i in range(n):  # s_i + r_i <= 1
        add_row([(i, 1.0), (n + i, 1.0)], -np.inf, 1.0)
    # memory: sum size_i (s_i + r_i) >= inputs + total - limit
    need = facts.input_bytes + float(size.sum()) - limit_bytes
    add_row([(i, size[i]) for i in range(n)] + [(n + i, size[i]) for i in range(n)], need, np.inf)
    by_made = sorted(range(n), key=lambda i: (made[i], i))
    for pos, i in enumerate(by_made):  # copies out of everything made from op i on end in time
        later = by_made[pos:]
        add_row([(j, out_s[j]) for j in later], -np.inf, facts.forward_time_s - made[i])
    by_use = sorted(range(n), key=lambda i: (first_use[i], i))
    for pos, i in enumerate(by_use):  # copies back of everything used up to op i land in time
        earlier = by_use[: pos + 1]
        add_row([(j, back_s[j]) for j in earlier], -np.inf, first_use[i])
    matrix = sparse.csr_array((vals, (rows, cols)), shape=(row, 2 * n))
    objective = np.concatenate([np.zeros(n), cost])
    result = optimize.milp(
        objective, constraints=[optimize.LinearConstraint(matrix, lower, upper)],
        integrality=np.ones(2 * n), bounds=optimize.Bounds(0, 1),
        options={"time_limit": TIME_LIMIT_S, "mip_rel_gap": 1e-6},
    )
    if result.x is None:
        return None
    actions: dict[str, Action] = {}
    for i, it in enumerate(items):
        action = Action.SWAP if result.x[i] > 0.5 else Action.RECOMPUTE if result.x[n + i] > 0.5 else None
        if action is not None:
            actions.update({t: action for t in it})
    return actions, float(result.fun), bool(result.status == 0)


def plan_optimal(workload: Workload, hardware: Hardware, budget_bytes: int) -> Plan:
    facts = facts_for(workload)
    items = coarse_items(facts)
    margin = 0
    best = None
    total_solve_s = 0.0
    rounds = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        solved = _solve(facts, hardware, items, budget_bytes - margin)
        total_solve_s += time.perf_counter() - started
        if solved is None:
            break
        actions, objective_s, proven = solved
        plan = build(workload, hardware, actions, "optimal", budget_bytes)
        peak = natural_peak_bytes(workload, hardware, plan)
        cand = evaluate(workload, hardware, plan, budget_bytes)
        rounds.append({"margin_bytes": margin, "objective_s": objective_s, "peak_bytes": peak,
                       "simulated_step_time_s": cand.step_time_s if cand.fits else None})
        if cand.fits and (best is None or cand.step_time_s < best[0].step_time_s):
            best = (cand, objective_s, proven)
        if peak <= budget_bytes:
            break
        margin += peak - budget_bytes
    if best is None:
        plan = build(workload, hardware, {n: Action.RECOMPUTE for n in facts.candidates}, "optimal", budget_bytes)
        raise policy_cannot_fit("optimal", budget_bytes, natural_peak_bytes(workload, hardware, plan),
                                "raise the budget")
    cand, objective_s, proven = best
    return with_info(
        cand.plan, rule=f"MILP over keep/swap/recompute, {len(items)} decision units (HiGHS)",
        milp_objective_s=objective_s, milp_predicted_step_time_s=workload.ideal_step_time_s + objective_s,
        milp_solve_time_s=total_solve_s, milp_proven_optimal=proven, milp_decisions=2 * len(items),
        milp_rounds=rounds, simulated_step_time_s=cand.step_time_s,
    )
