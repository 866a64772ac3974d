"""Fuzz every JSON loader with hostile documents.

Each loader (Workload, Plan + check_plan, Hardware, Timeline, TransformerSpec) gets
(1) arbitrary JSON from hypothesis, (2) valid documents with a few random mutations
(delete, duplicate, retype, rename or re-nest a field, swap list items, NaN, infinities,
negative and huge numbers, names that point elsewhere) and (3) valid files cut or
corrupted at random bytes. Whatever it is given, a loader either returns a value that
round-trips and can be used downstream, or raises a SlackswapError whose message is one
non-empty line. Any other exception (KeyError, TypeError, OverflowError, RecursionError,
...) is a bug.
"""

from __future__ import annotations

import copy
import json
import math
import os
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slackswap.errors import SlackswapError
from slackswap.hardware import PRESETS, Hardware
from slackswap.plans import Action, Plan
from slackswap.schedule import check_plan, make_plan
from slackswap.sim import simulate, simulate_ideal
from slackswap.timeline import Timeline
from slackswap.workload import Workload
from slackswap.workloads.models import MODELS, build_model_workload
from slackswap.workloads.spec import TransformerSpec
from slackswap.workloads.synthetic import chain, dag

HW = PRESETS["a100-80gb-pcie4"]
EXAMPLES = 150  # per test; the whole file stays well under a minute on 2 cores
# The same cases on every run (CI must not flake); SLACKSWAP_FUZZ=explore draws new ones.
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=os.environ.get("SLACKSWAP_FUZZ") != "explore",
                database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# ---- valid documents -------------------------------------------------------------------------


def branchy() -> Workload:
    """A DAG with a two-output op, a transient tensor and a tensor read by two backward ops."""
    return dag(
        ops=[("embed", ["x"], ["h0"]), ("split", ["h0"], ["q", "k"]), ("score", ["q", "k"], ["s"]),
             ("soft", ["s"], ["p"]), ("out", ["p", "h0"], ["y"])],
        sizes={"x": 8, "h0": 64, "q": 32, "k": 32, "s": 48, "p": 48, "y": 16},
        readers={"x": ["embed"], "h0": ["split", "out"], "q": ["score"], "k": ["score"], "p": ["soft", "out"]},
        fwd_time_s={"embed": 1.0, "split": 0.5, "score": 2.0, "soft": 0.25, "out": 1.5},
    )


TINY_SPEC = dict(layers=1, hidden=8, heads=2, ffn=16, vocab=11, seq_len=4, micro_batch=1)


def tiny_transformer() -> Workload:
    return build_model_workload("custom", HW, **TINY_SPEC)


def valid_workloads() -> list[Workload]:
    return [chain(4), branchy(), tiny_transformer()]


def valid_plans() -> list[tuple[Workload, Plan]]:
    w1 = chain(6, size_bytes=[100, 200, 300, 400, 500, 600])
    p1 = make_plan(w1, {"a1": Action.SWAP, "a2": Action.RECOMPUTE, "a3": Action.SWAP}, policy="hand",
                   budget_bytes=1500, hardware=HW)
    w2 = branchy()
    p2 = make_plan(w2, {"q": Action.RECOMPUTE, "p": Action.SWAP}, policy="hand", budget_bytes=200)
    return [(w1, p1), (w2, p2)]


def valid_timelines() -> list[Timeline]:
    return [simulate(w, HW, p) for w, p in valid_plans()] + [simulate_ideal(branchy(), HW)]


def json_round(data: Any) -> Any:
    """The document as a loader sees it after json.dumps/json.loads (NaN allowed, as Python writes it)."""
    return json.loads(json.dumps(data))


WORKLOAD_DOCS = [json_round(w.to_dict()) for w in valid_workloads()]
PLAN_DOCS = [(w, json_round(p.to_dict(w))) for w, p in valid_plans()]
HARDWARE_DOCS = [json_round(h.to_dict()) for h in PRESETS.values()]
TIMELINE_DOCS = [json_round(t.to_dict()) for t in valid_timelines()]
SPEC_DOCS = [json_round(s.to_dict()) for s in MODELS.values()] + [json_round({"name": "custom", **TINY_SPEC})]


# ---- what every loader must do ---------------------------------------------------------------


