"""Runtime safety (issue 6, item 3), on the CPU example models.

What is tested here, against slackswap.runtime as it stands:

- a swapped tensor comes back bit-identical: a SHA-256 of its bytes at the pack hook equals
  the one at the unpack hook, for every swapped tensor of every step over many optimizer
  steps, and the training matches unplanned training bit for bit;
- an exception inside a training step (the user's loss, or a failure inside the runtime)
  leaves the model usable: the next step, under the same runtime, under a new
  ``slackswap.apply`` or without any, gives the reference gradients;
- ``slackswap.apply`` can be entered again after an error;
- what the runtime does not do yet is pinned by strict xfails, so that the day it does,
  the marks must come off: falling back when the pinned pool cannot be allocated, naming the
  tensor and the bytes when device memory runs out, releasing the pool after a failed step.

Failures are injected by patching the swap manager (a CPU run cannot exhaust pinned or
device memory on purpose); each injection raises what torch raises in the real case.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import gc
import hashlib
import warnings

import pytest

torch = pytest.importorskip("torch")

import slackswap  # noqa: E402
from slackswap import Action, get_hardware, make_plan, simulate  # noqa: E402
from slackswap.examples import loss_fn, make_batch, make_example  # noqa: E402
from slackswap.profiler import profile_model  # noqa: E402
from slackswap.runtime import runtime_prefetch_steps  # noqa: E402
from slackswap.errors import RuntimeFallbackWarning, RuntimeMemoryError, StaleStepError  # noqa: E402
from slackswap.runtime.replay import ForwardRecorder  # noqa: E402
from slackswap.runtime.swap import SwapManager  # noqa: E402

HW = get_hardware("a100-80gb-pcie4")
MANY_STEPS = 12


@pytest.fixture(scope="module")
def gpt2():
    model = make_example("gpt2")
    batches = [make_batch(seed=s) for s in range(MANY_STEPS)]
    workload = profile_model(model, batches[0], loss_fn, repeats=1)
    return model, batches, workload


def plan_for(workload, how: str):
    """'swap' / 'recompute': every tensor that can be; 'mixed': alternate swap and keep."""
    candidates = [t.name for t in workload.saved_tensors if t.producer is not None]
    if how in ("swap", "recompute"):
        actions = {name: Action(how) for name in candidates}
    else:
        cycle = (Action.SWAP, Action.KEEP, Action.SWAP)
        actions = {name: cycle[i % 3] for i, name in enumerate(candidates)}
    plan = make_plan(workload, actions, policy=how, budget_bytes=None,
                     prefetch_step=runtime_prefetch_steps(workload, actions))
    return dataclasses.replace(plan, budget_bytes=simulate(workload, HW, plan).peak_memory_bytes)


def one_step(model, batch, runtime=None):
    torch.manual_seed(7)  # the examples' dropout draws from the global generator
    model.zero_grad(set_to_none=True)
    with runtime if runtime is not None else contextlib.nullcontext():
        loss = loss_fn(model, batch)
        loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def assert_same(a, b):
    (loss_a, grads_a), (loss_b, grads_b) = a, b
    assert torch.equal(loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        assert torch.equal(grads_a[name], grads_b[name]), name


def digest(t) -> str:
    return hashlib.sha256(t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


# ---- a swapped tensor comes back bit-identical -------------------------------------------------

@pytest.mark.parametrize("how", ["swap", "mixed"])
def test_swapped_tensors_come_back_bit_identical_over_many_steps(gpt2, monkeypatch, generated_cases, how):
    base, batches, workload = gpt2
    plan = plan_for(workload, how)
    reference, planned = copy.deepcopy(base), copy.deepcopy(base)
    runtime = slackswap.apply(planned, plan, workload=workload)

    packed: dict[int, tuple[str, str]] = {}
    checked = {"swap": 0}
    real_pack, real_unpack = SwapManager.pack, SwapManager.unpack

    def pack(self, t):
        h = real_pack(self, t)
        if not isinstance(h, torch.Tensor) and h.state.action is Action.SWAP:
            self.busy = True  # the checksum's own ops are not forward ops of the model
            try:
                packed[id(h)] = (h.state.name, digest(t))
            finally:
                self.busy = False
        return h

    def unpack(self, h):
        t = real_unpack(self, h)
        if id(h) in packed:
            name, before = packed[id(h)]
            assert digest(t) == before, f"swapped tensor {name!r} came back different"
            checked["swap"] += 1
        return t

    monkeypatch.setattr(SwapManager, "pack", pack)
    monkeypatch.setattr(SwapManager, "unpack", unpack)
    opt_ref = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    opt_run = torch.optim.SGD(planned.parameters(), lr=0.05, momentum=0.9)
    for batch in batches:  # the weights move every step, so every step's activations differ
        expected = one_step(reference, batch)
        got = one_step(planned, batch, runtime)
        assert_same(expected, got)
        opt_ref.step()
        opt_run.step()
        packed.clear()
    swapped_per_step = plan.count(Action.SWAP)
    assert swapped_per_step > 0 and checked["swap"] >= MANY_STEPS * swapped_per_step
    assert runtime.stats.steps == MANY_STEPS and runtime.stats.late_prefetches == 0
    generated_cases[f"runtime: swapped tensors checksummed ({how} plan)"] += checked["swap"]


# ---- errors inside a step ----------------------------------------------------------------------

class UserBug(Exception):
    pass


def test_an_exception_in_the_users_step_leaves_the_model_usable(gpt2):
    base, batches, workload = gpt2
    plan = plan_for(workload, "mixed")
    reference, planned = copy.deepcopy(base), copy.deepcopy(base)
    expected = one_step(reference, batches[0])
    runtime = slackswap.apply(planned, plan, workload=workload)
    with pytest.raises(UserBug):
        with runtime:
            loss = loss_fn(planned, batches[0])  # forward done, swaps issued
            raise UserBug("the loss was NaN")
    del loss
    gc.collect()
    assert runtime.stats.device_saved_bytes == 0, "saved tensors of the abandoned step still counted"
    # same runtime, a new one, and none at all: all give the reference step
    assert_same(expected, one_step(planned, batches[0], runtime))
    assert_same(expected, one_step(planned, batches[0], slackswap.apply(planned, plan, workload=workload)))
    assert_same(expected, one_step(planned, batches[0]))


def test_an_exception_during_backward_leaves_the_model_usable(gpt2, monkeypatch):
    """A failure inside the runtime's own copy back, mid-backward: re-entry works afterwards."""
    base, batches, workload = gpt2
    plan = plan_for(workload, "swap")
    planned = copy.deepcopy(base)
    expected = one_step(copy.deepcopy(base), batches[0])
    runtime = slackswap.apply(planned, plan, workload=workload)
    real_copy_in = SwapManager._copy_in

    def failing(self, state):
        raise RuntimeError("injected copy-back failure")

    monkeypatch.setattr(SwapManager, "_copy_in", failing)
    with pytest.raises(RuntimeError, match="injected"):
        one_step(planned, batches[0], runtime)
    monkeypatch.setattr(SwapManager, "_copy_in", real_copy_in)
    gc.collect()
    assert_same(expected, one_step(planned, batches[0], runtime))
    assert runtime.stats.device_saved_bytes == 0


