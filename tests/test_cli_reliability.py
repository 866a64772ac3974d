"""Command-line defects of issue 15: each test reproduces one probe that failed."""

from __future__ import annotations

import json

import pytest

from slackswap.cli import main
from slackswap.plans import Plan
from slackswap.workload import Op, Tensor, Workload


@pytest.fixture
def nothing_saved(tmp_path):
    """One op whose output no backward reads: the unconstrained activation peak is 0 bytes."""
    w = Workload(name="nothing-saved", ops=(
        Op(name="a", layer=0, kind="gemm", fwd_time_s=1e-3, bwd_time_s=2e-3, flops=1e9, bytes_accessed=1e6,
           inputs=("x",), outputs=("y",)),
    ), tensors=(Tensor(name="x", size_bytes=1024, producer=None), Tensor(name="y", size_bytes=1024, producer="a")))
    path = tmp_path / "w.json"
    w.save(path)
    return path


def test_a_workload_that_saves_nothing_plans_and_simulates(nothing_saved, tmp_path, capsys):
    plan_file, trace, timeline = tmp_path / "p.json", tmp_path / "t.json", tmp_path / "tl.json"
    assert main(["plan", "--workload", str(nothing_saved), "--budget", "0.5", "--out", str(plan_file)]) == 0
    assert "nothing to plan" in capsys.readouterr().out
    assert Plan.load(plan_file).actions == {}
    assert main(["simulate", "--workload", str(nothing_saved), "--policy", "slackswap", "--budget", "0.5",
                 "--trace", str(trace), "--timeline", str(timeline)]) == 0
    out = capsys.readouterr().out
    assert "nothing to plan" in out and "100.00% of ideal" in out
    assert json.loads(timeline.read_text())["peak_memory_bytes"] == 0
