"""Discrete-event simulation of one training step under a plan (see docs/simulator.md)."""

from .copy_starts import copy_in_start_steps, with_copy_in_start_steps
from .simulator import simulate, simulate_ideal

__all__ = ["copy_in_start_steps", "simulate", "simulate_ideal", "with_copy_in_start_steps"]
