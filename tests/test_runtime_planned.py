"""Plans made by the planners (slackswap.plan on a profiled workload) run exactly as planned.

The workloads are projected onto an A100 (roofline times from FLOPs and bytes), so the plans are
the same on every run. For each plan the runtime must: train bit for bit like unmodified training
(float32 on CPU, every op deterministic, so torch.equal, no tolerance); re-run exactly the plan's
recompute FLOPs (FlopCounterMode, planned run minus unmodified run); copy exactly the plan's swapped
bytes each way; hold at most the simulated peak of saved bytes (itself within the budget); and
issue each copy back and run each recompute group at the backward step the plan gives it.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

import slackswap  # noqa: E402
from slackswap import Action, get_hardware, make_plan, simulate  # noqa: E402
from slackswap.errors import PlanMismatchError  # noqa: E402
from slackswap.examples import EXAMPLES, loss_fn, make_batch, make_example  # noqa: E402
from slackswap.profiler import profile_model  # noqa: E402
from slackswap.runtime import apply_plan, build_execution_map  # noqa: E402
from runtime_helpers import profile_cache, step_flops as _step_flops, train as _train  # noqa: E402

HW = get_hardware("a100-80gb-pcie4")
STEPS = 2
# (policy, budget fraction): at 0.2 `slackswap` mixes keep, swap and recompute on every example (at
# 0.3 its plans became recompute-only once recompute-optimal's frontier search gave faster ones, and
# at 0.25 on TINY BERT and Llama once its wander did: 79.11 / 84.45 % of ideal, were a few %);
# full-recompute cannot reach 0.5 on two of them.
MIXED = 0.2
CASES = [("slackswap", 0.5), ("slackswap", MIXED), ("capuchin", 0.5), ("full-recompute", 0.7)]


@pytest.fixture(scope="module")
def profiled():
    return profile_cache(STEPS, HW)


def train(model, batches, runtime=None):
    return _train(model, batches, runtime, seed=99)


def step_flops(model, batch, runtime=None) -> int:
    return _step_flops(model, batch, runtime, seed=5)



@pytest.mark.parametrize("kind", sorted(EXAMPLES))
@pytest.mark.parametrize("policy,budget", CASES)
def test_planner_plan_runs_exactly_as_planned(profiled, kind, policy, budget):
    base, batches, workload = profiled(kind)
    plan = slackswap.plan(workload, HW, budget=budget, policy=policy)
    n = len(workload.ops)
    if budget == MIXED:
        assert all(plan.count(a) for a in Action), "the mixed case must keep, swap and recompute"
    assert build_execution_map(workload, plan).aligned

    reference, planned = copy.deepcopy(base), copy.deepcopy(base)
    ref_losses, ref_grads = train(reference, batches)
    # A copy of the profiled model: name the profile. The replay path's manager records the schedule
    # as run (the fast paths backend="auto" takes are checked in tests/test_runtime_paths.py).
    runtime = slackswap.apply(planned, plan, workload=workload, backend="replay")
    losses, grads = train(planned, batches, runtime)
    assert all(torch.equal(a, b) for a, b in zip(ref_losses, losses))
    assert ref_grads.keys() == grads.keys()
    for name in ref_grads:
        assert torch.equal(ref_grads[name], grads[name]), name

    stats = runtime.stats
    swapped = plan.bytes_with(workload, Action.SWAP)
    assert stats.step_d2h_bytes == stats.step_h2d_bytes == swapped
    assert stats.d2h_bytes == STEPS * swapped
    assert stats.late_prefetches == 0
    assert stats.device_saved_bytes == 0  # everything released after backward
    # What the manager holds never exceeds what the simulator holds, which fits the budget.
    assert stats.peak_device_saved_bytes <= simulate(workload, HW, plan).peak_memory_bytes <= plan.budget_bytes

    # The schedule as run: each group at its planned step; each copy back at the step where the
    # simulation starts it (its prefetch step, or later when it queues behind other copies).
    manager = runtime.manager
    assert manager.group_steps == sorted(n - 1 - workload.op_index[r] for r in plan.recompute_groups)
    assert stats.step_recompute_ops == sum(len(g) for g in plan.recompute_groups.values())
    starts = plan.schedule.start_steps()
    assert starts.keys() == plan.prefetch_step.keys()
    assert all(starts[t] >= step for t, step in plan.prefetch_step.items())
    assert manager.copy_in_steps == starts
    assert stats.prefetch_waits == 0

    predicted = sum(workload.ops[workload.op_index[g]].flops for grp in plan.recompute_groups.values() for g in grp)
    assert step_flops(planned, batches[0], runtime) - step_flops(reference, batches[0]) == predicted
    if plan.count(Action.RECOMPUTE) and policy == "full-recompute":
        assert predicted > 0


def test_slackswap_plan_and_apply_find_each_other_through_the_profile():
    """The issue's three-line API, on a model object that was profiled itself."""
    model = make_example("gpt2")
    batches = [make_batch(seed=s) for s in range(2)]
    reference = copy.deepcopy(model)
    workload = slackswap.profile(model, batches[0], loss_fn, hardware=HW, repeats=1)
    plan = slackswap.plan(workload, hardware=HW, budget=0.25, policy="slackswap")
    ref_losses, ref_grads = train(reference, batches)
    with slackswap.apply(model, plan) as runtime:
        pass
    losses, grads = train(model, batches, runtime)
    assert all(torch.equal(a, b) for a, b in zip(ref_losses, losses))
    assert all(torch.equal(ref_grads[k], grads[k]) for k in ref_grads)
    assert runtime.stats.step_d2h_bytes == plan.bytes_with(workload, Action.SWAP) > 0
    assert runtime.stats.step_recompute_ops == sum(len(g) for g in plan.recompute_groups.values()) > 0


