"""Measure one training step of a PyTorch model and describe it as a Workload.

``profile_model(model, batch, loss_fn)`` runs ``warmup + repeats`` steps (forward, loss,
backward), leaving the model's parameters, gradients, buffers and the RNG streams as they
were, and returns a Workload whose ops are the aten ops of the forward pass. See
docs/runtime.md for the naming scheme and what each field means.
"""

from __future__ import annotations

from .profile import model_signature, profile_model, workload_for

__all__ = ["model_signature", "profile_model", "workload_for"]
