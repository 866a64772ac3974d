"""Plans that travel (issue 14, item 3): a plan file made from a profile applies to any model object of
the same signature, in another process, without workload=; another model or batch is refused
with PlanMismatchError before any gradient exists."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

import slackswap  # noqa: E402
from slackswap import Plan  # noqa: E402
from slackswap.errors import PlanMismatchError  # noqa: E402
from slackswap.examples import ExampleConfig, loss_fn, make_batch, make_example  # noqa: E402
from runtime_helpers import loss_and_grads  # noqa: E402


def one_step(model, batch, runtime=None):
    return loss_and_grads(model, batch, loss_fn, runtime)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    model = make_example("gpt2")
    batch = make_batch(seed=0)
    plan = slackswap.plan(slackswap.profile(model, batch, loss_fn, repeats=1), budget=0.4, policy="capuchin")
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    plan.save(path)
    return plan, path, one_step(make_example("gpt2"), batch)


def test_plan_file_carries_its_profile_and_a_built_in_plan_does_not(saved):
    plan, path, _ = saved
    loaded = Plan.load(path)
    assert loaded == plan and loaded.profile is not None
    assert loaded.profile.fingerprint == plan.workload_fingerprint
    assert loaded.profile.meta["model_signature"] == plan.profile.meta["model_signature"]
    assert "profile" not in slackswap.plan("gpt2-xl", budget=0.5).to_dict()


def test_loaded_plan_trains_a_fresh_model_object_and_refuses_another_model_or_batch(saved):
    plan, path, reference = saved
    loaded = Plan.load(path)
    model = copy.deepcopy(make_example("gpt2"))  # never profiled
    runtime = slackswap.apply(model, loaded)
    got = one_step(model, make_batch(seed=0), runtime)
    assert all(torch.equal(a, b) for a, b in zip(got, reference))
    assert runtime.stats.d2h_bytes + runtime.stats.recompute_ops > 0
    # another batch shape: refused in the forward, before any gradient
    model.zero_grad(set_to_none=True)
    short = tuple(t[:, :8].contiguous() for t in make_batch(seed=0))
    with pytest.raises(PlanMismatchError):
        one_step(model, short, slackswap.apply(model, loaded))
    assert all(p.grad is None for p in model.parameters())
    # another model: refused before anything runs
    other = make_example("gpt2", ExampleConfig(layers=3))
    with pytest.raises(PlanMismatchError, match="profiled from another model"):
        slackswap.apply(other, loaded)


def test_plan_file_applies_in_another_process(saved, tmp_path):
    _, path, reference = saved
    out = tmp_path / "grads.pt"
    code = textwrap.dedent(f"""
        import torch, slackswap
        from slackswap.examples import loss_fn, make_batch, make_example
        model = make_example("gpt2")
        runtime = slackswap.apply(model, slackswap.Plan.load({str(path)!r}))
        torch.manual_seed(5)
        with runtime:
            loss = loss_fn(model, make_batch(seed=0))
            loss.backward()
        torch.save([loss.detach()] + [p.grad for p in model.parameters()], {str(out)!r})
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
    got = torch.load(out)
    assert all(torch.equal(a, b) for a, b in zip(got, reference)) and len(got) == len(reference)


def test_plan_file_whose_profile_was_edited_is_refused(saved, tmp_path):
    from slackswap.errors import SlackswapError

    _, path, _ = saved
    data = json.loads(path.read_text())
    data["profile"]["tensors"][-1]["size_bytes"] += 4
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(data))
    with pytest.raises(SlackswapError):
        Plan.load(edited)
