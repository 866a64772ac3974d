"""Training under a plan equals unmodified training bit for bit, and runs what the plan predicts.

Every op in these tiny float32 CPU models is deterministic (no atomics on CPU), so equality
is exact: torch.equal on the loss of every step and on every parameter's gradient.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest

torch = pytest.importorskip("torch")


from slackswap import Action, get_hardware, make_plan, simulate  # noqa: E402
from slackswap.errors import PlanMismatchError  # noqa: E402
from slackswap.examples import EXAMPLES, ExampleConfig, loss_fn, make_batch, make_example  # noqa: E402
from slackswap.profiler import profile_model  # noqa: E402
from slackswap.runtime import apply_plan, build_execution_map, runtime_prefetch_steps  # noqa: E402
from runtime_helpers import profile_cache, step_flops as _step_flops, train as _train  # noqa: E402

STEPS = 3
HW = get_hardware("a100-80gb-pcie4")


@pytest.fixture(scope="module")
def profiled():
    return profile_cache(STEPS, None)


def train(model, batches, runtime=None):
    return _train(model, batches, runtime, seed=1234)


def step_flops(model, batch, runtime=None) -> int:
    return _step_flops(model, batch, runtime, seed=None)



def _segments(call: str) -> list[str]:
    return call.split("@")[0].split(".")


def _block(call: str) -> str | None:
    s = _segments(call)
    return ".".join(s[:2]) if len(s) >= 2 and s[1].isdigit() else None


def mixed_actions(workload) -> dict:
    """Keep, swap and recompute in every block: recompute what the block's MLP (BERT: the
    whole layer) saves internally, swap attention tensors and everything outside blocks."""
    calls = workload.meta["op_calls"]
    actions = {}
    for t in workload.saved_tensors:
        if t.producer is None:
            continue
        p = calls[workload.op_index[t.producer]]
        readers = [calls[workload.op_index[r]] for r in t.bwd_readers]
        same_block = _block(p) is not None and all(_block(r) == _block(p) for r in readers)
        if same_block and workload.name.startswith("BertLike"):
            actions[t.name] = Action.RECOMPUTE
        elif same_block and "mlp" in _segments(p) and all("mlp" in _segments(r) for r in readers):
            actions[t.name] = Action.RECOMPUTE
        elif "attn" in _segments(p) or _block(p) is None:
            actions[t.name] = Action.SWAP
    return actions


def all_of(workload, action) -> dict:
    return {t.name: action for t in workload.saved_tensors if t.producer is not None}


PLANS = {"all-swap": lambda w: all_of(w, Action.SWAP), "all-recompute": lambda w: all_of(w, Action.RECOMPUTE),
         "mixed": mixed_actions}


def runnable_plan(workload, actions, policy):
    """A plan with prefetch steps the runtime can meet, budgeted at its simulated peak."""
    plan = make_plan(workload, actions, policy=policy, budget_bytes=None,
                     prefetch_step=runtime_prefetch_steps(workload, actions))
    peak = simulate(workload, HW, plan).peak_memory_bytes
    return dataclasses.replace(plan, budget_bytes=peak)


@pytest.mark.parametrize("kind", sorted(EXAMPLES))
@pytest.mark.parametrize("plan_kind", sorted(PLANS))
def test_training_under_plan_is_bitwise_and_runs_what_plan_predicts(profiled, kind, plan_kind):
    base, batches, workload = profiled(kind)
    plan = runnable_plan(workload, PLANS[plan_kind](workload), plan_kind)
    emap = build_execution_map(workload, plan)
    assert emap.aligned, emap.notes
    counts = {a: plan.count(a) for a in Action}
    if plan_kind == "mixed":
        assert counts[Action.KEEP] and counts[Action.SWAP] and counts[Action.RECOMPUTE]

    reference, planned = copy.deepcopy(base), copy.deepcopy(base)
    ref_losses, ref_grads = train(reference, batches)
    # The replay path, whose manager counts what is held (tests/test_runtime_paths.py: the fast paths).
    runtime = apply_plan(planned, plan, workload, backend="replay")
    losses, grads = train(planned, batches, runtime)
    for a, b in zip(ref_losses, losses):
        assert torch.equal(a, b)
    assert ref_grads.keys() == grads.keys()
    for name in ref_grads:
        assert torch.equal(ref_grads[name], grads[name]), name

    stats = runtime.stats
    swapped = plan.bytes_with(workload, Action.SWAP)
    assert stats.step_d2h_bytes == swapped == emap.swap_bytes
    assert stats.step_h2d_bytes == swapped
    assert stats.d2h_bytes == STEPS * swapped
    assert stats.late_prefetches == 0
    assert stats.host_pool_allocations == (1 if swapped else 0)
    assert stats.peak_device_saved_bytes <= plan.budget_bytes
    assert stats.device_saved_bytes == 0  # everything released after backward

    # Recompute FLOPs: one more step, counted, with and without the plan.
    predicted = sum(workload.ops[workload.op_index[g]].flops for grp in plan.recompute_groups.values() for g in grp)
    extra = step_flops(planned, batches[0], runtime) - step_flops(reference, batches[0])
    assert extra == predicted == emap.runtime_recompute_flops
    if plan_kind == "all-swap":
        assert predicted == 0
    else:
        assert predicted > 0


def test_keep_plan_holds_exactly_the_profiled_saved_bytes_and_swap_holds_less(profiled):
    base, batches, workload = profiled("gpt2")
    held = {}
    for label, actions in (("keep", {}), ("swap", all_of(workload, Action.SWAP))):
        plan = runnable_plan(workload, actions, label)
        # The replay path's manager counts saved bytes (the all-keep fast path tracks none).
        runtime = apply_plan(copy.deepcopy(base), plan, workload, backend="replay")
        train(runtime.model, batches[:1], runtime)
        held[label] = runtime.stats.peak_device_saved_bytes
    assert held["keep"] == workload.saved_bytes
    # With host copies done at once, a swapped tensor is on the device only while copied back:
    # at most the largest prefetch window plus the step inputs.
    assert held["swap"] < workload.saved_bytes // 2


def test_plan_for_another_model_is_refused_before_any_step(profiled):
    base, batches, workload = profiled("gpt2")
    plan = runnable_plan(workload, mixed_actions(workload), "mixed")
    other = make_example("gpt2", ExampleConfig(hidden=48, heads=4))
    with pytest.raises(PlanMismatchError, match="another model"):
        apply_plan(other, plan, workload)
    _, _, llama_workload = profiled("llama")
    with pytest.raises(PlanMismatchError, match="make the plan again"):
        apply_plan(base, plan, llama_workload)


def test_changed_batch_shape_is_a_mismatch_during_forward_not_a_wrong_gradient(profiled):
    base, batches, workload = profiled("gpt2")
    plan = runnable_plan(workload, mixed_actions(workload), "mixed")
    model = copy.deepcopy(base)
    runtime = apply_plan(model, plan, workload)
    tokens, targets = make_batch(ExampleConfig(micro_batch=3))
    with pytest.raises(PlanMismatchError, match="changed since profiling"):
        with runtime:
            loss_fn(model, (tokens, targets))
    assert all(p.grad is None for p in model.parameters())


def test_apply_finds_the_last_profile_of_the_model_object():
    model = make_example("llama")
    batch = make_batch()
    with pytest.raises(PlanMismatchError, match="pass workload="):
        apply_plan(model, None)
    workload = profile_model(model, batch, loss_fn, repeats=1)
    plan = runnable_plan(workload, all_of(workload, Action.SWAP), "swap")
    with apply_plan(model, plan) as runtime:
        loss_fn(model, batch).backward()
    assert runtime.stats.step_d2h_bytes == plan.bytes_with(workload, Action.SWAP)