def assert_clean_error(exc: BaseException, *keywords: str) -> None:
    """A SlackswapError whose message is one non-empty line (and names what failed)."""
    assert isinstance(exc, SlackswapError), f"{type(exc).__name__} escaped: {exc!r}"
    message = str(exc)
    assert message.strip(), "empty error message"
    assert "\n" not in message and "\r" not in message, f"message is not one line: {message!r}"
    if keywords:
        assert any(k in message for k in keywords), f"message names none of {keywords}: {message!r}"


def outcome(fn: Callable[[], Any], *keywords: str) -> Any:
    """Run ``fn``: its value, or None after checking it raised a clean SlackswapError."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - the point is to see what escapes
        assert_clean_error(exc, *keywords)
        return None


def use_workload(w: Workload) -> None:
    """Round trip and simulate: a loaded workload must be usable, not just constructible."""
    assert Workload.from_dict(json_round(w.to_dict())) == w
    ideal = outcome(lambda: simulate_ideal(w, HW))
    if ideal is not None:
        assert math.isfinite(ideal.step_time_s) and ideal.peak_memory_bytes >= 0
        json.dumps(ideal.to_dict(), allow_nan=False)  # what --timeline and --json write


def load_plan_and_run(workload: Workload, doc: Any) -> None:
    plan = outcome(lambda: Plan.from_dict(doc), "plan")
    if plan is None:
        return
    assert Plan.from_dict(json_round(plan.to_dict())) == plan
    if outcome(lambda: check_plan(workload, plan), "plan") is None and not _checks(workload, plan):
        return
    timeline = outcome(lambda: simulate(workload, HW, plan, check=False), "budget")
    if timeline is not None:
        json.dumps(timeline.to_dict(), allow_nan=False)
        if timeline.budget_bytes is not None:
            assert timeline.peak_memory_bytes <= timeline.budget_bytes


def _checks(workload: Workload, plan: Plan) -> bool:
    try:
        check_plan(workload, plan)
        return True
    except SlackswapError:
        return False


def use_hardware(hw: Hardware) -> None:
    assert Hardware.from_dict(json_round(hw.to_dict())) == hw
    w, p = valid_plans()[0]
    timeline = outcome(lambda: simulate(w, hw, p))
    if timeline is not None:
        assert math.isfinite(timeline.step_time_s)
        json.dumps(timeline.to_dict(), allow_nan=False)


def use_timeline(t: Timeline) -> None:
    assert Timeline.from_dict(json_round(t.to_dict())) == t
    json.dumps(t.summary())


def use_spec(spec: TransformerSpec) -> None:
    assert TransformerSpec.from_dict(json_round(spec.to_dict())) == spec


LOADERS: dict[str, tuple[Callable[[Any], Any], Callable[[Any], None], tuple[str, ...]]] = {
    # kind: (from_dict, what to do with a loaded value, words one of which the message must contain)
    "workload": (Workload.from_dict, use_workload, ("workload",)),
    "hardware": (Hardware.from_dict, use_hardware, ("hardware",)),
    "timeline": (Timeline.from_dict, use_timeline, ("timeline",)),
    "spec": (TransformerSpec.from_dict, use_spec, ("model spec",)),
}


def load_and_use(kind: str, doc: Any) -> bool:
    from_dict, use, keywords = LOADERS[kind]
    value = outcome(lambda: from_dict(doc), *keywords)
    if value is None:
        return False
    use(value)
    return True


# ---- mutations of valid documents ------------------------------------------------------------

HOSTILE_VALUES = [
    None, True, False, 0, -1, 1, 2**63, 10**400, -(10**400), 0.5, -0.0, 1e308, -1e308, 1e-320,
    math.nan, math.inf, -math.inf, "", "x", "op0", "a0", "keep", "swap", "recompute", "0", "NaN",
    [], [None], [1, 2], {}, {"a": 1}, "\n", "a\nb",
]


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path into ``doc`` (the root is ())."""
    found = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            found.extend(_paths(value, prefix + (key,)))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            found.extend(_paths(value, prefix + (i,)))
    return found


def _strings(doc: Any) -> list[str]:
    if isinstance(doc, str):
        return [doc]
    if isinstance(doc, dict):
        return [s for k, v in doc.items() for s in [k, *_strings(v)]]
    if isinstance(doc, list):
        return [s for v in doc for s in _strings(v)]
    return []


def _get(doc: Any, path: tuple) -> Any:
    for key in path:
        doc = doc[key]
    return doc


MUTATIONS = ("delete", "duplicate", "replace", "rename", "wrap_list", "wrap_dict", "swap_items",
             "numeric", "cross_reference")


