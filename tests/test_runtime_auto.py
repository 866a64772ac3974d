"""slackswap.auto (issue 14, item 2): a plan per input signature, profiled and planned once.

- Batches of changing sequence lengths train bit-identically to plain training (losses, gradients,
  parameters and the RNG stream after the last step), with one profile per new length, including
  the steps on which a length is first seen.
- With cache_dir a fresh model object (as in a new process) reads the plans instead of profiling.
- A batch of a known signature that takes another code path is caught before any gradient,
  profiled as a variant and run again from the same RNG state: still bit-identical.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

import slackswap  # noqa: E402
from slackswap.errors import BudgetError, PlanMismatchError  # noqa: E402
from slackswap.examples import loss_fn, make_batch, make_example  # noqa: E402
from slackswap.runtime.auto import batch_signature  # noqa: E402

LENGTHS = (16, 8, 16, 12, 8)


def batches(lengths=LENGTHS):
    return [tuple(t[:, :n].contiguous() for t in make_batch(seed=i)) for i, n in enumerate(lengths)]


def train(model, data, step):
    """SGD-momentum steps; each step's loss, the last gradients and parameters, and the RNG state after."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(1234)  # dropout draws from here
    losses = []
    for batch in data:
        opt.zero_grad(set_to_none=True)
        losses.append(step(batch))
        opt.step()
    return (losses, [p.grad.clone() for p in model.parameters()], [p.detach().clone() for p in model.parameters()],
            [torch.get_rng_state()])


def plain_step(model, loss=loss_fn):
    def step(batch):
        value = loss(model, batch)
        value.backward()
        return value.detach()
    return step


def same(a, b) -> bool:
    return all(len(x) == len(y) and all(torch.equal(u, v) for u, v in zip(x, y)) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def reference():
    model = make_example("gpt2")
    return train(model, batches(), plain_step(model))


def test_changing_lengths_train_bit_for_bit_with_one_profile_per_length(reference, tmp_path):
    model = make_example("gpt2")
    auto = slackswap.auto(model, loss_fn, budget=0.5, policy="capuchin", cache_dir=tmp_path, repeats=1)
    assert same(train(model, batches(), auto.step), reference)
    assert auto.stats.profiles == 3 and auto.stats.steps == 5 and auto.stats.retries == 0
    assert auto.stats.profile_time_s > 0 and auto.stats.plan_time_s > 0
    assert len(list(tmp_path.iterdir())) == 3

    # A fresh model object reads the plans from the cache, and the with-form trains the same.
    fresh = make_example("gpt2")
    again = slackswap.auto(fresh, loss_fn, budget=0.5, policy="capuchin", cache_dir=tmp_path)

    def with_form(batch):
        with again(batch):
            loss = loss_fn(fresh, batch)
            loss.backward()
        return loss.detach()

    assert same(train(fresh, batches(), with_form), reference)
    assert again.stats.profiles == 0 and again.stats.disk_hits == 3
    # another budget is another plan: nothing read
    other = slackswap.auto(make_example("gpt2"), loss_fn, budget=0.3, policy="capuchin", cache_dir=tmp_path)
    assert other.key(batches()[0]) != again.key(batches()[0])


def test_plans_do_work_and_a_bad_budget_fails_at_construction():
    model = make_example("gpt2")
    auto = slackswap.auto(model, loss_fn, budget=0.5, policy="full-recompute", repeats=1)
    batch = batches((8,))[0]
    with auto(batch) as runtime:
        loss_fn(model, batch).backward()
    assert runtime.stats.recompute_ops > 0
    with pytest.raises(BudgetError):
        slackswap.auto(model, loss_fn, budget=1.5)


def test_bucket_length_pads_to_the_smallest_bucket_that_holds_the_batch():
    from slackswap.errors import ValidationError

    assert [slackswap.bucket_length(n, (128, 32, 64)) for n in (1, 32, 33, 64, 65, 128)] == [32, 32, 64, 64, 128, 128]
    with pytest.raises(ValidationError, match="longer than the largest bucket"):
        slackswap.bucket_length(129, (32, 128))
    with pytest.raises(ValidationError, match="buckets must be positive integers"):
        slackswap.bucket_length(3, ())


def test_signature_follows_shapes_dtypes_and_scalars_not_values():
    a = make_batch(seed=0)
    assert batch_signature(a) == batch_signature(make_batch(seed=1))
    assert batch_signature(a) != batch_signature((a[0][:, :8], a[1][:, :8]))
    assert batch_signature(a) != batch_signature((a[0].int(), a[1]))
    assert batch_signature({"x": a[0], "causal": True}) != batch_signature({"x": a[0], "causal": False})


class Branchy(torch.nn.Module):
    """Skips the masking when the mask is all ones, as attention implementations do."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(8, 8)
        self.drop = torch.nn.Dropout(0.2)

    def forward(self, x, mask):
        h = self.drop(torch.tanh(self.fc(x)))
        if not bool(mask.all()):
            h = h.masked_fill(~mask, 0.0) * 2
        return (torch.tanh(self.fc(h)) ** 2).sum()


def branchy_loss(model, batch):
    return model(*batch)


def test_a_batch_on_another_code_path_is_profiled_as_a_variant():
    g = torch.Generator().manual_seed(0)
    full = torch.ones(4, 8, dtype=torch.bool)
    padded = full.clone()
    padded[:, 6:] = False
    data = [(torch.randn(4, 8, generator=g), m) for m in (full, padded, padded, full)]
    model = Branchy()
    reference_model = copy.deepcopy(model)
    expected = train(reference_model, data, plain_step(reference_model, branchy_loss))
    auto = slackswap.auto(model, branchy_loss, budget=0.9, policy="capuchin", repeats=1)
    assert same(train(model, data, auto.step), expected)
    # step 2 tries the all-ones variant, then profiles the padded one; step 3 tries the first again
    assert auto.stats.profiles == 2 and auto.stats.retries == 2
    # the with-form runs the first variant and lets the mismatch through, before any gradient
    model.zero_grad(set_to_none=True)
    with pytest.raises(PlanMismatchError, match="forward op #"):
        with auto(data[1]):
            branchy_loss(model, data[1]).backward()
    assert all(p.grad is None for p in model.parameters())
