"""Example models (plain torch) for the profiler and runtime: GPT-2-like, BERT-like, Llama-like."""

from .models import EXAMPLES, TINY, ExampleConfig, loss_fn, make_batch, make_example

__all__ = ["EXAMPLES", "TINY", "ExampleConfig", "loss_fn", "make_batch", "make_example"]
