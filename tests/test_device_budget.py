"""Budgets in device terms: plan_for_device, `--gpu-memory` on simulate / plan / sweep, and `fit`."""

from __future__ import annotations

import json

import pytest

import slackswap
from slackswap import Workload, get_hardware
from slackswap.cli import main
from slackswap.errors import BudgetError, ValidationError
from slackswap.memory.device_plan import DeviceOptions, plan_for_device
from slackswap.memory.step import CUBLAS_WORKSPACE_BYTES
from slackswap.workloads.models import build_model_workload
from slackswap.workloads.synthetic import chain

MiB = 1024**2
A100 = get_hardware("a100-80gb-pcie4")


def counted_chain() -> Workload:
    """chain(3) of tests/test_step_memory.py with 1000 parameters: reserved peak 22 MiB."""
    w = chain(3, size_bytes=[100, 200, 50])
    return Workload(name="chain3p", ops=w.ops, tensors=w.tensors, meta={"parameter_count": 1000})


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_plan_fits_exactly_when_its_reserved_peak_does():
    w = counted_chain()
    # Everything kept: the cuBLAS workspace (8.125 MiB) in a 20 MiB segment, the rest in one
    # 2 MiB segment (tests/test_step_memory.py): 22 MiB reserved.
    found = plan_for_device(w, A100, 22 * MiB, "ideal")
    assert found.memory.reserved_peak_bytes == 22 * MiB and found.rounds == 1
    assert found.memory.model_state_bytes == 16000
    with pytest.raises(BudgetError, match=r"does not fit 22.00 MiB .* the ideal plan reserves 22.00 MiB"):
        plan_for_device(w, A100, 22 * MiB - 1, "ideal")
    with pytest.raises(BudgetError, match="model states alone take 15.62 KiB"):
        plan_for_device(w, A100, 16000, "ideal")
    with pytest.raises(ValidationError, match="parameter count"):
        plan_for_device(chain(3), A100, 22 * MiB, "ideal")


def test_the_activation_budget_is_lowered_until_the_reserved_peak_fits():
    w = build_model_workload("bert-large", A100, layers=2)
    ideal = plan_for_device(w, A100, 64 * 1024 * MiB, "ideal").memory
    gpu = ideal.reserved_peak_bytes - 128 * MiB
    found = plan_for_device(w, A100, gpu, "capuchin")
    assert found.memory.reserved_peak_bytes <= gpu < ideal.reserved_peak_bytes
    assert found.plan.budget_bytes < ideal.activation_peak_bytes
    # The search is deterministic: the same inputs give the same plan.
    assert plan_for_device(w, A100, gpu, "capuchin").plan == found.plan
    # Sharding the model states frees memory for activations: the plan keeps more.
    sharded = plan_for_device(w, A100, gpu, "capuchin", DeviceOptions(shard=8))
    assert sharded.memory.model_state_bytes < found.memory.model_state_bytes
    assert sharded.timeline.peak_memory_bytes >= found.timeline.peak_memory_bytes


def test_public_api_plans_for_a_gpu():
    w = counted_chain()
    plan = slackswap.plan(w, "a100-80gb-pcie4", policy="ideal", gpu_memory="22MiB")
    assert plan.policy == "ideal"
    memory = slackswap.device_memory(w, "a100-80gb-pcie4", plan, optimizer="sgd", precision="fp32")
    assert memory.model_state_bytes == 8000 and memory.reserved_peak_bytes == 22 * MiB
    with pytest.raises(BudgetError, match="not both"):
        slackswap.plan(w, budget=0.5, gpu_memory="22MiB")
    with pytest.raises(BudgetError, match="need gpu_memory"):
        slackswap.plan(w, budget=0.5, shard=2)
    with pytest.raises(ValidationError, match="unknown device option"):
        slackswap.plan(w, gpu_memory="22MiB", shards=2)


def test_simulate_json_reports_the_device_figures(capsys, tmp_path):
    path = tmp_path / "w.json"
    counted_chain().save(path)
    code, out, err = run_cli(capsys, "simulate", "--workload", str(path), "--json", "--gpu-memory", "22MiB")
    assert code == 0 and err == ""
    data = json.loads(out)
    assert data["activation_peak_bytes"] == data["peak_memory_bytes"] == 301
    assert data["model_state_bytes"] == 16000
    assert data["reserved_peak_bytes"] == 22 * MiB and data["fits_gpu_memory"] is True
    assert data["allocated_peak_bytes"] == CUBLAS_WORKSPACE_BYTES + 4 * 512 + 2048 + 2048 + 12288
    # Without --gpu-memory the figures are still there; a workload without parameters has no model states.
    bare = tmp_path / "bare.json"
    chain(3).save(bare)
    data = json.loads(run_cli(capsys, "simulate", "--workload", str(bare), "--json")[1])
    assert data["model_state_bytes"] is None and data["reserved_peak_bytes"] == 22 * MiB
    code, out, err = run_cli(capsys, "plan", "--workload", str(path), "--budget", "0.5", "--gpu-memory", "1GiB",
                             "--out", str(tmp_path / "p.json"))
    assert code == 2 and out == "" and err.count("\n") == 1 and "not both" in err


def test_sweep_adds_device_columns(capsys, tmp_path):
    path = tmp_path / "w.json"
    counted_chain().save(path)
    out_csv = tmp_path / "s.csv"
    code, _, _ = run_cli(capsys, "sweep", "--workload", str(path), "--budgets", "1.0", "--policies", "ideal",
                         "--gpu-memory", "21MiB", "--out", str(out_csv))
    header, row = out_csv.read_text().splitlines()
    assert code == 0 and header.endswith("model_state_bytes,allocated_peak_bytes,reserved_peak_bytes,fits_gpu_memory")
    assert row.endswith(f",16000,{CUBLAS_WORKSPACE_BYTES + 4 * 512 + 16384},{22 * MiB},False")


def test_fit_table_and_advice(capsys):
    result = slackswap.fit("bert-large", "a100-80gb-pcie4", "12GiB", micro_batches=[1, 2, 64, 128],
                           policies=["ideal", "full-recompute"])
    by = {(r.micro_batch, r.policy): r for r in result.rows}
    assert by[(1, "ideal")].fits and by[(1, "ideal")].throughput_pct == 100.0
    assert by[(1, "ideal")].tokens_per_s == pytest.approx(512 / by[(1, "ideal")].step_time_s)
    assert not by[(64, "ideal")].fits and "reserves" in by[(64, "ideal")].note
    # Not tried above a micro-batch that does not fit: activations only grow with it.
    assert by[(128, "ideal")].note == "skipped: micro-batch 64 does not fit"
    assert result.advice is None
    # Model states of bert-large (4.99 GiB) do not fit 3 GiB: nothing fits, and sharding is the fix.
    small = slackswap.fit("bert-large", "a100-80gb-pcie4", "3GiB", micro_batches=[1], policies=["full-recompute"])
    assert not any(r.fits for r in small.rows) and "--shard" in (small.advice or "")
    code, out, err = run_cli(capsys, "fit", "--model", "bert-large", "--gpu-memory", "3GiB", "--micro-batches", "1",
                             "--policies", "full-recompute", "--json")
    assert code == 0 and json.loads(out)["advice"] == small.advice