class InPlace(nn.Module):
    """A ReLU in place on a saved tensor, then dropout (empty_like, bernoulli_, div_ in place)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        h = torch.relu_(self.fc(x))
        return (self.drop(h) * h).sum()


def inplace_loss(model, batch):
    return model(batch)


def test_recomputing_tensors_written_in_place_reruns_the_writes_and_the_rng():
    torch.manual_seed(0)
    base = InPlace()
    batches = [torch.randn(4, 8, generator=torch.Generator().manual_seed(s)) for s in range(3)]
    workload = profile_model(base, batches[0], inplace_loss, repeats=1)
    actions = {t.name: Action.RECOMPUTE for t in workload.saved_tensors if t.producer is not None}
    plan = make_plan(workload, actions, policy="all-recompute", budget_bytes=None)
    rerun = [g.split("/")[-1].split("#")[0] for group in plan.recompute_groups.values() for g in group]
    # The saved ReLU result is a version made by relu_, the mask one made by bernoulli_ then div_:
    # rebuilding them re-runs those writes (and bernoulli_ with the RNG state it drew from).
    assert {"relu_", "bernoulli_", "div_"} <= set(rerun)

    def run(model, runtime=None):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.manual_seed(11)
        out = []
        for b in batches:
            opt.zero_grad()
            with runtime if runtime is not None else contextlib.nullcontext():
                loss = inplace_loss(model, b)
                loss.backward()
            out.append(loss.detach())
            opt.step()
        return out, [p.grad.clone() for p in model.parameters()]

    ref = run(copy.deepcopy(base))
    planned = copy.deepcopy(base)
    runtime = apply_plan(planned, plan, workload, backend="replay")  # replays the recorded writes and RNG
    got = run(planned, runtime)
    assert all(torch.equal(a, b) for a, b in zip(ref[0], got[0]))
    assert all(torch.equal(a, b) for a, b in zip(ref[1], got[1]))
    assert runtime.stats.step_recompute_ops == len(rerun)


def test_a_profile_without_tensor_versions_is_refused(profiled):
    base, _, workload = profiled("llama")
    old = dataclasses.replace(workload, meta={k: v for k, v in workload.meta.items() if k != "storage_versions"})
    plan = make_plan(old, {}, policy="keep", budget_bytes=None)
    with pytest.raises(PlanMismatchError, match="profile the model again"):
        apply_plan(copy.deepcopy(base), plan, old)


@pytest.mark.parametrize("kind", sorted(EXAMPLES))
def test_each_save_is_read_by_the_op_whose_backward_unpacks_it(profiled, kind):
    """A view-like op's backward reads nothing: a save next to one (bmm's saved `v` right after
    `_unsafe_view`) belongs to the op that really unpacks it."""
    _, _, workload = profiled(kind)
    readers = {r for t in workload.saved_tensors for r in t.bwd_readers}
    assert readers and not [r for r in readers if "/_unsafe_view#" in r or "/view#" in r or "/expand#" in r]


def test_a_recompute_region_op_whose_output_nothing_needs_is_re_run_by_the_runtime():
    """A plan's recompute region (selective-recompute's Megatron core attention) makes a group re-run
    an op whose output is not rebuilt for anything: the runtime runs it, with the plan's FLOPs."""
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))
    batch = torch.randn(4, 8)

    def loss(model, x):
        return model(x).square().mean()

    workload = profile_model(base, batch, loss, repeats=1)
    first_act = next(t.name for t in workload.saved_tensors if t.producer and "tanh" in t.producer)
    producer = workload.tensor_by_name[first_act].producer
    after = workload.ops[workload.op_index[producer] + 2].name  # the next Linear's GEMM (after its weight view)
    assert workload.ops[workload.op_index[after]].kind == "gemm"
    plain = make_plan(workload, {first_act: Action.RECOMPUTE}, policy="hand", budget_bytes=None)
    region = make_plan(workload, {first_act: Action.RECOMPUTE}, policy="hand", budget_bytes=None,
                       recompute_regions=[(producer, after)])
    (group,) = region.recompute_groups.values()
    assert set(group) - set(next(iter(plain.recompute_groups.values()))) == {after}

    def run(model, runtime=None):
        model.zero_grad(set_to_none=True)
        with runtime if runtime is not None else contextlib.nullcontext():
            with FlopCounterMode(display=False) as counter:
                loss(model, batch).backward()
        return counter.get_total_flops(), [p.grad.clone() for p in model.parameters()]

    ref_flops, ref_grads = run(copy.deepcopy(base))
    planned = copy.deepcopy(base)
    runtime = apply_plan(planned, region, workload)
    flops, grads = run(planned, runtime)
    assert all(torch.equal(a, b) for a, b in zip(ref_grads, grads))
    assert runtime.stats.step_recompute_ops == len(group)
    assert flops - ref_flops == sum(workload.ops[workload.op_index[g]].flops for g in group)
