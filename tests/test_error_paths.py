"""One test per error path that issue 6 names, with its exact message and exit code.

The fuzz tests (test_fuzz_loaders.py, test_fuzz_cli.py) cover breadth; this file pins
each named path by hand, on chain(5) whose numbers are easy to check: ops op0..op4,
1 s forward and 2 s backward each; saved x (1 B, a step input) and a0..a3 (100 B each),
so the unconstrained peak is 401 B. The smallest budget any plan reaches is 201 B:
the backward of op4 needs a3 while x stays resident, and rebuilding a3 needs a2 too.
"""

from __future__ import annotations

import contextlib
import io
import json
import math

import pytest

import slackswap
from slackswap.cli import main
from slackswap.errors import (
    BudgetError, InfeasiblePlanError, OutputPathError, PlanMismatchError, SlackswapError, UnknownNameError,
    ValidationError,
)
from slackswap.hardware import PRESETS
from slackswap.plans import Action, Plan
from slackswap.schedule import check_plan, make_plan
from slackswap.sim import simulate
from slackswap.workloads.synthetic import chain

HW = PRESETS["a100-80gb-pcie4"]
PEAK = 401
MINIMUM = 201


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def one_line(err: str) -> str:
    assert err.startswith("slackswap: error: ") and err.count("\n") == 1 and err.endswith("\n"), repr(err)
    assert "Traceback" not in err
    return err[len("slackswap: error: "):-1]


@pytest.fixture
def files(tmp_path):
    w = chain(5)
    w.save(tmp_path / "w.json")
    chain(6).save(tmp_path / "w6.json")
    make_plan(w, {"a1": Action.RECOMPUTE}, policy="hand", budget_bytes=PEAK).save(tmp_path / "plan.json", w)
    return tmp_path


def write(path, data) -> str:
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def workload_doc() -> dict:
    return json.loads(chain(5).to_json())


# ---- files: truncated, not JSON, wrong types, missing and extra fields, NaN, absurd sizes --------

@pytest.mark.parametrize("edit, message", [
    (lambda d: json.dumps(d)[:40], "is not valid JSON (line 1, column 36: Unterminated string starting at)"),
    (lambda d: "name: chain5\n", "is not valid JSON (line 1, column 1: Expecting value)"),
    (lambda d: d | {"ops": "op0"}, "workload.ops must be a list, got str"),
    (lambda d: d | {"ops": [{k: v for k, v in d["ops"][0].items() if k != "fwd_time_s"}] + d["ops"][1:]},
     "workload.ops[0].fwd_time_s is missing: add it"),
    (lambda d: d | {"colour": "blue"}, "workload has unknown field 'colour': remove it or check its spelling"),
    (lambda d: d | {"ops": [d["ops"][0] | {"fwd_time_s": math.nan}] + d["ops"][1:]},
     "workload.ops[0].fwd_time_s must be finite, got nan"),
    (lambda d: d | {"ops": [d["ops"][0] | {"bwd_time_s": math.inf}] + d["ops"][1:]},
     "workload.ops[0].bwd_time_s must be finite, got inf"),
    (lambda d: d | {"tensors": [d["tensors"][0] | {"size_bytes": -100}] + d["tensors"][1:]},
     "workload.tensors[0].size_bytes must be at least 1, got -100"),
    (lambda d: d | {"tensors": [d["tensors"][0] | {"size_bytes": 10**20}] + d["tensors"][1:]},
     "workload.tensors[0].size_bytes must be at most 9007199254740992 (2**53), got 100000000000000000000"),
    (lambda d: d | {"ops": [d["ops"][0] | {"fwd_time_s": 5e9}] + d["ops"][1:]},
     "is 5000000000.0 s, more than 1e+06 s (11.6 days) for one op: times are in seconds"),
])
def test_bad_workload_files(files, edit, message):
    path = write(files / "bad.json", edit(workload_doc()))
    code, out, err = run("simulate", "--workload", path)
    assert code == 2 and out == ""
    assert message in one_line(err)


