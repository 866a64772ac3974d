"""One front door: the command line and the Python API make the same plan from the same arguments."""

from __future__ import annotations

import json

import pytest

import slackswap
from slackswap.cli import main
from slackswap.errors import BudgetError
from slackswap.hardware import DEFAULT_HARDWARE, get_hardware
from slackswap.plans import Action, Plan
from slackswap.sim import simulate_ideal
from slackswap.workload import Workload
from slackswap.workloads.synthetic import chain


def cli_plan(tmp_path, *argv) -> bytes:
    out = tmp_path / "cli.json"
    assert main(["plan", *argv, "--out", str(out), "--quiet"]) == 0
    return out.read_bytes()


def api_plan(tmp_path, workload, **kwargs) -> bytes:
    out = tmp_path / "api.json"
    slackswap.plan(workload, **kwargs).save(out)
    return out.read_bytes()


def test_cli_and_api_write_the_same_plan_for_a_built_in_model(tmp_path):
    by_cli = cli_plan(tmp_path, "--model", "bert-large", "--budget", "0.5")
    by_api = api_plan(tmp_path, "bert-large", budget="0.5")
    assert by_cli == by_api
    plan = Plan.load(tmp_path / "api.json")
    assert plan.count(Action.SWAP) > 0  # the case carries copies back and their start steps


# swap-only carries copies back and their start steps on this small profile; slackswap, since its
# rule 6, plans it with recompute alone at 0.4, which still checks the two doors agree.
@pytest.mark.parametrize("budget, policy", [("0.4", "swap-only"), ("300B", "swap-only"), ("0.4", "slackswap")])
def test_cli_and_api_write_the_same_plan_for_a_profiled_workload(tmp_path, budget, policy):
    pytest.importorskip("torch")
    from slackswap.examples import TINY, loss_fn, make_batch, make_example

    path = tmp_path / "profile.json"
    model = make_example("gpt2", TINY)
    slackswap.profile(model, make_batch(TINY), loss_fn, repeats=1).save(path)
    workload = Workload.load(path)
    peak = simulate_ideal(workload, get_hardware(DEFAULT_HARDWARE)).peak_memory_bytes
    if budget.endswith("B"):
        budget = f"{peak * 2 // 5}B"  # at 0.6 the profile, projected onto the GPU, swaps nothing
    by_cli = cli_plan(tmp_path, "--workload", str(path), "--budget", budget, "--policy", policy)
    assert by_cli == api_plan(tmp_path, workload, budget=budget, policy=policy)
    plan = Plan.load(tmp_path / "cli.json")
    assert plan.budget_bytes <= peak
    if policy == "swap-only":
        assert plan.count(Action.SWAP) > 0


def test_one_budget_rule_for_both_doors(tmp_path, capsys):
    """A size above the unconstrained peak is refused by both, with the same line."""
    w = chain(5)
    path = tmp_path / "w.json"
    w.save(path)
    with pytest.raises(BudgetError) as info:
        slackswap.plan(w, budget="1GiB")
    assert "above the unconstrained peak" in str(info.value)
    with pytest.raises(BudgetError) as info_bytes:
        slackswap.plan(w, budget=2**30)
    assert str(info_bytes.value) == str(info.value)
    assert main(["plan", "--workload", str(path), "--budget", "1GiB", "--out", str(tmp_path / "p.json")]) == 2
    assert capsys.readouterr().err.strip() == f"slackswap: error: {info.value}"
    assert not (tmp_path / "p.json").exists()
    # '0.5' is a fraction through both doors.
    assert slackswap.plan(w, budget="0.8") == slackswap.plan(w, budget=0.8)


def test_default_hardware_is_one_constant(capsys):
    assert slackswap.simulate("bert-large").hardware_name == DEFAULT_HARDWARE
    assert main(["simulate", "--model", "bert-large", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hardware"] == DEFAULT_HARDWARE
