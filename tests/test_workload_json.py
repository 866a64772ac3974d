"""Workload JSON: round trips, and one precise ValidationError for each kind of bad input."""

from __future__ import annotations

import copy
import json
import math

import pytest

from slackswap.errors import ValidationError
from slackswap.workload import Workload
from slackswap.workloads.synthetic import chain, dag


def branchy() -> Workload:
    return dag(
        [("op0", ["x"], ["p", "q"]), ("op1", ["p"], ["s"]), ("op2", ["s", "q"], ["y"])],
        {"x": 8, "p": 100, "q": 50, "s": 25, "y": 1},
        {"x": ["op0"], "p": ["op0", "op1"], "q": ["op2"]},
        fwd_time_s={"op0": 0.1, "op1": 1e-7, "op2": 3.0}, bwd_time_s=0.3,
    )


@pytest.mark.parametrize("workload", [chain(4, size_bytes=(3, 5, 7, 11)), branchy()], ids=["chain", "branchy"])
def test_round_trip_through_json_text_and_files(workload, tmp_path):
    again = Workload.from_json(workload.to_json())
    assert again == workload and again.fingerprint == workload.fingerprint
    assert dict(again.meta) == dict(workload.meta)
    assert [t.name for t in again.saved_tensors] == [t.name for t in workload.saved_tensors]
    path = tmp_path / "w.json"
    workload.save(path)
    loaded = Workload.load(path)
    assert loaded == workload and loaded.to_json() == workload.to_json()


def test_fingerprint_changes_with_structure_but_not_meta():
    w = chain(3)
    data = w.to_dict()
    data["meta"] = {"note": "different"}
    assert Workload.from_dict(data).fingerprint == w.fingerprint
    data["tensors"][1]["size_bytes"] = 101
    assert Workload.from_dict(data).fingerprint != w.fingerprint


def _mutate(path: str, value):
    """A function that sets data[path] (dotted, with list indices) to value, or deletes it for ..."""
    def apply(data):
        keys = [int(k) if k.isdigit() else k for k in path.split(".")]
        target = data
        for key in keys[:-1]:
            target = target[key]
        if value is ...:
            del target[keys[-1]]
        else:
            target[keys[-1]] = value
        return data
    return apply


