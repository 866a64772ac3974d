"""`optimal`: an exact MILP over keep / swap / recompute on a linearized cost model.

Solved with scipy's HiGHS (``scipy.optimize.milp``, the ``milp`` extra), then simulated.
Decision units (``decision_units``): the saved outputs of one op share an action
(re-running the op rebuilds all of them); the same op position in consecutive blocks
shares one when blocks are grouped (``layer_groups``; None: every op decides alone).
The model, with x_u = s_u + r_u the unit's "off the device" indicator:

- s_u (swap), r_u (recompute) binary, s_u + r_u <= 1 (else keep);
- y_o in [0, 1] per forward op o, y_o >= r_u for every op o that rebuilding u re-runs
  (its producer and every producer of a transient input, common.Facts.rebuild_ops), so
  two units sharing a producer pay for it once, as a recompute group does;
- memory at every backward step i (op i's backward, before it frees anything): step
  inputs + every unit whose last backward reader is at or before i, minus the units
  that are off (swapped or recomputed) and whose first backward use is after step i
  (not yet back), <= budget - margin. Step i = n is the end of the forward pass, where
  every unit that is off has left (the keep-all peak point);
- copies out hide: FIFO in production order, each copy (latency + bytes / D2H) starts
  no earlier than its unit is made, and all end before the forward pass does, so they
  never overlap copies back (no duplex slowdown) and have freed their bytes at the peak:
  for every unit u, made_u + sum over swapped v made at or after u of out_v <= forward time;
- copies back land in time: in order of first use from the start of backward at the
  full H2D rate: for every unit u, sum over swapped v used no later than u of back_v
  <= time of u's first use (both from the end of the forward pass);
- rebuilds as the simulator groups them (rebuilds.py): a tensor a rebuild needs that is first
  used later is on the device if kept; if recomputed too it is rebuilt in the same group (a
  chain, ``_chains``); if swapped, it is copied back before the group (``_early_copies``);
- objective: minimize sum_o y_o x fwd_time_o, the recompute added to the ideal step.

The running sums are auxiliary continuous variables, so the constraint matrix stays
sparse (linear in the number of units). HiGHS runs with a node limit (deterministic, unlike a
time limit) and a relative gap;
its dual bound is a proven lower bound on the objective of this linear model.

The solution is simulated. If its simulated peak is over the budget, the margin grows by
the overshoot and the MILP is solved again (at most ``ROUNDS`` times); the fastest plan
that fits is returned. docs/planners.md explains why the simulated step can differ from
the MILP's prediction.
"""

from __future__ import annotations

import bisect
import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from ..errors import BudgetError, require
from ..hardware import Hardware
from ..plans import Action, Plan
from ..units import format_bytes
from ..workload import Workload, backward_step_of
from .common import (Candidate, Facts, block_layers, build, evaluate, facts_for, natural_peak_bytes,
                     policy_cannot_fit, with_info)
from .rebuilds import Rebuild, rebuild_of_op, rebuilds_of
from .selection import op_items

ROUNDS = 4
NODE_LIMIT = 2000
"""Branch-and-bound nodes per solve. A node limit, not a time limit: HiGHS's search is
deterministic for given options (its MIP solver runs on one thread), so stopping after a fixed
number of nodes gives the same incumbent on every run and every machine, where a time limit
stops wherever a loaded machine happens to be (docs/planners.md, "optimal", has the measured
case and the solve times); when it binds the plan carries the incumbent, its gap and the dual
bound."""
MIP_REL_GAP = 1e-4
MAX_UNITS = 400
"""Decision units above which blocks are grouped (``layer_groups``): per-op decisions on the
three built-in models are 200-390 units and solve in seconds with the sparse formulation."""