@st.composite
def mutated(draw, docs: list) -> Any:
    doc = copy.deepcopy(draw(st.sampled_from(docs)))
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(doc)
        path = draw(st.sampled_from(paths))
        kind = draw(st.sampled_from(MUTATIONS))
        if not path:  # the root itself
            if kind in ("wrap_list", "replace"):
                doc = [doc] if kind == "wrap_list" else draw(st.sampled_from(HOSTILE_VALUES))
            continue
        parent, key = _get(doc, path[:-1]), path[-1]
        value = parent[key]
        if kind == "delete":
            del parent[key]
        elif kind == "duplicate":
            if isinstance(parent, list):
                parent.insert(key, copy.deepcopy(value))
            else:
                parent[f"{key}_copy"] = copy.deepcopy(value)
        elif kind == "replace":
            parent[key] = copy.deepcopy(draw(st.sampled_from(HOSTILE_VALUES)))
        elif kind == "rename" and isinstance(parent, dict):
            parent[key.upper() if key != key.upper() else key + "_"] = parent.pop(key)
        elif kind == "wrap_list":
            parent[key] = [value]
        elif kind == "wrap_dict":
            parent[key] = {"value": value}
        elif kind == "swap_items" and isinstance(parent, list) and len(parent) > 1:
            other = draw(st.integers(0, len(parent) - 1))
            parent[key], parent[other] = parent[other], parent[key]
        elif kind == "numeric" and isinstance(value, (int, float)) and not isinstance(value, bool):
            factor = draw(st.sampled_from([-1, 0, 1e12, 1e300, 1e-300, 0.5, 10**30]))
            parent[key] = value * factor
        elif kind == "cross_reference":
            parent[key] = draw(st.sampled_from(_strings(doc) or ["x"]))
    return doc


# ---- arbitrary JSON ------------------------------------------------------------------------

json_scalars = (st.none() | st.booleans() | st.integers() | st.integers(min_value=-(10**500), max_value=10**500)
                | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8))
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
# Objects that look like each format at the top level, with random field values.
WORKLOAD_KEYS = ["format", "name", "meta", "ops", "tensors"]
OP_KEYS = ["name", "layer", "kind", "fwd_time_s", "bwd_time_s", "flops", "bytes_accessed", "inputs", "outputs"]
TENSOR_KEYS = ["name", "size_bytes", "producer", "bwd_readers"]


def shaped(keys: list[str], values=json_values):
    return st.dictionaries(st.sampled_from(keys), values, max_size=len(keys))


shaped_workload = st.fixed_dictionaries({
    "name": st.text(max_size=4) | json_values,
    "ops": st.lists(shaped(OP_KEYS, json_values | st.sampled_from(["op0", "a0", "x"])), max_size=3),
    "tensors": st.lists(shaped(TENSOR_KEYS, json_values | st.sampled_from(["op0", "a0", "x"])), max_size=3),
})


# ---- the tests -----------------------------------------------------------------------------

@pytest.mark.parametrize("kind", list(LOADERS))
@FUZZ
@given(data=st.data())
def test_arbitrary_json_gives_a_clean_error_or_a_value(generated_cases, kind, data):
    doc = data.draw(json_values | shaped(WORKLOAD_KEYS + OP_KEYS + TENSOR_KEYS))
    generated_cases[f"loader {kind}: arbitrary JSON"] += 1
    load_and_use(kind, doc)


@FUZZ
@given(doc=shaped_workload)
def test_workload_shaped_junk_gives_a_clean_error(generated_cases, doc):
    generated_cases["loader workload: workload-shaped junk"] += 1
    load_and_use("workload", doc)


@pytest.mark.parametrize("kind, docs", [
    ("workload", WORKLOAD_DOCS), ("hardware", HARDWARE_DOCS), ("timeline", TIMELINE_DOCS), ("spec", SPEC_DOCS),
])
@FUZZ
@given(data=st.data())
def test_mutated_documents_give_a_clean_error_or_a_usable_value(generated_cases, kind, docs, data):
    doc = data.draw(mutated(docs))
    generated_cases[f"loader {kind}: mutated valid document"] += 1
    load_and_use(kind, doc)


@FUZZ
@given(data=st.data())
def test_mutated_plans_fail_cleanly_in_load_check_or_simulate(generated_cases, data):
    index = data.draw(st.integers(0, len(PLAN_DOCS) - 1))
    workload, doc = PLAN_DOCS[index]
    generated_cases["loader plan: mutated plan, checked and simulated"] += 1
    load_plan_and_run(workload, data.draw(mutated([doc])))


