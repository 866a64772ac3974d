"""The CLI commands owned by the core: simulate, hardware, export-workload, and their bad-input paths."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from slackswap.cli import main
from slackswap.cli.common import parse_budget
from slackswap.errors import BudgetError
from slackswap.schedule import make_plan
from slackswap.plans import Action
from slackswap.workloads.synthetic import chain


@pytest.fixture
def chain_file(tmp_path):
    path = tmp_path / "chain.json"
    chain(5).save(path)
    return path


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_simulate_ideal_json_reports_full_throughput(capsys, chain_file):
    code, out, err = run_cli(capsys, "simulate", "--workload", str(chain_file), "--json")
    assert code == 0 and err == ""
    data = json.loads(out)
    # chain(5): 5 ops x (1 s forward + 2 s backward); saved: x (1 B) + a0..a3 (100 B each)
    assert data["step_time_s"] == 15.0
    assert data["ideal_step_time_s"] == 15.0
    assert data["throughput_pct"] == 100.0
    assert data["peak_memory_bytes"] == 401
    for key in ("budget_bytes", "d2h_bytes", "h2d_bytes", "recompute_time_s", "stall_time_s"):
        assert key in data


def test_simulate_plan_file_applies_the_plan(capsys, chain_file, tmp_path):
    workload = chain(5)
    plan = make_plan(workload, {"a1": Action.RECOMPUTE}, policy="hand", budget_bytes=401)
    plan_path = tmp_path / "plan.json"
    plan.save(plan_path, workload)
    code, out, _ = run_cli(capsys, "simulate", "--workload", str(chain_file), "--plan", str(plan_path), "--json")
    data = json.loads(out)
    assert code == 0
    assert data["recompute_time_s"] == 1.0  # op1 re-runs once, 1 s
    assert data["step_time_s"] == 16.0


def test_simulate_text_output_carries_units(capsys, chain_file):
    code, out, _ = run_cli(capsys, "simulate", "--workload", str(chain_file))
    assert code == 0
    assert "15.000 s" in out and "100.00% of ideal" in out and "401 B" in out


def test_export_workload_writes_the_built_in_workload(capsys, tmp_path):
    from slackswap.hardware import PRESETS
    from slackswap.workload import Workload
    from slackswap.workloads.models import build_model_workload

    out_path = tmp_path / "bert.json"
    code, out, _ = run_cli(capsys, "export-workload", "--model", "bert-large", "--hardware", "h100-pcie5",
                           "--out", str(out_path))
    assert code == 0 and "GiB saved" in out
    assert Workload.load(out_path) == build_model_workload("bert-large", PRESETS["h100-pcie5"])


def test_llama_ideal_matches_the_closed_form(capsys):
    from slackswap.workloads.models import closed_form_saved_bytes, get_model

    code, out, _ = run_cli(capsys, "simulate", "--model", "llama-7b", "--hardware", "a100-80gb-pcie4",
                           "--policy", "ideal", "--json")
    data = json.loads(out)
    assert code == 0
    assert data["throughput_pct"] == 100
    spec = get_model("llama-7b")
    T, h, f, a = spec.tokens, spec.hidden, spec.ffn, spec.heads
    # Independent per-layer formula for flash attention + fused SwiGLU + RMSNorm (bf16):
    # 16Th (norm inputs, QKV in, Q, K, V, O, FC in as 2Th each) + 6Tf (gate, up, product)
    # + 4aT (fp32 log-sum-exp) + 8T (two fp32 RMSNorm rstd vectors).
    per_layer = 16 * T * h + 6 * T * f + 4 * a * T + 8 * T
    forms = closed_form_saved_bytes(spec)
    assert forms["per_layer"] == per_layer
    assert data["peak_memory_bytes"] == spec.layers * per_layer + forms["embedding"] + forms["head"] + forms["loss"]


@pytest.mark.parametrize("argv, fragment", [
    (["simulate", "--workload", "missing.json"], "does not exist"),
    (["simulate"], "no workload given"),
    (["simulate", "--workload", "W", "--hardware", "tpu-v9"], "unknown hardware 'tpu-v9'"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, fragment, chain_file):
    argv = [str(chain_file) if a == "W" else a for a in argv]
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert fragment in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_malformed_json_workload(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x", "ops": [')
    code, _, err = run_cli(capsys, "simulate", "--workload", str(bad))
    assert code == 2 and "not valid JSON" in err and err.count("\n") == 1


def test_usage_errors_exit_2_in_a_real_process(chain_file):
    result = subprocess.run([sys.executable, "-m", "slackswap", "simulate", "--bogus-flag"],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "--bogus-flag" in result.stderr


def test_hardware_lists_every_preset_with_units(capsys):
    from slackswap.hardware import PRESETS

    code, out, _ = run_cli(capsys, "hardware")
    assert code == 0
    for name in PRESETS:
        assert name in out
    assert "GB/s" in out and "us" in out
    code, out, _ = run_cli(capsys, "hardware", "--json")
    assert json.loads(out)["a100-80gb-pcie4"]["h2d_bytes_per_s"] == 24e9


@pytest.mark.parametrize("text, expected", [("0.5", 500), ("1", 1000), ("0.25", 250), ("800B", 800), ("1e2", 100)])
def test_parse_budget(text, expected):
    assert parse_budget(text, 1000) == expected


@pytest.mark.parametrize("text", ["0", "-0.5", "nan", "inf", "12 parsecs", "2GiB", ""])
def test_parse_budget_rejects(text):
    with pytest.raises(BudgetError):
        parse_budget(text, 1000)
