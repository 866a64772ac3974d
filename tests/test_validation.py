"""One validation path (issue 15, defects 11 and 12): what a constructor accepts, the loader reads
back equal; what the loader refuses, the constructor refuses too, with a typed error.

The property tests build Workloads, Plans, Hardware, Timelines, their Events and execution schedules from random field values (mostly valid,
sometimes of the wrong type, out of range, NaN, empty) and check: either the constructor raises
ValidationError, or the object saves to JSON and loads back equal, to the same JSON text. Any other
exception is a bug (ints given for float fields load back as equal floats). The probes that failed in issue 15 are pinned one by one below.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import slackswap
from slackswap import Action, Hardware, Op, Plan, Tensor, Workload, make_plan
from slackswap.errors import SlackswapError, ValidationError
from slackswap.hardware import PRESETS
from slackswap.plans import CopyBack, ExecutionSchedule, RecomputeGroup
from slackswap.timeline import Event, Timeline
from slackswap.workloads.synthetic import chain

PROPERTY = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4), st.lists(st.integers(), max_size=2), st.tuples(st.text(max_size=3)),
    st.sampled_from(["", "\ud800", "1GiB", "3", "swap"]),
)
NAME = st.text(alphabet="abcxyz_/#:.", min_size=1, max_size=6)
JSON_VALUE = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=4),
                          lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                          max_leaves=6)


def sometimes_junk(valid):
    """Mostly ``valid``: with about 15 fields per object, a third of the objects are wholly valid."""
    return st.one_of(*[valid] * 12, JUNK)


@st.composite
def workload_fields(draw):
    n = draw(st.integers(1, 4))
    ops, tensors = [], [Tensor(name="x", size_bytes=draw(sometimes_junk(st.integers(1, 2**54))), producer=None,
                               bwd_readers=("op0",) if draw(st.booleans()) else ())]
    for i in range(n):
        ops.append(Op(
            name=draw(sometimes_junk(st.just(f"op{i}"))), layer=draw(sometimes_junk(st.integers(-3, 2**54))),
            kind=draw(sometimes_junk(NAME)), fwd_time_s=draw(sometimes_junk(st.floats(0, 2e6))),
            bwd_time_s=draw(sometimes_junk(st.floats(0, 10))), flops=draw(sometimes_junk(st.floats(0, 1e18))),
            bytes_accessed=draw(sometimes_junk(st.integers(0, 10**12))),
            inputs=draw(sometimes_junk(st.just((tensors[-1].name,)))), outputs=(f"a{i}",),
        ))
        readers = (f"op{i + 1}",) if i + 1 < n and draw(st.booleans()) else ()
        tensors.append(Tensor(name=f"a{i}", size_bytes=draw(sometimes_junk(st.integers(1, 10**6))),
                              producer=f"op{i}", bwd_readers=draw(sometimes_junk(st.just(readers)))))
    name = draw(sometimes_junk(NAME))
    meta = draw(st.one_of(st.dictionaries(st.text(max_size=3), JSON_VALUE, max_size=3), JUNK))
    return dict(name=name, ops=tuple(ops), tensors=tuple(tensors), meta=meta)


@PROPERTY
@given(workload_fields())
def test_every_workload_the_constructor_accepts_loads_back_equal(fields):
    try:
        w = Workload(**fields)
    except ValidationError:
        return
    again = Workload.from_json(w.to_json())
    assert again == w  # 3 and 3.0 are equal: the loader reads every time and count as a float
    assert again.meta == json.loads(json.dumps(w.meta))


BASE = chain(4, size_bytes=[100, 200, 300, 400])
SAVED = [t.name for t in BASE.saved_tensors]


@st.composite
def plan_fields(draw):
    actions = {}
    for name in SAVED:
        action = draw(st.sampled_from(list(Action)))
        actions[name] = draw(st.one_of(st.just(action), st.just(action.value), JUNK))
    if draw(st.booleans()):
        actions[draw(st.one_of(st.none(), st.integers(), st.text(max_size=3)))] = Action.KEEP
    prefetch = {name: draw(sometimes_junk(st.integers(0, 2**54))) for name in SAVED if draw(st.booleans())}
    groups = {draw(st.one_of(NAME, NAME, st.none(), st.integers(), st.just(""))): draw(sometimes_junk(st.lists(st.sampled_from(["op0", "op1"]), max_size=2)))
              for _ in range(draw(st.integers(0, 2)))}
    return dict(
        workload_name=draw(sometimes_junk(NAME)), workload_fingerprint=draw(sometimes_junk(NAME)),
        policy=draw(sometimes_junk(NAME)),
        budget_bytes=draw(st.one_of(st.none(), st.integers(-5, 2**60), JUNK)),
        actions=draw(st.one_of(st.just(actions), JUNK)), prefetch_step=draw(st.one_of(st.just(prefetch), JUNK)),
        recompute_groups=draw(st.one_of(st.just(groups), JUNK)),
        info=draw(st.one_of(st.dictionaries(st.text(max_size=3), JSON_VALUE, max_size=3), JUNK)),
    )


@PROPERTY
@given(plan_fields())
def test_every_plan_the_constructor_accepts_loads_back_equal_with_the_same_counts(fields):
    try:
        plan = Plan(**fields)
    except ValidationError:
        return
    assert all(isinstance(a, Action) for a in plan.actions.values())
    given_values = [a.value if isinstance(a, Action) else a for a in fields["actions"].values()]
    for action in Action:
        assert plan.count(action) == given_values.count(action.value)
    text = plan.to_json()
    again = Plan.from_dict(json.loads(text))
    assert again == plan
    assert again.to_json() == text


HW_FIELDS = {f.name: getattr(PRESETS["a100-80gb-pcie4"], f.name) for f in dataclasses.fields(Hardware)}


@st.composite
def hardware_fields(draw):
    fields = dict(HW_FIELDS)
    for key in draw(st.sets(st.sampled_from(sorted(fields)), max_size=3)):
        fields[key] = draw(JUNK)
    return fields


@PROPERTY
@given(hardware_fields())
def test_every_hardware_the_constructor_accepts_loads_back_equal(fields):
    try:
        hw = Hardware(**fields)
    except ValidationError:
        return
    again = Hardware.from_dict(json.loads(json.dumps(hw.to_dict())))
    assert again == hw


TIMELINE = slackswap.simulate(BASE)
EVENT_VALID = dict(
    stream=st.sampled_from(["compute", "d2h", "h2d"]),
    kind=st.sampled_from(["forward", "backward", "recompute", "copy_out", "copy_in", "stall_copy", "stall_memory"]),
    name=NAME, start_s=st.floats(0, 1e3), end_s=st.floats(0, 2e3), size_bytes=st.integers(0, 2**54),
    step=st.integers(-2, 2**54),
)


@st.composite
def event_fields(draw):
    return {key: draw(sometimes_junk(valid)) for key, valid in EVENT_VALID.items()}


def built_or_none(kind, fields):
    try:
        return kind(**fields)
    except ValidationError:
        return None


@PROPERTY
@given(event_fields())
def test_every_event_the_constructor_accepts_loads_back_equal(fields):
    event = built_or_none(Event, fields)
    if event is None:
        return
    timeline = dataclasses.replace(TIMELINE, events=(event,))
    assert Timeline.from_dict(json.loads(json.dumps(timeline.to_dict()))).events == (event,)


TIMELINE_VALID = dict(
    workload_name=NAME, hardware_name=NAME, policy=NAME, budget_bytes=st.one_of(st.none(), st.integers(-1, 2**54)),
    step_time_s=st.floats(0, 1e3), ideal_step_time_s=st.floats(0, 1e3), peak_memory_bytes=st.integers(0, 2**54),
    d2h_bytes=st.integers(0, 2**54), h2d_bytes=st.integers(0, 2**54), recompute_time_s=st.floats(0, 10),
    stall_copy_s=st.floats(0, 10), stall_memory_s=st.floats(0, 10),
)


@st.composite
def timeline_fields(draw):
    fields = {key: draw(sometimes_junk(valid)) for key, valid in TIMELINE_VALID.items()}
    events = [built_or_none(Event, draw(event_fields())) for _ in range(draw(st.integers(0, 3)))]
    fields["events"] = draw(st.one_of(*[st.just(tuple(e for e in events if e is not None))] * 6, JUNK))
    points = st.tuples(sometimes_junk(st.floats(0, 1e3)), sometimes_junk(st.integers(0, 2**54)))
    fields["memory"] = draw(st.one_of(*[st.lists(points, max_size=3).map(tuple)] * 6, JUNK))
    return fields


@PROPERTY
@given(timeline_fields())
def test_every_timeline_the_constructor_accepts_loads_back_equal(fields):
    timeline = built_or_none(Timeline, fields)
    if timeline is None:
        return
    text = json.dumps(timeline.to_dict())
    again = Timeline.from_dict(json.loads(text))
    assert again == timeline
    assert json.dumps(again.to_dict()) == text


@st.composite
def schedule_fields(draw):
    groups = [built_or_none(RecomputeGroup, dict(
        step=draw(sometimes_junk(st.integers(-1, 2**54))), before=draw(sometimes_junk(NAME)),
        ops=draw(sometimes_junk(st.lists(NAME, max_size=2))))) for _ in range(draw(st.integers(0, 2)))]
    copies = [built_or_none(CopyBack, dict(
        tensor=draw(sometimes_junk(NAME)), issue_step=draw(sometimes_junk(st.integers(-1, 2**54))),
        start_step=draw(sometimes_junk(st.integers(-1, 2**54))))) for _ in range(draw(st.integers(0, 2)))]
    return dict(recompute_groups=draw(st.one_of(st.just([g for g in groups if g is not None]), JUNK)),
                copy_backs=draw(st.one_of(st.just(tuple(c for c in copies if c is not None)), JUNK)))


@PROPERTY
@given(schedule_fields())
def test_every_schedule_the_constructor_accepts_loads_back_equal(fields):
    schedule = built_or_none(ExecutionSchedule, fields)
    if schedule is None:
        return
    assert ExecutionSchedule.from_dict(json.loads(json.dumps(schedule.to_dict()))) == schedule


@pytest.mark.parametrize("make, message", [
    (lambda: Event("gpu", "forward", "op0", 0.0, 1.0), "event.stream is 'gpu': use one of compute, d2h, h2d"),
    (lambda: Event("compute", "forward", "op0", 2.0, 1.0), "event ends at 1.0 s, before it starts at 2.0 s"),
    (lambda: Event("compute", "forward", "op0", math.nan, 1.0), "event.start_s must be finite"),
    (lambda: Event("compute", "forward", "op0", 0.0, 1.0, -1), "event.size_bytes must be at least 0"),
    (lambda: dataclasses.replace(TIMELINE, budget_bytes=math.inf),
     "timeline.budget_bytes must be an integer, got inf"),
    (lambda: dataclasses.replace(TIMELINE, events=[1]), "timeline.events must be a tuple"),
    (lambda: dataclasses.replace(TIMELINE, memory=((0.0, -3),)),
     "timeline.memory\\[0\\].bytes must be at least 0"),
    (lambda: RecomputeGroup(step=-1, before="op1", ops=("op0",)), "recompute_group.step must be at least 0"),
    (lambda: CopyBack(tensor="a1", issue_step="3", start_step=0), "copy_back.issue_step must be an integer"),
    (lambda: ExecutionSchedule(copy_backs=({"tensor": "a1"},)), "plan.schedule.copy_backs must be a tuple of CopyBack"),
])
def test_timeline_and_schedule_constructors_refuse_what_the_loader_refuses(make, message):
    with pytest.raises(ValidationError, match=message):
        make()


# ---- the probes of issue 15 ------------------------------------------------------------------
PLAN = make_plan(BASE, {"a1": Action.SWAP, "a2": Action.RECOMPUTE}, policy="hand", budget_bytes=500)


@pytest.mark.parametrize("bad", [{}, "plan.json", 3])
def test_simulate_refuses_a_plan_that_is_not_a_plan(bad):
    with pytest.raises(ValidationError, match="plan must be a slackswap.Plan"):
        slackswap.simulate(BASE, plan=bad)


@pytest.mark.parametrize("changes", [
    dict(budget_bytes=math.nan), dict(budget_bytes="1GiB"), dict(budget_bytes=-5), dict(budget_bytes=2**60),
    dict(prefetch_step={"a1": "3"}), dict(actions=None), dict(actions={"a1": 7}), dict(prefetch_step={"zz": 1}),
])
def test_plan_fields_the_loader_would_refuse_are_refused_when_built(changes):
    with pytest.raises(ValidationError, match="plan\\."):
        dataclasses.replace(PLAN, **changes)


def test_a_plan_built_with_string_actions_counts_them():
    plan = dataclasses.replace(PLAN, actions={k: v.value for k, v in PLAN.actions.items()})
    assert plan == PLAN
    assert (plan.count(Action.SWAP), plan.count(Action.RECOMPUTE)) == (1, 1)


@pytest.mark.parametrize("budget", [-5, math.nan])
def test_make_plan_refuses_a_budget_the_loader_would_refuse(budget):
    with pytest.raises(ValidationError, match="budget_bytes"):
        make_plan(BASE, {}, policy="hand", budget_bytes=budget)


def test_make_plan_refuses_a_swapped_step_input():
    with pytest.raises(ValidationError, match="step input"):
        make_plan(BASE, {"x": Action.SWAP}, policy="hand", budget_bytes=500)


def test_api_plan_refuses_a_budget_that_could_not_be_saved():
    with pytest.raises(SlackswapError):
        slackswap.plan(BASE, budget=10**30)


@pytest.mark.parametrize("changes,field", [
    (dict(name=""), "workload.name"), (dict(op_layer=-7), "layer"), (dict(op_layer="x"), "layer"),
    (dict(op_kind=""), "kind"), (dict(op_inputs=["x"]), "inputs"), (dict(meta={"f": object()}), "meta"),
])
def test_workload_fields_the_loader_would_refuse_are_refused_when_built(changes, field):
    op_changes = {k[3:]: v for k, v in changes.items() if k.startswith("op_")}
    top = {k: v for k, v in changes.items() if not k.startswith("op_")}
    with pytest.raises(ValidationError, match=field):
        ops = (dataclasses.replace(BASE.ops[0], **op_changes),) + BASE.ops[1:]
        Workload(**{"name": BASE.name, "ops": ops, "tensors": BASE.tensors, "meta": {}, **top})


@pytest.mark.parametrize("text", [None, 3, "[" * 100_000])
def test_workload_from_json_refuses_what_is_not_json_text(text):
    with pytest.raises(ValidationError, match="workload"):
        Workload.from_json(text)


def test_a_hardware_with_absurd_rates_is_named_as_the_problem():
    slow = PRESETS["a100-80gb-pcie4"].replace(name="slow", peak_flops_per_s=1)
    with pytest.raises(ValidationError, match="hardware 'slow' makes one op take .* rates are per second"):
        slackswap.simulate("gpt2-xl", slow)
