"""Plan JSON round trips, field-naming errors, and check_plan's mismatch errors."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from slackswap.errors import PlanMismatchError, ValidationError
from slackswap.hardware import PRESETS
from slackswap.plans import Action, Plan
from slackswap.schedule import check_plan, make_plan
from slackswap.sim import simulate
from slackswap.workloads.synthetic import chain

K, S, R = Action.KEEP, Action.SWAP, Action.RECOMPUTE


def mixed_plan(workload=None):
    w = workload or chain(5)
    return w, make_plan(w, {"a0": S, "a1": R, "a2": R, "a3": S}, policy="hand", budget_bytes=250,
                        prefetch_step={"a0": 2, "a3": 0}, info={"note": "by hand", "solve_s": 0.25})


def test_round_trip_through_json_and_files(tmp_path):
    w, plan = mixed_plan()
    again = Plan.from_dict(json.loads(plan.to_json(w)))
    assert again == plan
    assert dict(again.info) == dict(plan.info)
    # a0 is prefetched at step 2, after step 1 needs it to rebuild a1: op0 re-runs as well.
    assert dict(again.recompute_groups) == {"op3": ("op0", "op1", "op2")}
    check_plan(w, again)
    path = tmp_path / "plan.json"
    plan.save(path, w)
    assert Plan.load(path) == plan
    assert [row["name"] for row in json.loads(path.read_text())["tensors"]] == [t.name for t in w.saved_tensors]


def test_recompute_regions_round_trip_and_are_written_only_when_a_plan_has_them():
    w = chain(4)
    region = make_plan(w, {"a1": R}, policy="hand", budget_bytes=None, recompute_regions=[("op1", "op2")])
    data = json.loads(region.to_json(w))
    assert data["recompute_regions"] == [["op1", "op2"]]
    again = Plan.from_dict(data)
    assert again == region and again.recompute_regions == (("op1", "op2"),)
    check_plan(w, again)
    plain = make_plan(w, {"a1": R}, policy="hand", budget_bytes=None)
    assert "recompute_regions" not in json.loads(plain.to_json(w))
    assert plain != region
    for bad in ([["op1", 3]], [[]], ["op1"]):
        with pytest.raises(ValidationError, match="recompute_regions"):
            Plan.from_dict({**data, "recompute_regions": bad})


def test_unconstrained_plan_round_trips_a_null_budget():
    w = chain(3)
    plan = make_plan(w, {}, policy="ideal", budget_bytes=None)
    assert Plan.from_dict(json.loads(plan.to_json(w))).budget_bytes is None


def _data():
    w, plan = mixed_plan()
    return plan.to_dict(w)


BAD = [
    (lambda d: d["tensors"][1].update(action="move"), "plan.tensors[1].action is 'move': use one of keep, swap, recompute"),
    (lambda d: d["tensors"][1].update(action=3), "plan.tensors[1].action must be a non-empty string"),
    (lambda d: d["tensors"][2].update(name="a0"), "plan.tensors[2] names 'a0' twice"),
    (lambda d: d["tensors"][1].update(prefetch_step=-1), "plan.tensors[1].prefetch_step must be at least 0"),
    (lambda d: d["tensors"][1].update(prefetch_step="2"), "plan.tensors[1].prefetch_step must be an integer"),
    (lambda d: d["tensors"][1].update(colour=1), "plan.tensors[1] has unknown field 'colour'"),
    (lambda d: d["tensors"][1].pop("action"), "plan.tensors[1].action is missing"),
    (lambda d: d.update(budget_bytes=0), "plan.budget_bytes must be at least 1"),
    (lambda d: d.update(budget_bytes=-3), "plan.budget_bytes must be at least 1"),
    (lambda d: d.update(budget_bytes="1GiB"), "plan.budget_bytes must be an integer"),
    (lambda d: d.update(recompute_groups={"op3": "op1"}), "plan.recompute_groups['op3'] must be a list of op names"),
    (lambda d: d.update(recompute_groups=[]), "plan.recompute_groups must be an object"),
    (lambda d: d.update(tensors={}), "plan.tensors must be a list"),
    (lambda d: d.update(extra=True), "plan has unknown field 'extra'"),
    (lambda d: d.pop("workload_fingerprint"), "plan.workload_fingerprint is missing"),
    (lambda d: d.update(format="slackswap.plan/9"), "plan.format is 'slackswap.plan/9'"),
]


@pytest.mark.parametrize("mutate, message", BAD, ids=[m for _, m in BAD])
def test_bad_plan_json_names_the_field(mutate, message):
    data = copy.deepcopy(_data())
    mutate(data)
    with pytest.raises(ValidationError) as info:
        Plan.from_dict(data)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_malformed_plan_files(tmp_path):
    bad = tmp_path / "plan.json"
    bad.write_text('{"format": "slackswap.plan/1", "tensors": [\n')
    with pytest.raises(ValidationError, match=r"plan file .* is not valid JSON \(line 2"):
        Plan.load(bad)
    bad.write_text('"just a string"')
    with pytest.raises(ValidationError, match="plan must be a JSON object, got str"):
        Plan.load(bad)


# ---- check_plan: a plan that does not fit the workload ---------------------------------------

def _with(plan, **changes):
    return dataclasses.replace(plan, **changes)


def test_plan_for_another_workload_is_a_mismatch():
    _, plan = mixed_plan()
    other = chain(5, size_bytes=99)
    with pytest.raises(PlanMismatchError, match="plan was made for workload 'chain5' .* not for 'chain5'"):
        check_plan(other, plan)
    with pytest.raises(PlanMismatchError):
        simulate(other, PRESETS["a100-40gb-pcie4"], plan)


@pytest.mark.parametrize("edit, error, message", [
    (lambda p: {"actions": {**p.actions, "a4": K}}, PlanMismatchError, "plan names tensor 'a4', which the workload does not save"),
    (lambda p: {"actions": {k: v for k, v in p.actions.items() if k != "a2"}}, PlanMismatchError,
     "plan has no action for saved tensor 'a2'"),
    (lambda p: {"actions": {**p.actions, "x": S}}, ValidationError, "'x' is a step input and can only be kept, not swap"),
    (lambda p: {"prefetch_step": {"a3": 0}}, ValidationError, "swapped tensor 'a0' has no prefetch_step"),
    (lambda p: {"prefetch_step": {**p.prefetch_step, "a0": 4}}, ValidationError,
     "prefetch_step of 'a0' is 4; it must be between 0 and 3"),
    (lambda p: {"prefetch_step": {**p.prefetch_step, "a1": 1}}, ValidationError, "'a1' has a prefetch_step but is not swapped"),
    (lambda p: {"recompute_groups": {"op3": ("op2",)}}, ValidationError, "plan.recompute_groups do not match"),
    (lambda p: {"recompute_groups": {}}, ValidationError, "plan.recompute_groups do not match"),
])
def test_check_plan_rejects_plans_that_cannot_run(edit, error, message):
    w, plan = mixed_plan()
    bad = _with(plan, **edit(plan))
    with pytest.raises(error) as info:
        check_plan(w, bad)
    assert message in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(error):
        simulate(w, PRESETS["a100-40gb-pcie4"], bad)


def test_a_loaded_plan_with_edited_groups_is_caught():
    w, plan = mixed_plan()
    data = plan.to_dict(w)
    data["recompute_groups"]["op3"] = ["op2"]
    with pytest.raises(ValidationError, match="recompute_groups do not match"):
        check_plan(w, Plan.from_dict(data))
