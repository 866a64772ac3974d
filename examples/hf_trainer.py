"""The Hugging Face Trainer training under slackswap's automatic mode.

Every training step runs under the plan for its batch's shapes: a new shape is profiled and
planned once (slackswap.auto), later steps of that shape reuse the plan. The part to copy is
SlackswapTrainer (a few lines); the rest builds a tiny GPT-2 from a config and random token data,
so the example runs on a CPU without downloads:

    python examples/hf_trainer.py [--steps 6] [--budget 0.5] [--policy slackswap] [--cache-dir DIR] [--plain]

It prints the loss of each step and what slackswap did (profiles, steps, plans reused); --plain
trains with transformers.Trainer alone (the same losses and weights, bit for bit).
"""

from __future__ import annotations

import argparse
import tempfile

import torch
import transformers

import slackswap


class SlackswapTrainer(transformers.Trainer):
    """transformers.Trainer whose training steps run under slackswap.auto's plans."""

    def __init__(self, *args, budget=0.5, policy="slackswap", hardware="a100-80gb-pcie4", cache_dir=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.plans = slackswap.auto(self.model, self._loss, budget=budget, policy=policy, hardware=hardware,
                                    cache_dir=cache_dir)

    def _loss(self, model, batch):
        inputs, num_items_in_batch = batch  # what training_step computes its loss from
        return self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)

    def training_step(self, model, inputs, num_items_in_batch=None):
        inputs = self._prepare_inputs(inputs)
        with self.plans((inputs, num_items_in_batch)):  # profiles and plans a new shape once
            return super().training_step(model, inputs, num_items_in_batch)


# ---- a tiny model and data, so the example runs anywhere ----------------------------------------------
class RandomTokens(torch.utils.data.Dataset):
    """Token sequences of two lengths, so the run sees two input shapes after padding."""

    def __init__(self, count: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.items = [torch.randint(1, vocab, (12 if i % 3 == 0 else 8,), generator=g) for i in range(count)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i):
        return {"input_ids": self.items[i]}


def pad_to_longest(items):
    """Pad each batch to its longest sequence, as Hugging Face collators do (labels -100 on padding)."""
    n = max(len(x["input_ids"]) for x in items)
    ids = torch.stack([torch.nn.functional.pad(x["input_ids"], (0, n - len(x["input_ids"]))) for x in items])
    labels = torch.stack([torch.nn.functional.pad(x["input_ids"], (0, n - len(x["input_ids"])), value=-100)
                          for x in items])
    return {"input_ids": ids, "labels": labels}


def main(argv=None) -> transformers.Trainer:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--budget", type=float, default=0.5)
    parser.add_argument("--policy", default="slackswap")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--plain", action="store_true", help="train with transformers.Trainer, without slackswap")
    args = parser.parse_args(argv)
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=4)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    with tempfile.TemporaryDirectory() as out:
        training = transformers.TrainingArguments(
            output_dir=out, per_device_train_batch_size=2, max_steps=args.steps, learning_rate=1e-3,
            logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, dataloader_drop_last=True, seed=0,
            disable_tqdm=True,
        )
        common = dict(model=model, args=training, train_dataset=RandomTokens(4 * args.steps, 64),
                      data_collator=pad_to_longest)
        if args.plain:
            trainer = transformers.Trainer(**common)
        else:
            trainer = SlackswapTrainer(**common, budget=args.budget, policy=args.policy, cache_dir=args.cache_dir)
        trainer.train()
    losses = [round(entry["loss"], 4) for entry in trainer.state.log_history if "loss" in entry]
    print(f"losses: {losses}")
    if args.plain:
        return trainer
    stats = trainer.plans.stats
    print(f"slackswap: {stats.steps} steps, {stats.profiles} shapes profiled and planned "
          f"({stats.profile_time_s:.2f} s profiling, {stats.plan_time_s:.2f} s planning), "
          f"{stats.disk_hits} read from cache_dir")
    return trainer


if __name__ == "__main__":
    main()
