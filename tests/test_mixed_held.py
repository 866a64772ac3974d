"""compiled/mixed_held.py: under the same bytes held at the forward/backward boundary, a swap the
simulator hides replaces a recompute, and a swap it cannot hide does not."""

from __future__ import annotations

import pytest

import slackswap
from slackswap.compiled.fewest_flops import fewest_flops_plan
from slackswap.compiled.mixed_held import held_bytes, mixed_held_plan
from slackswap.errors import BudgetError
from slackswap.plans import Action
from slackswap.sim import simulate
from slackswap.workload import Op, Tensor, Workload

HARDWARE = slackswap.get_hardware("a100-80gb-pcie4")


def _chain(op_time_s: float, a_bytes: int) -> Workload:
    """x -a-> A -b-> B -c-> C, each op ``op_time_s`` forward and twice that backward; backward of b reads
    A (``a_bytes``), of c reads B (1 KiB), of a reads the step input x (1 MiB)."""
    def op(name, source, out):
        return Op(name=name, layer=0, kind="gemm", fwd_time_s=op_time_s, bwd_time_s=2 * op_time_s, flops=1e9,
                  bytes_accessed=0.0, inputs=(source,), outputs=(out,))

    ops = (op("a", "x", "A"), op("b", "A", "B"), op("c", "B", "C"))
    tensors = (Tensor(name="x", size_bytes=1 << 20, producer=None, bwd_readers=("a",)),
               Tensor(name="A", size_bytes=a_bytes, producer="a", bwd_readers=("b",)),
               Tensor(name="B", size_bytes=1 << 10, producer="b", bwd_readers=("c",)),
               Tensor(name="C", size_bytes=1 << 10, producer="c", bwd_readers=()))
    return Workload(name="chain", ops=ops, tensors=tensors)


def _step_s(workload, plan):
    return simulate(workload, HARDWARE, plan, check=False).step_time_s


def test_a_hidden_swap_replaces_the_recompute():
    # 1 ms ops, A 1 MiB. Holding x and B only, A must leave the device. Recomputing it re-runs a: the
    # step is 3 + 6 + 1 = 10 ms. Swapping it costs 6 us + 1 MiB / 24 GB/s = 49.7 us each way, hidden
    # behind b's forward (1 ms) going out and c's backward (2 ms) coming back: the step is the ideal 9 ms.
    workload = _chain(1e-3, 1 << 20)
    budget = (1 << 20) + (1 << 10)
    recompute = fewest_flops_plan(workload, budget)
    assert recompute.actions["A"] is Action.RECOMPUTE
    assert _step_s(workload, recompute) == pytest.approx(10e-3)
    mixed = mixed_held_plan(workload, HARDWARE, budget, [recompute])
    assert mixed.actions == {"x": Action.KEEP, "A": Action.SWAP, "B": Action.KEEP}
    assert held_bytes(workload, mixed) == held_bytes(workload, recompute) == budget
    assert _step_s(workload, mixed) == pytest.approx(9e-3)
    assert mixed.policy == "mixed-held" and mixed.info["simulated_step_time_s"] == _step_s(workload, mixed)


def test_a_swap_slower_than_the_recompute_is_not_taken():
    # 1 us ops, A 64 MiB: copying it out takes 6 us + 64 MiB / 24 GB/s = 2.8 ms, not done when the forward
    # pass ends at 3 us, so A would still be held there; recomputing it costs 1 us.
    workload = _chain(1e-6, 64 << 20)
    budget = (1 << 20) + (1 << 10)
    recompute = fewest_flops_plan(workload, budget)
    mixed = mixed_held_plan(workload, HARDWARE, budget, [recompute])
    assert mixed.actions["A"] is Action.RECOMPUTE
    assert _step_s(workload, mixed) == _step_s(workload, recompute)


def test_the_bytes_held_bound_keeping_and_every_start_is_a_candidate():
    workload = _chain(1e-6, 64 << 20)
    # Room for A too: keeping it is fastest (no copy, no re-run).
    roomy = (65 << 20) + (1 << 10)
    everything_kept = mixed_held_plan(workload, HARDWARE, roomy, [fewest_flops_plan(workload, (1 << 20) + (1 << 10))])
    assert everything_kept.actions["A"] is Action.KEEP and held_bytes(workload, everything_kept) <= roomy
    # A start that holds more than the budget is no start; with none left the call says so.
    with pytest.raises(BudgetError, match="holds at most 1024 bytes"):
        mixed_held_plan(workload, HARDWARE, 1 << 10, [everything_kept])