@FUZZ
@given(data=st.data())
def test_plans_for_another_workload_are_rejected(generated_cases, data):
    """Every valid plan checked against every other valid workload: PlanMismatchError, one line."""
    from slackswap.errors import PlanMismatchError

    generated_cases["loader plan: plan for another workload"] += 1
    _, doc = data.draw(st.sampled_from(PLAN_DOCS))
    other = data.draw(st.sampled_from(valid_workloads() + [chain(6)]))
    plan = Plan.from_dict(doc)
    if other.fingerprint == plan.workload_fingerprint:
        check_plan(other, plan)
        return
    with pytest.raises(PlanMismatchError) as info:
        check_plan(other, plan)
    assert_clean_error(info.value, "plan")
    assert "make the plan again" in str(info.value)


def _loaders_from_files():
    return {
        "workload": Workload.load, "hardware": Hardware.load, "timeline": Timeline.load, "plan": Plan.load,
    }


FILE_TEXTS = (
    [("workload", w.to_json()) for w in valid_workloads()]
    + [("hardware", json.dumps(h.to_dict(), indent=1)) for h in PRESETS.values()]
    + [("timeline", json.dumps(t.to_dict())) for t in valid_timelines()]
    + [("plan", p.to_json(w)) for w, p in valid_plans()]
)


@FUZZ
@given(data=st.data())
def test_truncated_and_corrupted_files_give_a_clean_error(generated_cases, tmp_path_factory, data):
    kind, text = data.draw(st.sampled_from(FILE_TEXTS))
    raw = text.encode()
    how = data.draw(st.sampled_from(["truncate", "flip", "insert", "bom", "latin1"]))
    at = data.draw(st.integers(0, len(raw)))
    if how == "truncate":
        raw = raw[:at]
    elif how == "flip":
        raw = raw[:at] + bytes([data.draw(st.integers(0, 255))]) + raw[at + 1:]
    elif how == "insert":
        raw = raw[:at] + data.draw(st.binary(min_size=1, max_size=4)) + raw[at:]
    elif how == "bom":
        raw = b"\xef\xbb\xbf" + raw
    else:
        raw = raw[:at] + b"\xe9" + raw[at:]  # not UTF-8
    generated_cases[f"file {kind}: {how}"] += 1
    path = tmp_path_factory.getbasetemp() / f"fuzz-{kind}.json"
    path.write_bytes(raw)
    loader = _loaders_from_files()[kind]
    value = outcome(lambda: loader(path), kind)
    if value is not None and kind in LOADERS:
        LOADERS[kind][1](value)


