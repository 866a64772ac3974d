"""Measure one training step of a PyTorch model and describe it as a Workload.

``profile_model(model, batch, loss_fn)`` runs ``warmup + repeats`` steps (forward, loss,
backward), leaving the model's parameters, gradients, buffers and the RNG streams as they
were, and returns a Workload whose ops are the aten ops of the forward pass. See
docs/runtime.md for the naming scheme and what each field means. torch is imported when one
of these names is first used, so the torch-free ``profiler.build`` (roofline projection) can be
imported by the core.
"""

from __future__ import annotations

__all__ = ["model_signature", "profile_model", "workload_for"]


def __getattr__(name):
    if name in __all__:
        from . import profile

        return getattr(profile, name)
    raise AttributeError(name)
