"""Shared pieces of the runtime tests: profiled example models, a short training loop, step FLOPs."""

from __future__ import annotations

import contextlib

import torch
from torch.utils.flop_counter import FlopCounterMode

from slackswap.examples import loss_fn, make_batch, make_example
from slackswap.profiler import profile_model


def profile_cache(steps: int, hardware=None):
    """A function kind -> (model, batches, workload), profiling each example model once."""
    cache = {}

    def get(kind):
        if kind not in cache:
            model = make_example(kind)
            batches = [make_batch(seed=s) for s in range(steps)]
            cache[kind] = (model, batches, profile_model(model, batches[0], loss_fn, hardware=hardware, repeats=1))
        return cache[kind]

    return get


def train(model, batches, runtime=None, *, seed: int = 1234):
    """One SGD-momentum step per batch; returns each step's loss and the last step's gradients."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(seed)  # dropout draws from here
    losses = []
    for batch in batches:
        opt.zero_grad(set_to_none=True)
        with runtime if runtime is not None else contextlib.nullcontext():
            loss = loss_fn(model, batch)
            loss.backward()
        losses.append(loss.detach().clone())
        opt.step()
    return losses, {n: p.grad.clone() for n, p in model.named_parameters()}


def loss_and_grads(model, batch, loss=loss_fn, runtime=None, *, seed: int = 5) -> list:
    """One forward and backward from a fixed RNG state: the loss, then every gradient."""
    torch.manual_seed(seed)
    model.zero_grad(set_to_none=True)
    with runtime if runtime is not None else contextlib.nullcontext():
        value = loss(model, batch)
        value.backward()
    return [value.detach()] + [p.grad.clone() for p in model.parameters() if p.grad is not None]


def step_flops(model, batch, runtime=None, *, seed: int | None = None) -> int:
    """FLOPs of one forward + backward (+ the runtime's recompute), by FlopCounterMode."""
    if seed is not None:
        torch.manual_seed(seed)
    with FlopCounterMode(display=False) as counter:
        with runtime if runtime is not None else contextlib.nullcontext():
            loss_fn(model, batch).backward()
    return counter.get_total_flops()