def test_apply_can_be_entered_again_after_an_error(gpt2):
    base, batches, workload = gpt2
    plan = plan_for(workload, "mixed")
    model = copy.deepcopy(base)
    runtime = slackswap.apply(model, plan, workload=workload)
    for _ in range(3):
        with pytest.raises(UserBug):
            with runtime:
                raise UserBug
        assert not runtime._active
    with runtime:
        with pytest.raises(RuntimeError, match="already active"):
            runtime.__enter__()
    # hooks are gone after exit: a plain step does not reach the manager
    packs = runtime.stats.packs
    one_step(model, batches[0])
    assert runtime.stats.packs == packs
    expected = one_step(copy.deepcopy(base), batches[0])
    assert_same(expected, one_step(model, batches[0], runtime))


# ---- failures: the host pool, device memory, a failed step (docs/runtime.md, Failures) --------------

def fallback_warnings(caught):
    return [w for w in caught if issubclass(w.category, RuntimeFallbackWarning)]


def test_pinned_pool_failure_falls_back_instead_of_crashing(gpt2, monkeypatch):
    base, batches, workload = gpt2
    plan = plan_for(workload, "swap")
    planned = copy.deepcopy(base)
    expected = [one_step(copy.deepcopy(base), batches[0]), one_step(copy.deepcopy(base), batches[1])]
    attempts = []

    def no_pinned_memory(self):
        attempts.append(1)
        raise RuntimeError("CUDA error: out of memory (cudaHostAlloc of the pinned pool)")

    monkeypatch.setattr(SwapManager, "_pool", no_pinned_memory)
    runtime = slackswap.apply(planned, plan, workload=workload)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [one_step(planned, batches[0], runtime), one_step(planned, batches[1], runtime)]
    for e, g in zip(expected, got):
        assert_same(e, g)
    swapped = [name for name, action in plan.actions.items() if action is Action.SWAP]
    size = {t.name: t.size_bytes for t in workload.tensors}
    swapped_bytes = sum(size[name] for name in swapped)
    (warning,) = fallback_warnings(caught)  # once, not once per step or per tensor
    message = str(warning.message)
    assert "\n" not in message
    assert "pinned" in message or "host pool" in message
    assert str(runtime.manager.pool_bytes) in message and "keeping" in message and "cudaHostAlloc" in message
    stats = runtime.stats
    assert len(attempts) == 1 and stats.host_pool_failures == 1 and stats.host_pool_allocations == 0
    assert stats.fallback_kept_tensors == 2 * len(swapped)
    assert stats.fallback_kept_bytes == 2 * swapped_bytes and stats.step_fallback_kept_bytes == swapped_bytes
    assert stats.d2h_bytes == 0 and stats.h2d_bytes == 0
    # kept like a keep plan: the manager held every swapped byte on the device at once
    assert stats.step_peak_device_saved_bytes >= swapped_bytes
    gc.collect()
    assert stats.device_saved_bytes == 0