def test_plan_for_another_workload(files):
    code, _, err = run("simulate", "--workload", str(files / "w6.json"), "--plan", str(files / "plan.json"))
    assert code == 2
    message = one_line(err)
    assert message.startswith("plan was made for workload 'chain5' (fingerprint ")
    assert "not for 'chain6'" in message and message.endswith("make the plan again for this workload")


def test_plan_with_a_tensor_swapped_that_is_a_step_input(files):
    doc = json.loads(Plan.load(files / "plan.json").to_json())
    doc["tensors"][0] = {"name": "x", "action": "swap", "prefetch_step": 4}
    code, _, err = run("simulate", "--workload", str(files / "w.json"), "--plan", write(files / "p.json", doc))
    assert code == 2 and "'x' is a step input and can only be kept, not swap" in one_line(err)


@pytest.mark.parametrize("argv, message", [
    (["--model", "gpt-5"], "unknown model 'gpt-5': choose one of bert-large, gpt2-xl, llama-7b, llama-3-8b, llama-2-70b, or custom"),
    (["--hardware", "tpu-v9", "--workload", "W"], "unknown hardware 'tpu-v9': choose one of a100-40gb-pcie4"),
    (["--policy", "teleport", "--workload", "W"], "unknown policy 'teleport': choose one of ideal, full-recompute"),
])
def test_unknown_names(files, argv, message):
    argv = [str(files / "w.json") if a == "W" else a for a in argv]
    code, _, err = run("simulate", *argv)
    assert code == 2 and message in one_line(err)


# ---- budgets -------------------------------------------------------------------------------------

@pytest.mark.parametrize("budget, message", [
    ("0", "budget '0' must be a fraction above 0 and at most 1, or a size such as 12GiB"),
    ("0B", "size '0B' must be a positive, finite number of bytes"),
    ("100B", f"budget 100 B (100 bytes) is below the minimum any plan can reach for chain5: 201 B ({MINIMUM} bytes"),
    ("402B", f"budget 402 B is above the unconstrained peak of 401 B ({PEAK} bytes): everything fits"),
    ("half", "cannot read size 'half': write a number of bytes with an optional unit"),
])
def test_budgets_on_the_cli(files, budget, message):
    code, _, err = run("simulate", "--workload", str(files / "w.json"), "--policy", "slackswap", "--budget", budget)
    assert code == 2 and message in one_line(err)


def test_budget_at_the_minimum_and_at_the_peak_are_accepted(files):
    for budget in (f"{MINIMUM}B", f"{PEAK}B"):
        code, out, err = run("simulate", "--workload", str(files / "w.json"), "--policy", "slackswap",
                             "--budget", budget, "--json")
        assert code == 0 and err == ""
        assert json.loads(out)["peak_memory_bytes"] <= int(budget[:-1])


def test_below_minimum_error_carries_the_minimum():
    from slackswap.planners import plan_workload

    with pytest.raises(BudgetError) as info:
        plan_workload(chain(5), HW, MINIMUM - 1, "slackswap")
    assert info.value.minimum_bytes == MINIMUM


@pytest.mark.parametrize("budget, message", [
    (0, "budget of 0 bytes must be positive"),
    (-5, "budget of -5 bytes must be positive"),
    (1.5, "budget fraction 1.5 must be above 0 and at most 1"),
    (math.nan, "budget fraction nan must be above 0 and at most 1"),
    (True, "budget must be a fraction, a byte count or a size string, got True"),
    ([1], "got list"),
    ("lots", "cannot read size 'lots'"),
    (MINIMUM - 1, "below the minimum any plan can reach"),
])
def test_budgets_in_the_api(budget, message):
    with pytest.raises(BudgetError) as info:
        slackswap.plan(chain(5), budget=budget)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("call, error, message", [
    (lambda: slackswap.plan(chain(5), policy="nope"), UnknownNameError, "unknown policy 'nope'"),
    (lambda: slackswap.plan("gpt-5"), UnknownNameError, "unknown model 'gpt-5'"),
    (lambda: slackswap.plan(chain(5), hardware="tpu"), UnknownNameError, "unknown hardware 'tpu'"),
    (lambda: slackswap.plan(chain(5), hardware=3), UnknownNameError, "got int"),  # AttributeError before
    (lambda: slackswap.simulate(chain(5), policy="slackswap"), BudgetError, "needs a budget"),
    (lambda: slackswap.get_hardware("missing.json"), ValidationError, "does not exist"),
])
def test_api_names(call, error, message):
    with pytest.raises(error) as info:
        call()
    assert message in str(info.value) and "\n" not in str(info.value)


