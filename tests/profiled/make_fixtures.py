"""Re-create the profiled workloads in this folder (torch and transformers needed; about a minute on CPU).

Each model is profiled once with ``slackswap.profile(model, batch, loss_fn, hardware="a100-80gb-pcie4")``
(times from the roofline, so they do not depend on this machine's timing noise) in train mode, and
saved without the runtime's trace fields (planning does not read them). Run from the repository root:

    PYTHONPATH=src python tests/profiled/make_fixtures.py [name ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import transformers

import slackswap
from slackswap.examples import TINY, loss_fn, make_batch, make_example
from slackswap.workload import Workload

HERE = Path(__file__).parent
NOTE = ('profiled with slackswap.profile(..., hardware="a100-80gb-pcie4") on CPU; runtime trace fields left out '
        "(planning does not read them); tests/profiled/make_fixtures.py says how each was made")


def _tokens(seed: int):
    return torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(seed))


def hf_loss(model, batch):
    return model(**batch).loss


def example(kind: str):
    return make_example(kind), make_batch(TINY), loss_fn


def hf_gpt2():
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=32)
    ids = _tokens(0)
    return transformers.GPT2LMHeadModel(config), {"input_ids": ids, "labels": ids}, hf_loss


def hf_llama():
    config = transformers.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=4, intermediate_size=128, vocab_size=128,
                                      max_position_embeddings=32)
    ids = _tokens(0)
    return transformers.LlamaForCausalLM(config), {"input_ids": ids, "labels": ids}, hf_loss


def hf_bert():
    config = transformers.BertConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, max_position_embeddings=32)
    ids = _tokens(0)
    return transformers.BertForMaskedLM(config), {"input_ids": ids, "labels": ids}, hf_loss


def hf_vit():
    config = transformers.ViTConfig(image_size=32, patch_size=4, num_channels=3, hidden_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, intermediate_size=128, num_labels=10)
    g = torch.Generator().manual_seed(0)
    batch = {"pixel_values": torch.randn(2, 3, 32, 32, generator=g), "labels": torch.tensor([1, 3])}
    return transformers.ViTForImageClassification(config), batch, hf_loss


MAKERS = {
    "example-gpt2": lambda: example("gpt2"), "example-bert": lambda: example("bert"),
    "example-llama": lambda: example("llama"), "hf-gpt2": hf_gpt2, "hf-llama": hf_llama, "hf-bert": hf_bert,
    "hf-vit": hf_vit,
}


def make(name: str) -> Workload:
    torch.manual_seed(0)
    model, batch, loss = MAKERS[name]()
    model.train()
    workload = slackswap.profile(model, batch, loss, hardware="a100-80gb-pcie4", repeats=1)
    data = workload.to_dict()
    keep = ("source", "model", "device", "device_name", "times")
    data["meta"] = {**{k: data["meta"][k] for k in keep if k in data["meta"]}, "note": NOTE}
    return Workload.from_dict(data)


if __name__ == "__main__":
    for name in sys.argv[1:] or list(MAKERS):
        make(name).save(HERE / f"{name}.json")
        print(f"wrote {HERE / f'{name}.json'}")
