"""A profile file for `slackswap profile examples/tiny_gpt.py --out workload.json`.

The convention: define make_model(), make_batch() and loss_fn(model, batch) -> scalar loss.
"""

from slackswap.examples import TINY, loss_fn, make_batch as _make_batch, make_example


def make_model():
    return make_example("gpt2", TINY)


def make_batch():
    return _make_batch(TINY)


__all__ = ["make_model", "make_batch", "loss_fn"]