def test_a_real_allocation_failure_of_the_pool_falls_back(gpt2):
    """No patched allocator: torch itself refuses a pool larger than the address space."""
    base, batches, workload = gpt2
    plan = plan_for(workload, "mixed")
    planned = copy.deepcopy(base)
    expected = one_step(copy.deepcopy(base), batches[0])
    runtime = slackswap.apply(planned, plan, workload=workload)
    runtime.manager.pool_bytes = 1 << 60
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = one_step(planned, batches[0], runtime)
    assert_same(expected, got)
    (warning,) = fallback_warnings(caught)
    assert str(1 << 60) in str(warning.message)
    assert runtime.stats.host_pool_failures == 1
    assert runtime.stats.fallback_kept_tensors == len({n for n, a in plan.actions.items() if a is Action.SWAP})


def test_device_oom_in_a_copy_back_names_the_tensor_and_the_bytes(gpt2, monkeypatch):
    base, batches, workload = gpt2
    plan = plan_for(workload, "swap")
    planned = copy.deepcopy(base)
    expected = one_step(copy.deepcopy(base), batches[0])
    real_copy_in = SwapManager._copy_in
    victim = {}

    def out_of_memory(self, state):
        victim.setdefault("name", state.name)
        victim.setdefault("size", state.size)
        victim.setdefault("held", self.stats.device_saved_bytes)
        raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {state.size} bytes")

    monkeypatch.setattr(SwapManager, "_copy_in", out_of_memory)
    runtime = slackswap.apply(planned, plan, workload=workload)
    with pytest.raises(RuntimeMemoryError) as info:
        one_step(planned, batches[0], runtime)
    monkeypatch.setattr(SwapManager, "_copy_in", real_copy_in)
    error = info.value
    message = str(error)
    assert "\n" not in message and isinstance(error.__cause__, torch.OutOfMemoryError)
    assert repr(victim["name"]) in message and f"({victim['size']} bytes)" in message
    assert f"holds {victim['held']} bytes" in message and f"budget is {plan.budget_bytes} bytes" in message
    assert (error.tensor, error.size_bytes, error.budget_bytes) == (victim["name"], victim["size"], plan.budget_bytes)
    gc.collect()
    assert runtime.manager.pool is None and runtime.stats.device_saved_bytes == 0
    assert_same(expected, one_step(planned, batches[0], runtime))


