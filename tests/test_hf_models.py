"""Hugging Face models under the runtime (issue 14, item 5).

GPT2LMHeadModel, LlamaForCausalLM (grouped-query attention, rotary), BertForMaskedLM,
T5ForConditionalGeneration and ViTForImageClassification, built from small configs (no
downloads), with eager and sdpa attention and dropout on: one step under each policy's plan at
budgets 0.3, 0.5 and 0.8 of the profiled peak gives the loss and every gradient bit-identical to
the step without slackswap. Only what a policy refuses with BudgetError is skipped. The full grid
is `slow`; the default run checks slackswap at 0.5 and capuchin at 0.3.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import slackswap  # noqa: E402
from slackswap.errors import BudgetError  # noqa: E402
from slackswap.planners import PLANNERS  # noqa: E402
from runtime_helpers import loss_and_grads  # noqa: E402

DROPOUT = 0.1
ATTENTIONS = ("eager", "sdpa")
BUDGETS = (0.3, 0.5, 0.8)


def _tokens(g, vocab, shape):
    return torch.randint(0, vocab, shape, generator=g)


def gpt2(attn):
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=4,
                                     resid_pdrop=DROPOUT, embd_pdrop=DROPOUT, attn_pdrop=DROPOUT)
    model = transformers.GPT2LMHeadModel(config)
    ids = _tokens(torch.Generator().manual_seed(1), 64, (2, 12))
    return model, {"input_ids": ids, "labels": ids}


def llama(attn):
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                      attention_dropout=DROPOUT)
    model = transformers.LlamaForCausalLM(config)
    ids = _tokens(torch.Generator().manual_seed(2), 64, (2, 12))
    return model, {"input_ids": ids, "labels": ids}


def bert(attn):
    config = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=DROPOUT,
                                     attention_probs_dropout_prob=DROPOUT)
    model = transformers.BertForMaskedLM(config)
    g = torch.Generator().manual_seed(3)
    ids = _tokens(g, 64, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 9:] = 0  # one padded sequence: the masked attention path
    labels = torch.full_like(ids, -100)
    labels[:, 2::3] = ids[:, 2::3]
    return model, {"input_ids": ids, "attention_mask": mask, "labels": labels}


def t5(attn):
    config = transformers.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                                   num_heads=4, dropout_rate=DROPOUT, decoder_start_token_id=0, pad_token_id=0)
    model = transformers.T5ForConditionalGeneration(config)
    g = torch.Generator().manual_seed(4)
    return model, {"input_ids": _tokens(g, 64, (2, 10)), "labels": _tokens(g, 64, (2, 6))}


def vit(attn):
    config = transformers.ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=4, intermediate_size=64, num_labels=5,
                                    hidden_dropout_prob=DROPOUT, attention_probs_dropout_prob=DROPOUT)
    model = transformers.ViTForImageClassification(config)
    g = torch.Generator().manual_seed(5)
    return model, {"pixel_values": torch.randn(2, 3, 16, 16, generator=g), "labels": torch.tensor([1, 3])}


MODELS = {"gpt2": gpt2, "llama": llama, "bert": bert, "t5": t5, "vit": vit}


def hf_loss(model, batch):
    return model(**batch).loss


def step(model, batch, runtime=None):
    return loss_and_grads(model, batch, hf_loss, runtime, seed=11)


_PROFILED: dict = {}


def profiled(kind: str, attn: str):
    """(model, batch, workload, reference step), built and profiled once per model and attention."""
    if (kind, attn) not in _PROFILED:
        torch.manual_seed(0)
        model, batch = MODELS[kind](attn)
        model.config._attn_implementation = attn
        model.train()
        workload = slackswap.profile(model, batch, hf_loss, repeats=1)
        _PROFILED[(kind, attn)] = (model, batch, workload, step(model, batch))
    return _PROFILED[(kind, attn)]


def check(kind: str, attn: str, policy: str, budget: float) -> bool:
    """One step under the policy's plan equals the reference step; False when the policy refuses the budget."""
    model, batch, workload, reference = profiled(kind, attn)
    try:
        plan = slackswap.plan(workload, budget=budget, policy=policy)
    except BudgetError:
        return False
    runtime = slackswap.apply(model, plan, workload=workload)
    got = step(model, batch, runtime)
    assert len(got) == len(reference)
    assert all(torch.equal(a, b) for a, b in zip(got, reference)), f"{kind}/{attn} under {policy} at {budget}"
    planned_swaps = any(a is slackswap.Action.SWAP for a in plan.actions.values())
    assert (runtime.stats.d2h_bytes > 0) == planned_swaps
    assert (runtime.stats.recompute_ops > 0) == bool(plan.recompute_groups)
    return True


@pytest.mark.parametrize("attn", ATTENTIONS)
@pytest.mark.parametrize("kind", MODELS)
def test_each_model_trains_bit_for_bit(kind, attn):
    assert check(kind, attn, "slackswap", 0.5)
    assert check(kind, attn, "capuchin", 0.3) or check(kind, attn, "capuchin", 0.5)


@pytest.mark.slow
@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("policy", [p for p in PLANNERS if p != "ideal"])
@pytest.mark.parametrize("attn", ATTENTIONS)
@pytest.mark.parametrize("kind", MODELS)
def test_every_policy_and_budget(kind, attn, policy, budget):
    fits = check(kind, attn, policy, budget)
    if policy == "optimal" and budget >= 0.5:
        # Its MILP refused every one of these at 0.3-0.8 before it modelled rebuild chains (issue 17).
        assert fits, f"optimal refuses {kind}/{attn} at {budget}"
    if not fits:
        pytest.skip(f"{policy} refuses a budget of {budget} with BudgetError")


@pytest.mark.slow
def test_a_decoder_given_its_cache_runs_on_replay_and_without_it_on_checkpoint():
    """GPT-2 (like Llama) builds a DynamicCache when use_cache is on, its default also in training,
    and each attention appends to it: torch.utils.checkpoint's re-run of a layer would append again
    (the cache doubles; sdpa's causal path happens to slice the old keys back out, eager's mask
    path would not), so the layer calls that get it take the replay path. With use_cache=False,
    which Hugging Face itself sets under gradient checkpointing, the same plan takes the checkpoint
    path. Both train bit for bit (docs/limitations.md, Hugging Face models and the fast path)."""
    model, batch, workload, reference = profiled("gpt2", "sdpa")
    plan = slackswap.plan(workload, budget=0.8, policy="full-recompute")
    runtime = slackswap.apply(model, plan, workload=workload)
    assert runtime.path == "replay" and "DynamicCache" in runtime.path_reason
    assert all(torch.equal(a, b) for a, b in zip(step(model, batch, runtime), reference))

    no_cache = dict(batch, use_cache=False)
    plain = step(model, no_cache)
    assert all(torch.equal(a, b) for a, b in zip(plain, reference))  # the cache never changes training
    workload = slackswap.profile(model, no_cache, hf_loss, repeats=1)
    assert "stateful_call_args" not in workload.meta
    plan = slackswap.plan(workload, budget=0.8, policy="full-recompute")
    runtime = slackswap.apply(model, plan, workload=workload)
    assert runtime.path == "checkpoint" and runtime.stats.checkpointed_calls == 0
    assert all(torch.equal(a, b) for a, b in zip(step(model, no_cache, runtime), reference))
    assert runtime.stats.checkpointed_calls == 2  # the two decoder layers
