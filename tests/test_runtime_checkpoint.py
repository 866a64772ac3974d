"""The checkpoint backend (slackswap.apply(..., backend="checkpoint")) runs module-aligned plans as
planned and refuses the others before any step.

Every op in these tiny float32 CPU models is deterministic (no atomics on CPU), so training is
compared with torch.equal, no tolerance; GPT-2-like and BERT-like use dropout, so equality also
shows that checkpoint's RNG preservation redraws the same masks.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest

torch = pytest.importorskip("torch")


import slackswap  # noqa: E402
from slackswap import Action, get_hardware, make_plan, simulate  # noqa: E402
from slackswap.errors import SlackswapError, ValidationError  # noqa: E402
from slackswap.examples import EXAMPLES, loss_fn  # noqa: E402
from slackswap.planners.full_recompute import shape_input_regions  # noqa: E402
from slackswap.schedule import first_need_step  # noqa: E402
from slackswap.runtime import CheckpointBackendError, build_checkpoint_map  # noqa: E402
from runtime_helpers import profile_cache, step_flops as _step_flops, train as _train  # noqa: E402

HW = get_hardware("a100-80gb-pcie4")
STEPS = 3


@pytest.fixture(scope="module")
def profiled():
    return profile_cache(STEPS, HW)


def train(model, batches, runtime=None):
    return _train(model, batches, runtime, seed=1234)


def step_flops(model, batch, runtime=None) -> int:
    return _step_flops(model, batch, runtime, seed=5)



def _block(call: str) -> str | None:
    s = call.split("@")[0].split(".")
    return ".".join(s[:2]) if len(s) >= 2 and s[1].isdigit() else None


def block_actions(workload, outside: Action) -> dict:
    """Recompute every tensor a block makes and reads only itself; ``outside`` for what crosses a
    block boundary or is made before the first block (the blocks' inputs among them); keep the rest."""
    calls = workload.meta["op_calls"]
    actions = {}
    for t in workload.saved_tensors:
        if t.producer is None:
            continue
        producer = workload.op_index[t.producer]
        block = _block(calls[producer])
        if block is not None and {_block(calls[workload.op_index[r]]) for r in t.bwd_readers} == {block}:
            actions[t.name] = Action.RECOMPUTE
        elif workload.ops[producer].layer < workload.ops[-1].layer - 1:
            actions[t.name] = outside
    return actions


PLANS = {"blocks": lambda w: block_actions(w, Action.KEEP), "mixed": lambda w: block_actions(w, Action.SWAP)}


def budgeted_plan(workload, actions, policy):
    """A plan with the runtime's prefetch steps, budgeted at its own simulated peak. Re-running a
    dropout mask re-runs the op that makes its shape input, as checkpointing the block does."""
    regions = shape_input_regions(workload)
    plan = make_plan(workload, actions, policy=policy, budget_bytes=None,
                     prefetch_step=first_need_step(workload, actions, regions), recompute_regions=regions)
    return dataclasses.replace(plan, budget_bytes=simulate(workload, HW, plan).peak_memory_bytes)


def check_runs_as_planned(base, batches, workload, plan, runtime):
    reference = copy.deepcopy(base)
    ref_losses, ref_grads = train(reference, batches)
    losses, grads = train(runtime.model, batches, runtime)
    assert all(torch.equal(a, b) for a, b in zip(ref_losses, losses))
    assert ref_grads.keys() == grads.keys()
    for name in ref_grads:
        assert torch.equal(ref_grads[name], grads[name]), name

    stats = runtime.stats
    swapped = plan.bytes_with(workload, Action.SWAP)
    assert stats.step_d2h_bytes == stats.step_h2d_bytes == swapped
    assert stats.d2h_bytes == STEPS * swapped
    assert stats.late_prefetches == 0
    assert stats.device_saved_bytes == 0
    assert stats.peak_device_saved_bytes <= runtime.checkpoint_map.predicted_peak_bytes <= plan.budget_bytes

    predicted = sum(workload.ops[workload.op_index[g]].flops for grp in plan.recompute_groups.values() for g in grp)
    assert predicted > 0
    assert step_flops(runtime.model, batches[0], runtime) - step_flops(reference, batches[0]) == predicted


@pytest.mark.parametrize("kind", sorted(EXAMPLES))
@pytest.mark.parametrize("plan_kind", sorted(PLANS))
def test_module_aligned_plan_runs_as_planned_under_checkpoint(profiled, kind, plan_kind):
    base, batches, workload = profiled(kind)
    plan = budgeted_plan(workload, PLANS[plan_kind](workload), plan_kind)
    if plan_kind == "mixed":
        assert all(plan.count(a) for a in Action), "the mixed plan keeps, swaps and recomputes"
    runtime = slackswap.apply(copy.deepcopy(base), plan, backend="checkpoint", workload=workload, hardware=HW)
    cmap = runtime.checkpoint_map
    assert cmap.faithful
    # One region per block; each is rebuilt at the step of its first unpack.
    blocks = sorted({_block(c) for c in workload.meta["op_calls"] if _block(c)})
    assert [r.call for r in cmap.regions] == blocks
    check_runs_as_planned(base, batches, workload, plan, runtime)
    n = len(workload.ops)
    assert runtime.manager.group_steps == sorted(n - 1 - r.trigger for r in cmap.regions)
    if plan_kind == "mixed":
        # Each block's input is swapped through our hooks around the checkpointed call.
        args = {a for r in cmap.regions for a in workload.meta["call_args"][r.call] if a}
        assert args and all(plan.actions[a] is Action.SWAP for a in args)


def test_planner_full_recompute_plan_runs_under_checkpoint(profiled):
    base, batches, workload = profiled("gpt2")
    plan = slackswap.plan(workload, HW, budget=0.7, policy="full-recompute")
    runtime = slackswap.apply(copy.deepcopy(base), plan, backend="checkpoint", workload=workload)
    check_runs_as_planned(base, batches, workload, plan, runtime)


def attention_swapped_actions(workload) -> dict:
    """Recompute the MLPs, swap what the attention saves: a swap inside a block."""
    calls = workload.meta["op_calls"]
    actions = {}
    for t in workload.saved_tensors:
        if t.producer is None:
            continue
        where = calls[workload.op_index[t.producer]].split(".")
        readers = [calls[workload.op_index[r]].split(".") for r in t.bwd_readers]
        if "mlp" in where and all("mlp" in r for r in readers):
            actions[t.name] = Action.RECOMPUTE
        elif "attn" in where:
            actions[t.name] = Action.SWAP
    return actions


def test_plan_that_swaps_inside_a_checkpointed_call_is_refused_before_any_step(profiled):
    base, _, workload = profiled("gpt2")
    # Recompute the rest of block 0 as well: its attention swaps then sit inside that checkpointed call.
    actions = {k: v for k, v in block_actions(workload, Action.KEEP).items() if k.startswith("h.0.")}
    actions.update(attention_swapped_actions(workload))
    plan = budgeted_plan(workload, actions, "swap-inside")
    model = copy.deepcopy(base)
    with pytest.raises(CheckpointBackendError) as info:
        slackswap.apply(model, plan, backend="checkpoint", workload=workload)
    message = str(info.value)
    assert "\n" not in message and "planned swap" in message and 'backend="replay"' in message
    assert isinstance(info.value, SlackswapError)
    # Nothing was installed and nothing ran; the replay backend runs the same plan.
    assert not any("forward" in m.__dict__ for m in model.modules())
    assert all(p.grad is None for p in model.parameters())
    assert slackswap.apply(model, plan, workload=workload).execution.aligned


@pytest.mark.parametrize("kind,reason", [("gpt2", "re-run"), ("llama", "budget")])
def test_planner_plans_that_checkpoint_cannot_run_exactly_are_refused(profiled, kind, reason):
    """slackswap at 50%: on GPT-2-like a region would re-run dropout ops the plan keeps (checkpoint
    restores the RNG at the region's start, so every random op in front of a re-run one draws
    again); on Llama-like, rebuilding each region at its first unpack holds more than the budget."""
    base, _, workload = profiled(kind)
    plan = slackswap.plan(workload, HW, budget=0.5, policy="slackswap")
    cmap = build_checkpoint_map(workload, plan, HW)
    assert not cmap.faithful and reason in cmap.notes[0]
    with pytest.raises(CheckpointBackendError, match=reason):
        slackswap.apply(copy.deepcopy(base), plan, backend="checkpoint", workload=workload)


def test_budget_refusal_names_the_bytes(profiled):
    base, _, workload = profiled("llama")
    plan = budgeted_plan(workload, PLANS["blocks"](workload), "blocks")
    predicted = build_checkpoint_map(workload, plan, HW).predicted_peak_bytes
    tight = dataclasses.replace(plan, budget_bytes=predicted - 1)
    with pytest.raises(CheckpointBackendError, match=f"hold {predicted} bytes .* budget of {predicted - 1} bytes"):
        slackswap.apply(copy.deepcopy(base), tight, backend="checkpoint", workload=workload, hardware=HW)


def test_unknown_backend_and_misplaced_hardware_are_errors(profiled):
    base, _, workload = profiled("llama")
    plan = make_plan(workload, {}, policy="keep", budget_bytes=None)
    with pytest.raises(ValidationError, match="unknown runtime backend 'sac'"):
        slackswap.apply(base, plan, backend="sac", workload=workload)
    with pytest.raises(ValidationError, match="checkpoint"):
        slackswap.apply(base, plan, workload=workload, hardware=HW, backend="replay")


class _UserBug(Exception):
    pass


def test_a_failed_step_under_checkpoint_releases_the_pool_and_training_goes_on(profiled):
    base, batches, workload = profiled("gpt2")
    plan = budgeted_plan(workload, PLANS["mixed"](workload), "mixed")
    model = copy.deepcopy(base)
    runtime = slackswap.apply(model, plan, backend="checkpoint", workload=workload, hardware=HW)
    with runtime:
        loss_fn(model, batches[0]).backward()
    model.zero_grad(set_to_none=True)
    assert runtime.manager.pool is not None
    with pytest.raises(_UserBug):
        with runtime:
            loss_fn(model, batches[0])  # swaps copied out, checkpointed calls hold their arguments
            raise _UserBug
    assert runtime.manager.pool is None and runtime.stats.device_saved_bytes == 0
    # the same runtime trains on, bit for bit like unmodified training
    expected_losses, expected_grads = train(copy.deepcopy(base), batches)
    got_losses, got_grads = train(model, batches, runtime)
    assert all(torch.equal(a, b) for a, b in zip(expected_losses, got_losses))
    assert all(torch.equal(expected_grads[n], got_grads[n]) for n in expected_grads)
