"""`slackswap reproduce`: the JSON shape and that every row's plans stay within the budget."""

from __future__ import annotations

import json

import pytest

from slackswap.cli import main
from slackswap.experiments.reproduce import PAPER_PCT, explain_difference, run_reproduce


@pytest.fixture(scope="module")
def bert_result():
    # One model, a few policies, no sensitivity: the shape is the same as the full run's.
    return run_reproduce(models=("bert-large",), policies=("ideal", "recompute-optimal", "slackswap-paper", "slackswap"),
                         sensitivity=False)


def test_reproduce_json_shape(bert_result):
    assert set(bert_result) == {"rows", "sensitivity", "parametrization"}
    row = bert_result["rows"][0]
    assert row["model"] == "bert-large" and row["paper_pct"] == PAPER_PCT["bert-large"]
    assert row["budget_bytes"] == int(0.5 * row["unconstrained_peak_bytes"])
    assert row["config"]["layers"] == 24 and row["config"]["seq_len"] == 512
    for name, result in row["policies"].items():
        assert {"throughput_pct", "peak_memory_bytes"} <= set(result)
    json.dumps(bert_result, allow_nan=False)  # plain JSON, no NaN


def test_reproduce_rows_stay_within_budget(bert_result):
    row = bert_result["rows"][0]
    for name, result in row["policies"].items():
        if name == "ideal" or not result["fits"]:
            continue
        assert result["peak_memory_bytes"] <= row["budget_bytes"], name


def test_difference_and_explanation_follow_the_numbers(bert_result):
    row = bert_result["rows"][0]
    ours = row["policies"]["slackswap"]["throughput_pct"]
    assert row["difference_pts"] == pytest.approx(ours - row["paper_pct"])
    if abs(row["difference_pts"]) > 2:
        assert "points from the paper" in row["explanation"] and "GiB" in row["explanation"]
    else:
        assert row["explanation"] == ""


def test_explanation_is_empty_within_tolerance():
    row = {"difference_pts": 1.5}
    assert explain_difference(None, None, 0, row, {"fits": True}) == ""


def test_sensitivity_varies_one_thing_at_a_time():
    result = run_reproduce(models=("llama-7b",), policies=("slackswap",), sensitivity=True)
    variants = [e["variant"] for e in result["sensitivity"]]
    assert variants[1:] == ["eager attention", "gemm efficiency 0.5", "gemm efficiency 0.7", "duplex slowdown off",
                            "duplex H2D x0.25", "duplex H2D x0.93 (a PCIe 5.0 log)"]
    by = {e["variant"]: e for e in result["sensitivity"]}
    # Eager attention stores the s^2 probabilities: a larger unconstrained peak.
    assert by["eager attention"]["unconstrained_peak_bytes"] > by[variants[0]]["unconstrained_peak_bytes"]
    for e in result["sensitivity"]:
        assert e["peak_memory_bytes"] <= e["budget_bytes"]


def test_plan_and_sweep_commands_write_files(tmp_path, capsys):
    plan_path = tmp_path / "plan.json"
    assert main(["plan", "--model", "bert-large", "--budget", "0.5", "--policy", "slackswap",
                 "--out", str(plan_path), "--quiet"]) == 0
    data = json.loads(plan_path.read_text())
    assert data["policy"] == "slackswap" and data["budget_bytes"] > 0
    csv_path = tmp_path / "sweep.csv"
    assert main(["sweep", "--model", "bert-large", "--budgets", "0.5,0.9", "--policies", "ideal,slackswap",
                 "--out", str(csv_path)]) == 0
    assert len(csv_path.read_text().splitlines()) == 1 + 4
    assert "wrote 4 rows" in capsys.readouterr().out


def test_plan_command_reports_a_budget_below_the_minimum(tmp_path, capsys):
    assert main(["plan", "--model", "bert-large", "--budget", "0.05", "--out", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err
    assert "below the minimum any plan can reach" in err and err.count("\n") == 1


def test_optimal_note_says_when_the_plan_is_slackswaps():
    from slackswap.cli.reproduce_cmd import policy_rows

    milp = {"fits": True, "throughput_pct": 99.0, "peak_memory_bytes": 1024, "step_time_s": 1.0,
            "milp_objective_s": 0.02, "milp_dual_bound_s": 0.01, "milp_predicted_step_time_s": 1.02,
            "milp_solve_time_s": 3.0}
    rows = policy_rows({"policies": {"optimal": {**milp, "source": "milp"},
                                     "optimal-2": {**milp, "source": "slackswap"}}})
    assert "slackswap's" not in rows[0][4] and "MILP objective" in rows[0][4]
    assert rows[1][4].endswith("the plan is slackswap's, which simulates faster than the MILP's")
