"""Discrete-event simulation of one training step under a plan (see docs/simulator.md)."""

from .simulator import simulate, simulate_ideal

__all__ = ["simulate", "simulate_ideal"]
