"""compiled/fewest_flops.py: the fewest re-run FLOPs for the bytes held at the forward/backward boundary,
against hand-computed answers and an exhaustive search."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from slackswap.compiled.fewest_flops import fewest_flops, fewest_flops_plan, rebuild_chains, recompute_flops
from slackswap.errors import BudgetError
from slackswap.plans import Action
from slackswap.workload import Op, Tensor, Workload


def _op(name, flops, inputs, outputs):
    return Op(name=name, layer=0, kind="gemm" if flops else "elementwise", fwd_time_s=1e-6 + flops * 1e-12,
              bwd_time_s=2e-6, flops=flops, bytes_accessed=0.0, inputs=tuple(inputs), outputs=tuple(outputs))


def _chain():
    """x (8 B, a step input) -mm 100-> A (40 B) -relu-> R (10 B) -mm 50-> C (30 B) -gelu-> G (20 B);
    backward reads all of them."""
    ops = (_op("a", 100.0, ["x"], ["A"]), _op("b", 0.0, ["A"], ["R"]), _op("c", 50.0, ["R"], ["C"]),
           _op("d", 0.0, ["C"], ["G"]))
    tensors = (Tensor(name="x", size_bytes=8, producer=None, bwd_readers=("a",)),
               Tensor(name="A", size_bytes=40, producer="a", bwd_readers=("b",)),
               Tensor(name="R", size_bytes=10, producer="b", bwd_readers=("c",)),
               Tensor(name="C", size_bytes=30, producer="c", bwd_readers=("d",)),
               Tensor(name="G", size_bytes=20, producer="d", bwd_readers=("d",)))
    return Workload(name="chain", ops=ops, tensors=tensors)


@pytest.mark.parametrize("budget, flops, held_at_most", [
    (108, 0.0, 108),   # everything fits: nothing recomputed
    (78, 0.0, 78),     # 30 B to free: R and G rebuild through pointwise ops only
    (70, 50.0, 70),    # 38 B: the two pointwise rebuilds free 30, so C (50 FLOPs) too, not A (100)
    (40, 100.0, 40),   # 68 B: C and the pointwise ones free only 60; A frees 40 + 30 = 70 for 100 FLOPs,
                       # fewer than both matmuls (150) although C frees more bytes per FLOP
    (30, 150.0, 30),   # 78 B: both matmuls
])
def test_hand_computed_chain(budget, flops, held_at_most):
    workload = _chain()
    result = fewest_flops(workload, budget)
    assert result.flops == flops
    assert result.held_bytes <= held_at_most
    assert result.complete and result.lower_bound_flops == flops
    assert recompute_flops(workload, result.recompute) == flops


def test_kept_back_within_the_budget():
    # At 70 B the answer recomputes C; of R (10 B) and G (20 B) one fits back in the 22 B left.
    result = fewest_flops(_chain(), 70)
    assert "C" in result.recompute and "A" not in result.recompute
    assert len({"R", "G"} & result.recompute) == 1
    assert result.held_bytes in (60 + 8, 50 + 8)


def test_a_shared_matmul_counts_once():
    # T = mm(x) is no saved tensor; both Y1 = relu(T) and Y2 = sigmoid(T) are: rebuilding both re-runs
    # the matmul once (80 FLOPs), as a partitioner computes a node once in backward.
    ops = (_op("mm", 80.0, ["x"], ["T"]), _op("relu", 0.0, ["T"], ["Y1"]), _op("sig", 0.0, ["T"], ["Y2"]))
    tensors = (Tensor(name="x", size_bytes=4, producer=None, bwd_readers=("mm",)),
               Tensor(name="T", size_bytes=64, producer="mm", bwd_readers=()),
               Tensor(name="Y1", size_bytes=16, producer="relu", bwd_readers=("relu",)),
               Tensor(name="Y2", size_bytes=16, producer="sig", bwd_readers=("sig",)))
    workload = Workload(name="shared", ops=ops, tensors=tensors)
    assert rebuild_chains(workload) == {"Y1": frozenset({"mm", "relu"}), "Y2": frozenset({"mm", "sig"})}
    result = fewest_flops(workload, 4)
    assert result.recompute == {"Y1", "Y2"} and result.flops == 80.0


def test_budget_under_the_step_inputs_is_refused():
    with pytest.raises(BudgetError, match="step inputs alone are 8 bytes"):
        fewest_flops(_chain(), 7)


def test_plan_carries_the_result():
    workload = _chain()
    plan = fewest_flops_plan(workload, 40)
    assert plan.actions["A"] is Action.RECOMPUTE and plan.actions["C"] is Action.KEEP
    assert plan.info["recompute_flops_once"] == 100.0 and plan.info["search"] == "complete"
    assert plan.budget_bytes is None and plan.info["held_budget_bytes"] == 40


def _random_workload(rng: random.Random, n_ops: int) -> Workload:
    """A random DAG: each op reads one or two earlier tensors (or the input), some ops are matmuls,
    some tensors transient (no backward reader)."""
    ops, sizes, names = [], {"x": rng.randint(1, 8)}, ["x"]
    for i in range(n_ops):
        inputs = sorted(set(rng.sample(names, min(len(names), rng.randint(1, 2)))))
        ops.append(_op(f"op{i}", float(rng.choice([0, 0, 10, 30, 70])), inputs, [f"t{i}"]))
        sizes[f"t{i}"] = rng.randint(1, 40)
        names.append(f"t{i}")
    tensors = [Tensor(name="x", size_bytes=sizes["x"], producer=None, bwd_readers=("op0",))]
    for i in range(n_ops):
        name = f"t{i}"
        # Read in backward by its producer or by one of its forward readers (a quarter are transient).
        readers = [f"op{i}"] + [op.name for op in ops if name in op.inputs]
        saved = rng.random() < 0.75
        tensors.append(Tensor(name=name, size_bytes=sizes[name], producer=f"op{i}",
                              bwd_readers=(rng.choice(readers),) if saved else ()))
    return Workload(name="random", ops=tuple(ops), tensors=tuple(tensors))


def _exhaustive(workload: Workload, budget: int) -> float:
    """Least FLOPs over every recompute set within the budget: each op once among the ancestors of the
    recomputed tensors that are not on the device (kept, or a step input), as a partitioned backward
    graph re-runs them."""
    candidates = [t for t in workload.saved_tensors if t.producer is not None]
    inputs = sum(t.size_bytes for t in workload.saved_tensors if t.producer is None)
    by_name = workload.tensor_by_name
    best = math.inf
    for flags in itertools.product((False, True), repeat=len(candidates)):
        kept = {t.name for t, r in zip(candidates, flags) if not r}
        if inputs + sum(by_name[k].size_bytes for k in kept) > budget:
            continue
        on_device = kept | {t.name for t in workload.tensors if t.producer is None}

        def ancestors(tensor: str) -> set[str]:
            if tensor in on_device:
                return set()
            producer = by_name[tensor].producer
            op = workload.ops[workload.op_index[producer]]
            return {producer}.union(*(ancestors(i) for i in op.inputs))

        ops = set().union(*(ancestors(t.name) for t, r in zip(candidates, flags) if r))
        best = min(best, math.fsum(workload.ops[workload.op_index[o]].flops for o in ops))
    return best


def test_equals_the_exhaustive_search_on_random_graphs():
    rng = random.Random(20)
    checked = 0
    for _ in range(150):
        workload = _random_workload(rng, rng.randint(3, 11))
        total = sum(t.size_bytes for t in workload.saved_tensors)
        inputs = sum(t.size_bytes for t in workload.saved_tensors if t.producer is None)
        budget = rng.randint(inputs, total)
        result = fewest_flops(workload, budget)
        assert result.held_bytes <= budget
        assert result.flops == _exhaustive(workload, budget)
        checked += 1
    assert checked == 150


def test_a_cut_off_search_states_a_bound():
    rng = random.Random(3)
    workload = _random_workload(rng, 16)
    total = sum(t.size_bytes for t in workload.saved_tensors)
    exact = fewest_flops(workload, total // 3)
    cut = fewest_flops(workload, total // 3, max_nodes=2)
    assert exact.complete and exact.nodes > 2
    assert not cut.complete
    assert cut.lower_bound_flops <= exact.flops <= cut.flops