@pytest.mark.parametrize("kind", ["workload", "hardware", "timeline", "plan"])
@pytest.mark.parametrize("content, fragment", [
    (b"", "not valid JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "JSON"),  # deeper than Python's recursion limit
    (b"1" * 5000, "JSON"),  # an integer longer than Python's 4300-digit conversion limit
    (b"\xff\xfe{}", "cannot read"),
    (b"null", "must be a JSON object"),
    (b'{"format": "slackswap.other/9"}', "format"),
])
def test_hostile_files(tmp_path, kind, content, fragment):
    path = tmp_path / "hostile.json"
    path.write_bytes(content)
    with pytest.raises(SlackswapError) as info:
        _loaders_from_files()[kind](path)
    assert_clean_error(info.value, fragment)


@pytest.mark.parametrize("kind", ["workload", "hardware", "timeline", "plan"])
def test_missing_file_and_directory(tmp_path, kind):
    load = _loaders_from_files()[kind]
    with pytest.raises(SlackswapError) as info:
        load(tmp_path / "nope.json")
    assert_clean_error(info.value, "does not exist")
    with pytest.raises(SlackswapError) as info:
        load(tmp_path)
    assert_clean_error(info.value, "cannot read")


def test_unreadable_file_names_the_problem(tmp_path, monkeypatch):
    """Permission bits do not stop root (CI containers), so the PermissionError is injected."""
    from slackswap import _fields

    path = tmp_path / "w.json"
    chain(3).save(path)

    def denied(file, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(file))

    monkeypatch.setattr(_fields, "open", denied, raising=False)  # the loaders read through _fields
    with pytest.raises(SlackswapError) as info:
        Workload.load(path)
    assert_clean_error(info.value, "Permission denied")


def test_the_valid_documents_load():
    """The seeds of the mutations are themselves valid: otherwise the fuzzing proves little."""
    for doc in WORKLOAD_DOCS:
        use_workload(Workload.from_dict(doc))
    for workload, doc in PLAN_DOCS:
        plan = Plan.from_dict(doc)
        check_plan(workload, plan)
        simulate(workload, HW, plan)
    for doc in HARDWARE_DOCS:
        use_hardware(Hardware.from_dict(doc))
    for doc in TIMELINE_DOCS:
        use_timeline(Timeline.from_dict(doc))
    for doc in SPEC_DOCS:
        use_spec(TransformerSpec.from_dict(doc))


# ---- the edges the fuzzing found, pinned -----------------------------------------------------

def _with(doc: dict, path: tuple, value: Any) -> dict:
    doc = copy.deepcopy(doc)
    _get(doc, path[:-1])[path[-1]] = value
    return doc


W0 = WORKLOAD_DOCS[0]  # chain(4)
HW0 = HARDWARE_DOCS[0]
TL0 = TIMELINE_DOCS[0]


@pytest.mark.parametrize("kind, doc, fragment", [
    # sums of op times overflowed to inf, and the step time printed as Infinity
    ("workload", _with(_with(W0, ("ops", 0, "fwd_time_s"), 1e308), ("ops", 1, "fwd_time_s"), 1e308), "times are in seconds"),
    ("workload", _with(W0, ("ops", 0, "bwd_time_s"), 10**400), "finite"),  # OverflowError before
    ("workload", _with(W0, ("tensors", 1, "size_bytes"), 2**60), "at most"),
    ("workload", _with(W0, ("tensors", 1, "size_bytes"), 100.5), "integer"),
    ("workload", _with(W0, ("name",), "bad \ud800 name"), "workload.name"),  # lone surrogate: cannot be printed
    ("workload", _with(W0, ("tensors", 1, "bwd_readers"), ["op1", "op1"]), "twice"),
    ("workload", _with(W0, ("ops",), list(reversed(W0["ops"]))), "execution order"),
    ("workload", _with(W0, ("ops", 0, "inputs"), ["a2"]), "before any earlier op"),
    # copy and op times of inf made throughput 0% and --json crash on Infinity
    ("hardware", _with(HW0, ("d2h_bytes_per_s",), 1e-320), "at least 1 per second"),
    ("hardware", _with(HW0, ("h2d_bytes_per_s",), 10**400), "finite"),  # OverflowError before
    ("hardware", _with(HW0, ("copy_latency_s",), 1e308), "microseconds"),
    ("hardware", _with(HW0, ("duplex_h2d_factor",), 1e-300), "typo"),
    ("hardware", _with(HW0, ("gemm_efficiency",), 1.5), "at most 1"),
    ("hardware", _with(HW0, ("hbm_capacity_bytes",), -5), "at least 1"),
    # timeline rows were read with float()/int(): ValueError and TypeError escaped
    ("timeline", _with(TL0, ("events", 0, 3), "abc"), "events[0].start_s"),
    ("timeline", _with(TL0, ("events", 0, 5), None), "events[0].size_bytes"),
    ("timeline", _with(TL0, ("events", 0, 4), math.nan), "events[0].end_s"),
    ("timeline", _with(TL0, ("events", 0, 0), "gpu"), "stream"),
    ("timeline", _with(TL0, ("events", 0, 4), -1.0), "events[0]"),
    ("timeline", _with(TL0, ("memory", 0, 0), []), "memory[0].time_s"),
    ("timeline", _with(TL0, ("memory", 0), [0.0]), "memory[0]"),
    ("spec", {"name": "custom", **TINY_SPEC, "heads": 3}, "divisible"),
    ("spec", {"name": "custom", **TINY_SPEC, "dropout": "yes"}, "true or false"),
    ("spec", {"name": "custom", **TINY_SPEC, "layers": 0}, "layers"),
])
def test_pinned_edges(kind, doc, fragment):
    with pytest.raises(SlackswapError) as info:
        LOADERS[kind][0](doc)
    assert_clean_error(info.value, fragment)


def test_huge_integers_are_named_without_printing_them():
    doc = _with(W0, ("ops", 0, "layer"), 10**4000)
    with pytest.raises(SlackswapError) as info:
        Workload.from_dict(doc)
    assert_clean_error(info.value, "bits")
    assert len(str(info.value)) < 200


def test_absurd_model_sizes_are_rejected_before_building():
    with pytest.raises(SlackswapError) as info:
        TransformerSpec.from_dict({"name": "custom", **TINY_SPEC, "layers": 10**6})
    assert_clean_error(info.value, "layers")