BAD = [
    # unknown references
    ("ops.1.inputs", ["nope"], "workload.ops[1] ('op1').inputs names unknown tensor 'nope'"),
    ("ops.1.outputs", ["nope"], "workload.ops[1] ('op1').outputs names unknown tensor 'nope'"),
    ("tensors.1.producer", "ghost", "workload.tensors[1] ('a0').producer names unknown op 'ghost'"),
    ("tensors.1.bwd_readers", ["ghost"], "workload.tensors[1] ('a0').bwd_readers names unknown op 'ghost'"),
    # order and cycles: op0 reading a1, which op1 makes, is a cycle that cannot be ordered
    ("ops.0.inputs", ["a1"], "workload.ops[0] ('op0').inputs reads 'a1' before any earlier op produces it"),
    # numbers: negative, zero, NaN, infinite
    ("tensors.1.size_bytes", -5, "workload.tensors[1].size_bytes must be at least 1"),
    ("tensors.1.size_bytes", 0, "workload.tensors[1].size_bytes must be at least 1"),
    ("tensors.1.size_bytes", 100.5, "workload.tensors[1].size_bytes must be an integer"),
    ("tensors.1.size_bytes", math.nan, "workload.tensors[1].size_bytes must be an integer"),
    ("ops.0.fwd_time_s", -1.0, "workload.ops[0].fwd_time_s must be zero or positive"),
    ("ops.0.bwd_time_s", math.nan, "workload.ops[0].bwd_time_s must be finite"),
    ("ops.0.fwd_time_s", math.inf, "workload.ops[0].fwd_time_s must be finite"),
    ("ops.0.flops", -2.0, "workload.ops[0].flops must be zero or positive"),
    ("ops.0.layer", -2, "workload.ops[0].layer must be at least -1"),
    # wrong types
    ("tensors.1.size_bytes", "100", "workload.tensors[1].size_bytes must be an integer"),
    ("tensors.1.size_bytes", True, "workload.tensors[1].size_bytes must be an integer"),
    ("ops.0.fwd_time_s", "1", "workload.ops[0].fwd_time_s must be a number"),
    ("ops.0.inputs", "x", "workload.ops[0].inputs must be a list of non-empty strings"),
    ("ops.0.name", 7, "workload.ops[0].name must be a non-empty string"),
    ("ops", {"op0": {}}, "workload.ops must be a list"),
    ("ops.0", ["op0"], "workload.ops[0] must be a JSON object"),
    ("meta", [], "workload.meta must be an object"),
    # unknown and missing fields
    ("colour", "red", "workload has unknown field 'colour'"),
    ("ops.2.fwd_time", 1.0, "workload.ops[2] has unknown field 'fwd_time'"),
    ("tensors.0.bytes", 1, "workload.tensors[0] has unknown field 'bytes'"),
    ("ops.0.fwd_time_s", ..., "workload.ops[0].fwd_time_s is missing"),
    ("tensors.2.size_bytes", ..., "workload.tensors[2].size_bytes is missing"),
    ("name", ..., "workload.name is missing"),
    # structure
    ("format", "slackswap.workload/0", "workload.format is 'slackswap.workload/0'"),
    ("ops", [], "workload.ops is empty"),
    ("ops.1.name", "op0", "workload.ops[1] ('op0'): duplicate op name"),
    ("tensors.2.name", "a0", "workload.tensors[2] ('a0'): duplicate tensor name"),
    ("tensors.1.bwd_readers", ["op1", "op1"], "workload.tensors[1] ('a0').bwd_readers lists an op twice"),
    ("tensors.1.bwd_readers", ["op2"], "bwd_readers names 'op2', which neither reads nor produces it"),
    ("ops.2.outputs", [], "workload.tensors[3] ('a2').producer 'op2' does not list it in its outputs"),
    ("ops.2.outputs", ["a2", "a1"], "workload.ops[2] ('op2').outputs lists 'a1', whose producer is 'op1'"),
]


@pytest.mark.parametrize("path, value, message", BAD, ids=[f"{p}={v!r}" for p, v, _ in BAD])
def test_bad_workload_names_the_field(path, value, message):
    data = _mutate(path, value)(copy.deepcopy(chain(3).to_dict()))
    with pytest.raises(ValidationError) as info:
        Workload.from_dict(data)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_nan_in_json_text_is_rejected_with_the_field():
    text = chain(3).to_json().replace('"fwd_time_s": 1.0', '"fwd_time_s": NaN', 1)
    with pytest.raises(ValidationError, match=r"workload\.ops\[0\]\.fwd_time_s must be finite"):
        Workload.from_json(text)


def test_malformed_json_text_and_files(tmp_path):
    with pytest.raises(ValidationError, match=r"workload is not valid JSON \(line 1"):
        Workload.from_json('{"name": ')
    with pytest.raises(ValidationError, match="workload must be a JSON object"):
        Workload.from_json("[1, 2]")
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x",\n  "ops": [}\n')
    with pytest.raises(ValidationError, match=r"workload file .*bad\.json' is not valid JSON \(line 2"):
        Workload.load(bad)
    with pytest.raises(ValidationError, match="does not exist"):
        Workload.load(tmp_path / "missing.json")


def test_constructor_rejects_bad_numbers_too():
    w = chain(2)
    op = w.ops[0]
    with pytest.raises(ValidationError, match=r"workload\.ops\[0\] \('op0'\)\.fwd_time_s must be a finite number"):
        Workload(name="w", ops=(op.__class__(**{**{f: getattr(op, f) for f in op.__slots__}, "fwd_time_s": math.nan}),)
                 + w.ops[1:], tensors=w.tensors)


def test_json_is_deterministic():
    assert json.dumps(branchy().to_dict()) == json.dumps(branchy().to_dict())