def decision_units(facts: Facts, layer_groups: int | None = None) -> list[tuple[str, ...]]:
    """Decision units: the saved outputs of one op, or, with ``layer_groups``, of the ops at the same
    position of every block in one of that many groups of consecutive blocks (ops outside the
    blocks, the embedding and head, always decide alone)."""
    w = facts.workload
    items = op_items(facts, facts.candidates)
    if layer_groups is None:
        return items
    blocks = block_layers(w)
    per_group = max(1, -(-len(blocks) // layer_groups))
    group_of = {layer: i // per_group for i, layer in enumerate(blocks)}
    position: dict[str, int] = {}
    seen: dict[int, int] = {}
    for op in w.ops:
        position[op.name] = seen.get(op.layer, 0)
        seen[op.layer] = position[op.name] + 1
    units: dict[tuple, list[str]] = {}
    for item in items:
        op = w.ops[w.op_index[w.tensor_by_name[item[0]].producer]]
        key = ("block", group_of[op.layer], position[op.name]) if op.layer in group_of else ("op", op.name)
        units.setdefault(key, []).extend(item)
    return [tuple(v) for v in units.values()]


def choose_units(facts: Facts) -> tuple[list[tuple[str, ...]], str]:
    """Per-op units when there are at most MAX_UNITS of them, else the fewest block groups that
    keeps the count under it."""
    units = decision_units(facts)
    if len(units) <= MAX_UNITS:
        return units, "one unit per op"
    groups = len(block_layers(facts.workload))
    while groups > 1:
        groups = max(1, groups // 2)
        units = decision_units(facts, groups)
        if len(units) <= MAX_UNITS:
            break
    return units, f"ops at one block position share a unit across {groups} groups of blocks"


class _Rows:
    """Sparse constraint rows for scipy.optimize.milp."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.vals: list[float] = []
        self.lower: list[float] = []
        self.upper: list[float] = []
        self.family: list[str] = []
        self.current = ""  # the family rows added now belong to (_assess names the rows a plan breaks)

    def add(self, entries, lo: float, hi: float) -> None:
        r = len(self.lower)
        self.family.append(self.current)
        for col, val in entries:
            if val != 0.0:
                self.rows.append(r)
                self.cols.append(col)
                self.vals.append(val)
        self.lower.append(lo)
        self.upper.append(hi)


CHAIN_DEPTH = 4
"""Units a chain may pass through beyond its root (below), on workloads of at most
CHAIN_DEPTH_UNITS decision units; deeper chains are forbidden, not modelled: the plan keeps
something within this many links of every rebuild. On the 2-layer profiled models (38-51 units)
depth 2 lost the plans at 30 % of the peak that depth 4 finds. Above CHAIN_DEPTH_UNITS chains are
not modelled at all (as before they were): the built-in models (200-388 units) save their blocks'
inputs, so their chains are short, and modelling them made each branch-and-bound node several
times slower (gpt2-xl at 50 %: 2.9 s of CPU for 50 nodes with depth 1)."""
CHAIN_DEPTH_UNITS = 150


def _chains(facts: Facts, rebuilds: list[list[Rebuild]], unit_of: dict[str, int], depth: int
            ) -> tuple[list[tuple[tuple[int, ...], Rebuild]], list[tuple[tuple[int, ...], int]]]:
    """Chains: a rebuild of unit u that needs a tensor of unit v first used later (rebuilds.py),
    while v is recomputed too, rebuilds v in u's group: v's bytes arrive at u's step, not at v's
    own, and v's rebuild there needs what it needs at that step, and so on. Each chain is a path
    u, v1, ..., vk of units and the rebuild of vk's producer at u's step; its variable
    z >= r_u + r_v1 + ... + r_vk - k is 1 when every unit on the path is recomputed (continuous:
    every row it enters only tightens, so a solution may take it at that bound). Returns the
    chains, breadth first, and the extensions past ``depth`` units (path, unit): not allowed."""
    w = facts.workload
    found: list[tuple[tuple[int, ...], Rebuild]] = []
    too_deep: list[tuple[tuple[int, ...], int]] = []
    if depth == 0:
        return found, too_deep  # chains not modelled: the simulation and the margin catch them
    for u, per_unit in enumerate(rebuilds):
        for root in per_unit:
            level = [((u,), root)]
            while level:
                following = []
                for path, rebuild in level:
                    needed: dict[int, int] = {}  # producer op index -> its unit
                    for t in rebuild.need_kept:
                        if unit_of[t] not in path:
                            needed[w.op_index[w.tensor_by_name[t].producer]] = unit_of[t]
                    for producer, v in sorted(needed.items()):
                        if len(path) > depth:
                            too_deep.append((path, v))
                            continue
                        outs = frozenset(t for t in w.saved_outputs[producer] if unit_of.get(t) == v)
                        chained = rebuild_of_op(facts, producer, root.at, outs)
                        found.append((path + (v,), chained))
                        following.append((path + (v,), chained))
                level = following
    return found, too_deep


def _early_copies(facts: Facts, rebuilds: list[list[Rebuild]], unit_of: dict[str, int]
                  ) -> list[tuple[int, int, tuple[str, ...], int]]:
    """Copies back brought forward for a rebuild: a rebuild of unit u that needs tensors of unit v
    first used later, while v is swapped, has them copied back before its group runs (the default
    schedule times a swapped tensor's copy back for the first recompute group that reads it,
    schedule.first_need_step), so the group re-runs only u's ops and those tensors are on the
    device from u's step on. Returns (u, v, those tensors, u's step as an op index), in sorted
    order, so the model is the same on every run."""
    w = facts.workload
    found: list[tuple[int, int, tuple[str, ...], int]] = []
    for u, per_unit in enumerate(rebuilds):
        for root in per_unit:
            by_unit: dict[int, list[str]] = {}
            for t in root.need_kept:
                if unit_of[t] != u:
                    by_unit.setdefault(unit_of[t], []).append(t)
            for v, names in sorted(by_unit.items()):
                found.append((u, v, tuple(sorted(names)), root.at))
    return found


@dataclass(frozen=True)
class _Milp:
    """One MILP instance: minimize objective @ x, lower <= matrix @ x <= upper, 0 <= x <= var_upper,
    the first 2 * units columns binary (s_u, then r_u)."""

    objective: Any
    matrix: Any
    lower: list[float]
    upper: list[float]
    var_upper: Any
    integrality: Any
    family: list[str]
    units: int
    time_unit: float


def _model(facts: Facts, hardware: Hardware, units: list[tuple[str, ...]], limit_bytes: int) -> _Milp:
    """The MILP for a memory limit (module docstring)."""
    np = require("numpy", "milp", "the optimal planner")
    sparse = require("scipy.sparse", "milp", "the optimal planner")
    w = facts.workload
    n_ops = len(w.ops)
    u_count = len(units)
    # Bytes in units of the keep-all peak, so that every memory row is of order 1 whatever the
    # workload's scale (HiGHS's feasibility tolerance is absolute, about 1e-7).
    scale = float(facts.input_bytes + sum(facts.size[t] for t in facts.candidates))
    size = [sum(facts.size[t] for t in u) / scale for u in units]
    # Seconds in units of the ideal step, for the same reason: profiled workloads have steps of
    # microseconds, under HiGHS's absolute tolerances (its mip_abs_gap is 1e-6), which made any
    # first incumbent look optimal.
    time_unit = w.ideal_step_time_s if w.ideal_step_time_s > 0 else 1.0
    made = [max(facts.produced_at_s[t] for t in u) / time_unit for u in units]
    first_use = [min(facts.first_use_s[t] for t in u) / time_unit for u in units]
    # Op indices of backward readers: memory is counted per backward step (op index).
    last_reader = [min(w.last_bwd_reader[t] for t in u) for u in units]
    first_reader = [max(w.op_index[r] for t in u for r in w.tensor_by_name[t].bwd_readers) for u in units]
    # A copy queued behind another starts moving bytes as that one ends, its launch latency hidden
    # (docs/simulator.md): on one stream a copy ends at max(previous end, ready + latency) + bytes,
    # so a FIFO of copies ends by max over k of (ready_k + latency + bytes of k and every copy after
    # it). The rows below pay the latency once per such k, not once per copy.
    latency = hardware.copy_latency_s / time_unit
    out_s = [sum(facts.size[t] / hardware.d2h_bytes_per_s for t in u) / time_unit for u in units]
    back_s = [sum(facts.size[t] / hardware.h2d_bytes_per_s for t in u) / time_unit for u in units]
    rebuilds = [rebuilds_of(facts, u) for u in units]
    unit_of = {t: k for k, u in enumerate(units) for t in u}
    depth = CHAIN_DEPTH if u_count <= CHAIN_DEPTH_UNITS else 0
    chain_list, too_deep = _chains(facts, rebuilds, unit_of, depth)
    early_copies = _early_copies(facts, rebuilds, unit_of)
    rebuild_ops = sorted({i for per_unit in rebuilds for r in per_unit for i in r.ops}
                         | {i for _, r in chain_list for i in r.ops})
    y_col = {op: 2 * u_count + k for k, op in enumerate(rebuild_ops)}
    n_y = len(rebuild_ops)
    z_col0 = 2 * u_count + n_y
    n_y += len(chain_list)  # z columns follow the y columns, bounded by [0, 1] like them
    q_col0 = 2 * u_count + n_y
    n_y += len(early_copies)  # then the q columns, the same way
    # Auxiliary running sums: d2h suffix sums (production order), h2d prefix sums (use order),
    # bytes off per backward step.
    d2h_col = 2 * u_count + n_y
    h2d_col = d2h_col + u_count
    mem_col = h2d_col + u_count  # v_i for i = 0..n_ops
    n_vars = mem_col + n_ops + 1
    S = lambda u: u  # noqa: E731 - column of s_u
    R = lambda u: u_count + u  # noqa: E731 - column of r_u
    rows = _Rows()
    rows.current = "actions and rebuild ops"
    for u in range(u_count):
        rows.add([(S(u), 1.0), (R(u), 1.0)], -np.inf, 1.0)
        for op in sorted({i for r in rebuilds[u] for i in r.ops}):
            rows.add([(y_col[op], 1.0), (R(u), -1.0)], 0.0, np.inf)
    # A rebuild re-runs only its ops if what it needs is on the device (rebuilds.py): a needed unit
    # that is recomputed is a chain (z, below); one that is swapped is copied back early (q, below).
    # Copies out: a_k = out_k s_k + a_{k+1} over production order; made_k + latency s_k + a_k <= forward time.
    rows.current = "copies out end in forward"
    by_made = sorted(range(u_count), key=lambda u: (made[u], u))
    for pos, u in enumerate(by_made):
        entries = [(d2h_col + pos, 1.0), (S(u), -out_s[u])]
        if pos + 1 < u_count:
            entries.append((d2h_col + pos + 1, -1.0))
        rows.add(entries, 0.0, 0.0)
        rows.add([(d2h_col + pos, 1.0), (S(u), latency)], -np.inf, facts.forward_time_s / time_unit - made[u])
    # Copies back: b_k = b_{k-1} + back_k s_k over first-use order; latency s_k + b_k <= first use of k.
    rows.current = "copies back land in time"
    by_use = sorted(range(u_count), key=lambda u: (first_use[u], u))
    for pos, u in enumerate(by_use):
        entries = [(h2d_col + pos, 1.0), (S(u), -back_s[u])]
        if pos > 0:
            entries.append((h2d_col + pos - 1, -1.0))
        rows.add(entries, 0.0, 0.0)
        rows.add([(h2d_col + pos, 1.0), (S(u), latency)], -np.inf, first_use[u])
    # Memory: v_i = bytes off the device at backward step i = sum over units with first reader < i of
    # size x; v_{i+1} = v_i + those with first reader i. Need v_i >= inputs + held_i - limit, where
    # held_i = units whose last reader is <= i (all of them at i = n_ops, the end of forward).
    by_first_reader: dict[int, list[int]] = {}
    for u in range(u_count):
        by_first_reader.setdefault(first_reader[u], []).append(u)
    held = [0.0] * (n_ops + 1)
    for u in range(u_count):
        held[last_reader[u]] += size[u]
    running = 0.0
    for i in range(n_ops + 1):
        running += held[i] if i < n_ops else 0.0
        held[i] = running
    held[n_ops] = running
    rows.current = "memory, backward"
    rows.add([(mem_col, 1.0)], 0.0, 0.0)
    limit = limit_bytes / scale
    inputs = facts.input_bytes / scale
    for i in range(n_ops):
        entries = [(mem_col + i + 1, 1.0), (mem_col + i, -1.0)]
        for u in by_first_reader.get(i, ()):
            entries += [(S(u), -size[u]), (R(u), -size[u])]
        rows.add(entries, 0.0, 0.0)
    # A rebuild's group also holds its ops' saved outputs that were already freed, until it ends.
    group_extra: dict[int, list[tuple[int, float]]] = {}
    for u in range(u_count):
        for r in rebuilds[u]:
            if r.dead_extra_bytes:
                group_extra.setdefault(r.at, []).append((R(u), -r.dead_extra_bytes / scale))
    rows.current = "rebuild chains"
    for k, (path, rebuild) in enumerate(chain_list):
        col, v = z_col0 + k, path[-1]
        rows.add([(col, 1.0)] + [(R(x), -1.0) for x in path], 1.0 - len(path), np.inf)
        for op in rebuild.ops:
            rows.add([(y_col[op], 1.0), (col, -1.0)], 0.0, np.inf)
        for t in rebuild.need_kept:
            if unit_of[t] not in path:
                rows.add([(col, 1.0), (S(unit_of[t]), 1.0)], -np.inf, 1.0)
        early = sum(facts.size[t] for t in rebuild.rebuilt) / scale
        for i in range(first_reader[v] + 1, rebuild.at + 1):
            group_extra.setdefault(i, []).append((col, -early))
        if rebuild.dead_extra_bytes:
            group_extra.setdefault(rebuild.at, []).append((col, -rebuild.dead_extra_bytes / scale))
    for path, v in too_deep:
        rows.add([(R(x), 1.0) for x in path + (v,)], -np.inf, float(len(path)))
    rows.current = "copies back early for a rebuild"
    use_order = [first_use[u] for u in by_use]
    for k, (u, v, names, at) in enumerate(early_copies):
        # q >= r_u + s_v - 1: the named tensors of v come back before u's group instead of at v's
        # first use. Their copy lands by the start of u's step behind every copy first used by
        # then (counted again at v's own first use: it only tightens), and they are held from u's
        # step until v's first reader.
        col = q_col0 + k
        rows.add([(col, 1.0), (R(u), -1.0), (S(v), -1.0)], -1.0, np.inf)
        needed_s = facts.step_starts_s[backward_step_of(n_ops, at)] / time_unit
        before = bisect.bisect_right(use_order, needed_s) - 1
        back = sum(facts.size[t] / hardware.h2d_bytes_per_s for t in names) / time_unit
        entries = [(col, back + latency)] + ([(h2d_col + before, 1.0)] if before >= 0 else [])
        rows.add(entries, -np.inf, needed_s)
        early = sum(facts.size[t] for t in names) / scale
        for i in range(first_reader[v] + 1, at + 1):
            group_extra.setdefault(i, []).append((col, -early))
    rows.current = "memory, backward"
    for i in range(n_ops + 1):
        rows.add([(mem_col + i, 1.0)] + group_extra.get(i, []), inputs + held[i] - limit, np.inf)
    # Forward memory at the start of each op i (its outputs just allocated): every unit made so far,
    # minus the units already gone: a recompute after its last forward use, a swap after that and
    # after its own copy out could end (made + its copy time; earlier copies in the FIFO may delay
    # it further, which the simulation and the margin catch). f_i = f_{i-1} + units gone at op i.
    starts, now = [], 0.0
    for op in w.ops:
        starts.append(now)
        now += op.fwd_time_s / time_unit
    made_op = [max(w.op_index[w.tensor_by_name[t].producer] for t in u) for u in units]
    last_fwd = [max(w.last_fwd_use[t] for t in u) for u in units]
    gone_rec: dict[int, list[int]] = {}
    gone_swap: dict[int, list[int]] = {}
    for u in range(u_count):
        gone_rec.setdefault(last_fwd[u] + 1, []).append(u)
        copied = bisect.bisect_left(starts, made[u] + latency + out_s[u])
        gone_swap.setdefault(max(last_fwd[u] + 1, copied), []).append(u)
    made_bytes = [0.0] * n_ops
    for u in range(u_count):
        made_bytes[made_op[u]] += size[u]
    fwd_col = n_vars
    n_vars += n_ops
    rows.current = "memory, forward"
    rows.add([(fwd_col, 1.0)], 0.0, 0.0)
    allocated = inputs
    for i in range(n_ops):
        if i > 0:
            entries = [(fwd_col + i, 1.0), (fwd_col + i - 1, -1.0)]
            entries += [(R(u), -size[u]) for u in gone_rec.get(i, ())]
            entries += [(S(u), -size[u]) for u in gone_swap.get(i, ())]
            rows.add(entries, 0.0, 0.0)
        allocated += made_bytes[i]
        rows.add([(fwd_col + i, 1.0)], allocated - limit, np.inf)
    matrix = sparse.csr_array((rows.vals, (rows.rows, rows.cols)), shape=(len(rows.lower), n_vars))
    objective = np.zeros(n_vars)
    for op, col in y_col.items():
        objective[col] = w.ops[op].fwd_time_s / time_unit
    integrality = np.zeros(n_vars)
    integrality[: 2 * u_count] = 1
    upper = np.full(n_vars, np.inf)
    upper[: 2 * u_count + n_y] = 1.0
    return _Milp(objective, matrix, rows.lower, rows.upper, upper, integrality, rows.family, u_count, time_unit)


def _solve(facts: Facts, hardware: Hardware, units: list[tuple[str, ...]], limit_bytes: int) -> dict | None:
    """Solve the MILP for a memory limit; None when HiGHS finds no solution."""
    np = require("numpy", "milp", "the optimal planner")
    optimize = require("scipy.optimize", "milp", "the optimal planner")
    m = _model(facts, hardware, units, limit_bytes)
    started = time.perf_counter()
    result = optimize.milp(
        m.objective, constraints=[optimize.LinearConstraint(m.matrix, m.lower, m.upper)],
        integrality=m.integrality, bounds=optimize.Bounds(np.zeros(len(m.objective)), m.var_upper),
        options={"node_limit": NODE_LIMIT, "mip_rel_gap": MIP_REL_GAP},
    )
    solve_s = time.perf_counter() - started
    if result.x is None:
        return None
    actions: dict[str, Action] = {}
    for u, names in enumerate(units):
        action = (Action.SWAP if result.x[u] > 0.5 else Action.RECOMPUTE if result.x[m.units + u] > 0.5
                  else None)
        if action is not None:
            actions.update({t: action for t in names})
    dual = getattr(result, "mip_dual_bound", None)
    objective_s = float(result.fun) * m.time_unit
    return {"actions": actions, "objective_s": objective_s, "solve_s": solve_s,
            "dual_bound_s": float(dual) * m.time_unit if dual is not None else objective_s,
            "gap": float(getattr(result, "mip_gap", 0.0) or 0.0), "proven": bool(result.status == 0),
            "variables": len(m.objective), "binaries": 2 * m.units, "rows": len(m.lower)}


def _assess(facts: Facts, hardware: Hardware, units: list[tuple[str, ...]], limit_bytes: int,
            actions: dict[str, Action]) -> dict:
    """How the linear model sees a given plan (its binaries fixed): ``objective_s`` when the model
    admits it, else None, and ``broken``, the row families that keep it out (each family that alone admits no
    solution). ``representable`` is False when a unit's tensors take different
    actions, which the model cannot express (nothing else is then reported)."""
    np = require("numpy", "milp", "the optimal planner")
    optimize = require("scipy.optimize", "milp", "the optimal planner")
    m = _model(facts, hardware, units, limit_bytes)
    fixed_low, fixed_up = np.zeros(len(m.objective)), np.array(m.var_upper, dtype=float)
    for u, names in enumerate(units):
        chosen = {actions.get(t, Action.KEEP) for t in names}
        if len(chosen) > 1:
            return {"representable": False, "objective_s": None, "broken": []}
        (action,) = chosen
        fixed_low[u] = fixed_up[u] = 1.0 if action is Action.SWAP else 0.0
        fixed_low[m.units + u] = fixed_up[m.units + u] = 1.0 if action is Action.RECOMPUTE else 0.0

    def solve(keep_rows):
        return optimize.linprog(m.objective, bounds=list(zip(fixed_low, fixed_up)), method="highs",
                                **_as_ranges(m, np.flatnonzero(keep_rows)))

    result = solve(np.ones(len(m.lower), dtype=bool))
    if result.status == 0:
        return {"representable": True, "objective_s": float(result.fun) * m.time_unit, "broken": []}
    family = np.array(m.family)
    broken = [name for name in dict.fromkeys(m.family) if solve(family == name).status != 0]
    return {"representable": True, "objective_s": None, "broken": broken}


def _as_ranges(m: _Milp, rows) -> dict:
    """linprog's A_ub / A_eq form of the rows ``rows`` of ``m`` (lower <= row <= upper)."""
    np = require("numpy", "milp", "the optimal planner")
    sparse = require("scipy.sparse", "milp", "the optimal planner")
    matrix = m.matrix[rows]
    lower, upper = np.array(m.lower)[rows], np.array(m.upper)[rows]
    equal = lower == upper
    below = ~equal & np.isfinite(upper)
    above = ~equal & np.isfinite(lower)
    return {"A_ub": sparse.vstack([matrix[below], -matrix[above]]),
            "b_ub": np.concatenate([upper[below], -lower[above]]),
            "A_eq": matrix[equal], "b_eq": lower[equal]}


def plan_optimal(workload: Workload, hardware: Hardware, budget_bytes: int) -> Plan:
    facts = facts_for(workload)
    if not facts.candidates:
        # Nothing can be swapped or recomputed: there is no MILP to solve (and no bytes to scale
        # by); the all-keep plan is the only plan, and it fits whenever the budget is reachable.
        plan = build(workload, hardware, {}, "optimal", budget_bytes)
        cand = evaluate(workload, hardware, plan, budget_bytes)
        if not cand.fits:
            raise policy_cannot_fit("optimal", budget_bytes, natural_peak_bytes(workload, hardware, plan),
                                    "raise the budget")
        ideal = workload.ideal_step_time_s
        return with_info(plan, rule="nothing to decide: the workload saves no tensor a plan can move",
                         milp_objective_s=0.0, milp_dual_bound_s=0.0, milp_gap=0.0,
                         milp_predicted_step_time_s=ideal, milp_bound_step_time_s=ideal,
                         milp_solve_time_s=0.0, milp_proven_optimal=True, milp_margin_bytes=0,
                         milp_decisions=0, milp_units=0, milp_rounds=[],
                         simulated_step_time_s=cand.step_time_s)
    units, granularity = choose_units(facts)
    margin = 0
    best = None
    total_solve_s = 0.0
    rounds = []
    for _ in range(ROUNDS):
        solved = _solve(facts, hardware, units, budget_bytes - margin)
        if solved is None:
            break
        total_solve_s += solved["solve_s"]
        plan = build(workload, hardware, solved["actions"], "optimal", budget_bytes)
        peak = natural_peak_bytes(workload, hardware, plan)
        cand = evaluate(workload, hardware, plan, budget_bytes)
        rounds.append({"margin_bytes": margin, "objective_s": solved["objective_s"],
                       "dual_bound_s": solved["dual_bound_s"], "peak_bytes": peak,
                       "simulated_step_time_s": cand.step_time_s if cand.fits else None})
        if cand.fits and (best is None or cand.step_time_s < best[0].step_time_s):
            best = (cand, solved, margin)
        if peak <= budget_bytes:
            break
        margin += peak - budget_bytes
    heuristic = _heuristic_candidate(workload, hardware, budget_bytes)
    if best is None and heuristic is None:
        if rounds:
            raise policy_cannot_fit("optimal", budget_bytes, min(r["peak_bytes"] for r in rounds),
                                    "the lowest peak of its MILP plans: raise the budget")
        raise BudgetError(
            f"policy optimal cannot fit {format_bytes(budget_bytes)} ({budget_bytes} bytes): its MILP has no "
            "solution there (its model hides every copy behind compute and has no stalls); raise the budget "
            "or use slackswap or capuchin, which may fit with stalls")
    ideal = workload.ideal_step_time_s
    rule = f"MILP over keep/swap/recompute, {len(units)} decision units ({granularity}), HiGHS"
    common = {"milp_solve_time_s": total_solve_s, "milp_units": len(units), "milp_rounds": rounds,
              "heuristic_step_time_s": heuristic.step_time_s if heuristic is not None else None}
    if best is not None:
        cand, solved, margin = best
        common.update(
            milp_objective_s=solved["objective_s"], milp_dual_bound_s=solved["dual_bound_s"],
            milp_gap=solved["gap"], milp_predicted_step_time_s=ideal + solved["objective_s"],
            milp_bound_step_time_s=ideal + solved["dual_bound_s"], milp_proven_optimal=solved["proven"],
            milp_margin_bytes=margin, milp_decisions=solved["binaries"])
    if heuristic is not None and (best is None or heuristic.step_time_s < best[0].step_time_s):
        why = ("its MILP has no plan that fits" if best is None else
               f"it simulates faster than the MILP's plan ({best[0].step_time_s:.6g} s)")
        plan = dataclasses.replace(heuristic.plan, policy="optimal", info={})
        return with_info(plan, rule=f"{rule}; {HEURISTIC}'s plan returned: {why}", source=HEURISTIC,
                         simulated_step_time_s=heuristic.step_time_s, **common)
    return with_info(best[0].plan, rule=rule, source="milp", simulated_step_time_s=best[0].step_time_s, **common)


HEURISTIC = "slackswap"
"""The heuristic whose plan `optimal` returns where it simulates faster than the MILP's: the MILP's
linear model is pessimistic against the simulator in places (docs/planners.md, `optimal`), and
`slackswap` is never below another heuristic (tests/test_profiled_quality.py), so `optimal` is
never below any heuristic either."""


def _heuristic_candidate(workload: Workload, hardware: Hardware, budget_bytes: int) -> Candidate | None:
    """``HEURISTIC``'s plan at the budget, simulated; None when it refuses the budget."""
    from .slackswap import plan_slackswap

    try:
        plan = plan_slackswap(workload, hardware, budget_bytes)
    except BudgetError:
        return None
    found = evaluate(workload, hardware, plan, budget_bytes)
    return found if found.fits else None
