"""Runtime lifetime and repeated backward (issue 15, defects 1 and 2), on the CPU GPT-2 example.

- A new ``slackswap.apply`` per step (the README's pattern) must not keep the older runtimes,
  their swap managers and host pools alive: after the steps and ``gc.collect()`` no weak
  reference to an older manager is alive, under recompute plans (both backends) and a
  swap plan.
- ``loss.backward(retain_graph=True); loss.backward()`` under a plan gives the gradients of
  the same two backward passes without slackswap, bit for bit.
"""

from __future__ import annotations

import gc
import weakref

import pytest

torch = pytest.importorskip("torch")

import slackswap  # noqa: E402
from slackswap.examples import loss_fn, make_batch, make_example  # noqa: E402
from slackswap.profiler import profile_model  # noqa: E402


@pytest.fixture(scope="module")
def gpt2():
    model = make_example("gpt2")
    batch = make_batch()
    workload = profile_model(model, batch, loss_fn, repeats=1)
    return model, batch, workload


CASES = [("full-recompute", "replay"), ("full-recompute", "checkpoint"), ("swap-only", "replay")]


@pytest.mark.parametrize("policy,backend", CASES)
def test_a_new_apply_per_step_leaves_no_runtime_alive(gpt2, policy, backend):
    model, batch, workload = gpt2
    plan = slackswap.plan(workload, budget=0.7, policy=policy)
    managers = []
    for _ in range(3):
        runtime = slackswap.apply(model, plan, workload=workload, backend=backend)
        managers.append(weakref.ref(runtime.manager))
        with runtime:
            loss_fn(model, batch).backward()
        del runtime
    model.zero_grad(set_to_none=True)
    gc.collect()
    alive = [m for m in managers if m() is not None]
    assert alive == [], f"{len(alive)} of {len(managers)} swap managers still alive after gc.collect()"


def two_backward_grads(model, batch, runtime=None):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(3)  # dropout
    if runtime is None:
        loss = loss_fn(model, batch)
        loss.backward(retain_graph=True)
        loss.backward()
    else:
        with runtime:
            loss = loss_fn(model, batch)
            loss.backward(retain_graph=True)
            loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("policy,backend", CASES)
def test_backward_twice_on_a_retained_graph_gives_the_plain_gradients(gpt2, policy, backend):
    model, batch, workload = gpt2
    plan = slackswap.plan(workload, budget=0.7, policy=policy)
    runtime = slackswap.apply(model, plan, workload=workload, backend=backend)
    expected = two_backward_grads(model, batch)
    got = two_backward_grads(model, batch, runtime)
    assert runtime.stats.steps == 1
    for name, grad in expected.items():
        assert torch.equal(got[name], grad), name
