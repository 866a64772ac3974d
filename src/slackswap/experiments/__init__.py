"""Experiments built on the planners and the simulator: budget sweeps and the paper's table."""
