"""Runtime lifetime, repeated backward and misuse (issue 15, defects 1, 2 and 13), on the CPU GPT-2
example.

- A new ``slackswap.apply`` per step (the README's pattern) must not keep the older runtimes,
  their swap managers and host pools alive: after the steps and ``gc.collect()`` no weak
  reference to an older manager is alive, under recompute plans (both backends) and a
  swap plan.
- ``loss.backward(retain_graph=True); loss.backward()`` under a plan gives the gradients of
  the same two backward passes without slackswap, bit for bit.
- Misuse is named as what it is (RuntimeUsageError, or a ValidationError from ``profile``), not
  as a plan mismatch: nested applies, a double backward, the model called twice in a step, a
  loss_fn that runs ops before the model.
"""

from __future__ import annotations

import gc
import weakref

import pytest

torch = pytest.importorskip("torch")

import slackswap  # noqa: E402
from slackswap.errors import RuntimeUsageError, ValidationError  # noqa: E402
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


@pytest.mark.parametrize("inner_backend", ["replay", "checkpoint"])
def test_nested_applies_are_refused_by_name(gpt2, inner_backend):
    model, batch, workload = gpt2
    plan = slackswap.plan(workload, budget=0.7, policy="full-recompute")
    inner = slackswap.apply(model, plan, workload=workload, backend=inner_backend)
    with slackswap.apply(model, plan, workload=workload):
        with pytest.raises(RuntimeUsageError, match="nested applies"):
            with inner:
                pass
    with inner:  # usable once the outer one is gone
        loss_fn(model, batch).backward()


def test_double_backward_is_refused_by_name(gpt2):
    model, batch, workload = gpt2
    plan = slackswap.plan(workload, budget=0.7, policy="full-recompute")
    with pytest.raises(RuntimeUsageError, match="create_graph=True"):
        with slackswap.apply(model, plan, workload=workload, backend="replay"):
            loss_fn(model, batch).backward(create_graph=True)
    model.zero_grad(set_to_none=True)


def test_a_second_model_call_in_one_step_is_refused_by_name():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    x = torch.randn(3, 8)
    workload = profile_model(model, x, lambda m, b: m(b).pow(2).mean(), repeats=1, warmup=0)
    plan = slackswap.plan(workload, budget=1.0, policy="ideal")
    with pytest.raises(RuntimeUsageError, match="called again during its step"):
        with slackswap.apply(model, plan, workload=workload, backend="replay"):
            (model(x) + model(x)).pow(2).mean().backward()


def nested_mlp():
    """Two blocks and a head (module calls the checkpoint backend can wrap), the loss outside the model."""
    nn = torch.nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Sequential(nn.Linear(8, 16), nn.Tanh()), nn.Sequential(nn.Linear(16, 16), nn.GELU()),
                          nn.Linear(16, 4))
    x = torch.randn(3, 8)

    def loss(m, b):
        return m(b).pow(2).mean()

    workload = profile_model(model, x, loss, repeats=1, warmup=0)
    return model, x, loss, workload


def gradients_of(model, run) -> list:
    model.zero_grad(set_to_none=True)
    run()
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("backend", ["replay", "checkpoint"])
def test_a_forward_without_its_loss_then_a_new_step_is_not_a_second_call(backend):
    # A forward with grad whose output is dropped (or an evaluation under grad) runs the model's ops
    # but not the loss's; its graph is gone when the next step calls the model, which is a new step.
    from slackswap import Action, make_plan
    from slackswap.runtime import runtime_prefetch_steps

    model, x, loss, workload = nested_mlp()
    # Recompute inside the second block (both backends run it); swap the first block's output too
    # under replay.
    actions = {"1.0/addmm#1:0": Action.RECOMPUTE}
    if backend == "replay":
        actions["0.1/tanh#0:0"] = Action.SWAP
    plan = make_plan(workload, actions, policy="test", budget_bytes=None,
                     prefetch_step=runtime_prefetch_steps(workload, actions))
    expected = gradients_of(model, lambda: loss(model, x).backward())
    runtime = slackswap.apply(model, plan, workload=workload, backend=backend)

    def dropped_forward_then_step():
        with runtime:
            model(x)  # output dropped: the forward is abandoned
            loss(model, x).backward()

    def evaluation_then_step():
        with runtime:
            with torch.enable_grad():
                predictions = model(x)
            assert predictions.requires_grad
            del predictions  # evaluation done, its graph with it
            loss(model, x).backward()

    for run in (dropped_forward_then_step, evaluation_then_step):
        got = gradients_of(model, run)
        assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert runtime.stats.steps == 4  # every forward began a step, the abandoned ones included


def test_a_second_call_while_the_first_output_is_held_is_still_refused():
    model, x, loss, workload = nested_mlp()
    plan = slackswap.plan(workload, budget=1.0, policy="ideal")
    # The replay path's refusal (an all-keep plan would take the keep path, which runs both calls as
    # plain PyTorch does).
    with pytest.raises(RuntimeUsageError, match="called again during its step.*drop its outputs"):
        with slackswap.apply(model, plan, workload=workload, backend="replay"):
            first = model(x)
            (first + model(x)).pow(2).mean().backward()
    # Held only through the graph of a loss op run on it (the output tensor itself is gone): refused too.
    with pytest.raises(RuntimeUsageError, match="called again during its step"):
        with slackswap.apply(model, plan, workload=workload, backend="replay"):
            (model(x).pow(2) + model(x).pow(2)).mean().backward()


def test_backward_of_an_earlier_forward_names_the_second_model_call(gpt2):
    model, batch, workload = gpt2
    plan = slackswap.plan(workload, budget=0.7, policy="full-recompute")
    with pytest.raises(slackswap.errors.StaleStepError, match="calls the model twice"):
        with slackswap.apply(model, plan, workload=workload, backend="replay"):
            (loss_fn(model, batch) + loss_fn(model, batch)).backward()
    model.zero_grad(set_to_none=True)


@pytest.mark.parametrize("bad_loss,message", [
    (lambda m, b: m(b[0] + 0, b[1]), "before calling the model"),
    (lambda m, b: m(*b) + m(*b), "called the model 2 times"),
])
def test_profile_refuses_a_loss_fn_the_runtime_could_not_follow(bad_loss, message):
    model = make_example("gpt2")
    with pytest.raises(ValidationError, match=message):
        profile_model(model, make_batch(), bad_loss, repeats=1, warmup=0)