def test_device_oom_in_a_recompute_names_the_rebuilt_tensor(gpt2, monkeypatch):
    base, batches, workload = gpt2
    plan = plan_for(workload, "recompute")
    planned = copy.deepcopy(base)
    expected = one_step(copy.deepcopy(base), batches[0])
    real_record = ForwardRecorder._record

    def record(self, i, func, args, kwargs):
        recipe = real_record(self, i, func, args, kwargs)

        def out_of_memory(*a, **k):  # only the replay calls the recipe's op
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")

        recipe.func = out_of_memory
        return recipe

    monkeypatch.setattr(ForwardRecorder, "_record", record)
    runtime = slackswap.apply(planned, plan, workload=workload, backend="replay")  # the recipes' replay
    with pytest.raises(RuntimeMemoryError) as info:
        one_step(planned, batches[0], runtime)
    monkeypatch.setattr(ForwardRecorder, "_record", real_record)
    error = info.value
    # backward reaches the group of the last reader first, and the group's first op fails
    first_group = plan.recompute_groups[max(plan.recompute_groups, key=workload.op_index.get)]
    rebuilt_by_first_op = workload.ops[workload.op_index[first_group[0]]].outputs
    size = {t.name: t.size_bytes for t in workload.tensors}
    assert error.tensor in rebuilt_by_first_op and error.size_bytes == size[error.tensor] > 0
    assert repr(error.tensor) in str(error) and "rebuilding" in str(error) and "budget" in str(error)
    assert isinstance(error.__cause__, torch.OutOfMemoryError)
    gc.collect()
    assert runtime.stats.device_saved_bytes == 0
    assert_same(expected, one_step(planned, batches[0], runtime))


def test_a_failed_step_releases_the_pool(gpt2):
    base, batches, workload = gpt2
    plan = plan_for(workload, "swap")
    model = copy.deepcopy(base)
    expected = one_step(copy.deepcopy(base), batches[0])
    runtime = slackswap.apply(model, plan, workload=workload)
    assert_same(expected, one_step(model, batches[0], runtime))
    assert runtime.manager.pool is not None and runtime.stats.host_pool_allocations == 1
    with pytest.raises(UserBug):
        with runtime:
            loss = loss_fn(model, batches[0])  # every swap copied out into the pool
            raise UserBug
    assert runtime.manager.pool is None and runtime.stats.host_pool_bytes == 0
    assert runtime.stats.host_pool_releases == 1 and runtime.stats.device_saved_bytes == 0
    # the abandoned graph cannot read memory the next step reuses: a clear error, not a wrong gradient,
    # and its backward does not drive the clock of the step that runs now
    torch.manual_seed(7)
    model.zero_grad(set_to_none=True)
    with runtime:
        current = loss_fn(model, batches[0])
        with pytest.raises(StaleStepError, match="abandoned"):
            loss.backward()
        assert runtime.manager.clock == -1 and runtime.stats.step_h2d_bytes == 0
        current.backward()
    assert_same(expected, (current.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    assert runtime.stats.late_prefetches == 0
    del loss
    gc.collect()
    assert_same(expected, one_step(model, batches[0], runtime))
    assert runtime.stats.host_pool_allocations == 2 and runtime.manager.pool is not None
