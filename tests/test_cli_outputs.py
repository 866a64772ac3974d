"""--json and --quiet on the planning commands, and tables through render_table."""

from __future__ import annotations

import csv
import json

import pytest

from slackswap.cli import main
from slackswap.cli.reproduce_cmd import policy_lines, print_tables
from slackswap.plans import Plan
from slackswap.workloads.synthetic import chain


@pytest.fixture
def chain_file(tmp_path):
    path = tmp_path / "chain.json"
    chain(6, size_bytes=100).save(path)
    return path


def test_plan_json_summary_matches_the_written_plan(capsys, chain_file, tmp_path):
    out = tmp_path / "plan.json"
    code = main(["plan", "--workload", str(chain_file), "--budget", "0.6", "--policy", "slackswap",
                 "--out", str(out), "--json"])
    data = json.loads(capsys.readouterr().out)
    plan = Plan.load(out)
    assert code == 0
    assert data["budget_bytes"] == plan.budget_bytes == int(0.6 * 501)
    assert data["recompute_count"] == sum(1 for a in plan.actions.values() if a.value == "recompute")
    assert data["swap_count"] == sum(1 for a in plan.actions.values() if a.value == "swap")
    assert data["recompute_count"] + data["swap_count"] > 0  # 60% of the peak forces something off the device
    assert data["simulated"]["peak_memory_bytes"] <= data["budget_bytes"]


def test_quiet_prints_nothing_but_writes(capsys, chain_file, tmp_path):
    out = tmp_path / "w.json"
    assert main(["export-workload", "--workload", str(chain_file), "--out", str(out), "--quiet"]) == 0
    assert capsys.readouterr().out == ""
    assert out.exists()
    assert main(["explain", "--workload", str(chain_file), "--budget", "0.6", "--quiet"]) == 0
    assert capsys.readouterr().out == ""


def test_sweep_json_rows_equal_the_csv(capsys, chain_file, tmp_path):
    out = tmp_path / "s.csv"
    code = main(["sweep", "--workload", str(chain_file), "--budgets", "0.6,0.8", "--policies",
                 "full-recompute,slackswap", "--out", str(out), "--json"])
    data = json.loads(capsys.readouterr().out)
    with open(out, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert code == 0
    assert len(data["rows"]) == len(rows) == 4
    assert [r["policy"] for r in data["rows"]] == [r["policy"] for r in rows]


def _fake_row():
    return {"policies": {
        "slackswap": {"fits": True, "throughput_pct": 97.5, "peak_memory_bytes": 2 * 1024**3, "step_time_s": 0.25},
        "full-recompute": {"fits": False},
    }}


def test_policy_table_has_units_and_marks_what_does_not_fit():
    text = "\n".join(policy_lines(_fake_row()))
    assert "97.50%" in text and "2.00 GiB" in text and "250.00 ms" in text
    assert "cannot reach this budget" in text


def test_print_tables_plain_when_not_a_terminal(capsys):
    row = {**_fake_row(), "model": "m", "hardware": "hw", "budget_bytes": 1024**3, "budget_fraction": 0.5,
           "unconstrained_peak_bytes": 2 * 1024**3, "minimum_budget_bytes": 1024**2, "ideal_step_time_s": 0.2,
           "paper_pct": 97.0, "difference_pts": 0.5,
           "config": {"layers": 1, "hidden": 8, "heads": 1, "ffn": 32, "seq_len": 4, "micro_batch": 1,
                      "attention": "flash", "mlp": "gelu"}}
    print_tables({"rows": [row], "sensitivity": [], "parametrization": {"why": "because"}})
    out = capsys.readouterr().out
    assert "97.50%" in out and "+0.50 points" in out and "parametrization: because" in out
    assert "\x1b[" not in out  # no terminal escape codes when captured