# ---- a plan that cannot fit the budget it is simulated with ----------------------------------------

def test_infeasible_plan_names_the_op_and_the_bytes():
    w = chain(5)
    plan = make_plan(w, {}, policy="keep-all", budget_bytes=None)
    with pytest.raises(InfeasiblePlanError) as info:
        simulate(w, HW, plan, 150)
    # x (1 B) + a0 (100 B) are on the device; F(op1) needs a1's 100 B more: 201 B > 150 B
    assert info.value.needed_bytes == 201 and info.value.budget_bytes == 150
    assert "forward of 'op1' needs 201 B (201 bytes) with 150 B (150 bytes) allowed" in str(info.value)


def test_infeasible_plan_on_the_cli(files):
    code, _, err = run("simulate", "--workload", str(files / "w.json"), "--plan", str(files / "plan.json"),
                       "--budget", "150B")
    assert code == 2
    assert "plan cannot fit its budget" in one_line(err) and "raise the budget" in err


def test_check_plan_rejects_a_plan_missing_a_tensor():
    w = chain(5)
    plan = make_plan(w, {}, policy="hand", budget_bytes=None)
    doc = json.loads(plan.to_json(w))
    doc["tensors"] = doc["tensors"][:-1]
    with pytest.raises(PlanMismatchError) as info:
        check_plan(w, Plan.from_dict(doc))
    assert "plan has no action for saved tensor 'a3': make the plan again" == str(info.value)


# ---- outputs -------------------------------------------------------------------------------------

def test_output_into_a_missing_directory(tmp_path):
    code, out, err = run("export-workload", "--model", "gpt2-xl", "--out", str(tmp_path / "no" / "w.json"))
    assert code == 2 and out == ""
    assert one_line(err) == (f"cannot write '{tmp_path / 'no' / 'w.json'}': directory '{tmp_path / 'no'}' "
                             "does not exist; create it first")
    assert list(tmp_path.iterdir()) == []


def test_write_failure_in_the_library_is_typed(tmp_path):
    with pytest.raises(OutputPathError) as info:
        chain(3).save(tmp_path / "no" / "w.json")
    assert "cannot write" in str(info.value) and "No such file or directory" in str(info.value)
    with pytest.raises(OutputPathError):
        chain(3).save(tmp_path)  # a directory
    assert list(tmp_path.iterdir()) == []


def test_every_error_class_is_a_slackswap_error():
    for cls in (BudgetError, InfeasiblePlanError, OutputPathError, PlanMismatchError, UnknownNameError,
                ValidationError):
        assert issubclass(cls, SlackswapError)


# ---- bugs found in files owned by others (fixed) -------------------------------------------------

def test_make_plan_with_string_actions():
    w = chain(5)
    as_text = make_plan(w, {"a1": "swap"}, policy="hand", budget_bytes=None)
    assert as_text == make_plan(w, {"a1": Action.SWAP}, policy="hand", budget_bytes=None)
    for bad in ("bogus", 3, None):
        with pytest.raises(SlackswapError) as info:
            make_plan(w, {"a1": bad}, policy="hand", budget_bytes=None)
        assert "a1" in str(info.value) and "\n" not in str(info.value)


def test_sweep_refuses_absurd_budget_counts():
    from slackswap.experiments.sweep import parse_budgets

    with pytest.raises(SlackswapError):
        parse_budgets("0.5:1:1e-6")
    with pytest.raises(SlackswapError):
        parse_budgets("1e-300:1:1e-300")


def test_sweep_refuses_an_empty_policy_list():
    from slackswap.experiments.sweep import parse_policies

    with pytest.raises(SlackswapError):
        parse_policies(",")
