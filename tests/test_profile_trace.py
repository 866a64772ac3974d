"""The profiler-runtime contract (slackswap.profile_trace): names made and parsed in one place,
a typed trace read from the workload, and the trace inside the workload's fingerprint."""

from __future__ import annotations

import dataclasses
import json

import pytest

from slackswap.errors import PlanMismatchError
from slackswap.profile_trace import (
    CallEntered, ModuleCall, ProfileTrace, TensorSaved, TensorSource, aten_of, call_name, op_name, output_name,
    tensor_source, version_name,
)
from slackswap.schedule import check_plan, make_plan
from slackswap.workload import Op, Tensor, Workload
from slackswap.workloads.synthetic import chain


def test_names_round_trip():
    op = op_name("h.0.mlp.fc@1", "addmm", 3)
    assert op == "h.0.mlp.fc@1/addmm#3" and aten_of(op) == "addmm"
    assert tensor_source(output_name(op, 2)) == TensorSource(written=False, index=2)
    assert tensor_source(version_name(op, 0)) == TensorSource(written=True, index=0)
    assert call_name("", 0) == "model" and call_name("", 2) == "model@2" and call_name("h.0", 1) == "h.0@1"
    assert ModuleCall.parse(call_name("", 2)) == ModuleCall("", 2)
    assert ModuleCall.parse(call_name("h.0.attn", 0)) == ModuleCall("h.0.attn", 0)


def traced_pair() -> Workload:
    """Two ops in the call 'model': op0 makes t0 from the input x, op1 reads t0 (saved for its backward)."""
    op0, op1 = op_name("model", "mul", 0), op_name("model", "relu", 1)
    t0, t1 = output_name(op0, 0), output_name(op1, 0)
    trace = ProfileTrace(
        calls={"model": None}, call_args={"model": ("x",)}, op_calls=("model", "model"),
        events=(CallEntered("model"), TensorSaved("x", op0, "model", False), TensorSaved(t0, op1, "model", False)),
    )
    def op(name, inputs, outputs):
        return Op(name=name, layer=0, kind="elementwise", fwd_time_s=1.0, bwd_time_s=1.0, flops=0.0,
                  bytes_accessed=0.0, inputs=inputs, outputs=outputs)

    def tensor(name, producer, readers):
        return Tensor(name=name, size_bytes=8, producer=producer, bwd_readers=readers)

    ops = (op(op0, ("x",), (t0,)), op(op1, (t0,), (t1,)))
    tensors = (tensor("x", None, (op0,)), tensor(t0, op0, (op1,)), tensor(t1, op1, ()))
    return Workload(name="pair", ops=ops, tensors=tensors, meta={"source": "test", **trace.to_meta()})


def test_trace_round_trips_through_the_workload_json():
    w = traced_pair()
    again = Workload.from_dict(json.loads(w.to_json()))
    trace = ProfileTrace.from_meta(again.meta)
    assert trace == ProfileTrace.from_meta(w.meta)
    assert [s.tensor for s in trace.saves] == ["x", "model/mul#0:0"]
    assert again.fingerprint == w.fingerprint


def test_the_trace_is_in_the_fingerprint_so_check_plan_refuses_another_trace():
    w = traced_pair()
    plan = make_plan(w, {}, policy="keep", budget_bytes=None)
    check_plan(w, plan)
    meta = dict(w.meta)
    meta["save_trace"] = [row for row in meta["save_trace"] if row[0] != "enter"]  # the same saves, no call
    other = dataclasses.replace(w, meta=meta)
    assert other.fingerprint != w.fingerprint
    with pytest.raises(PlanMismatchError, match="make the plan again"):
        check_plan(other, plan)
    # Meta outside the trace is not in it, and a workload without a trace keeps its fingerprint.
    assert dataclasses.replace(w, meta={**w.meta, "note": "x"}).fingerprint == w.fingerprint
    assert chain(3).fingerprint == dataclasses.replace(chain(3), meta={}).fingerprint


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.pop("save_trace"), "no profiler trace (meta.save_trace)"),
    (lambda m: m.update(save_trace=[["save", "x"]]), "malformed profiler trace"),
    (lambda m: m.pop("storage_versions"), "profiled by an older slackswap"),
])
def test_the_runtime_refuses_a_missing_or_broken_trace_with_the_fix(edit, message):
    from slackswap.runtime import build_execution_map

    w = traced_pair()
    meta = dict(w.meta)
    edit(meta)
    broken = dataclasses.replace(w, meta=meta)
    plan = make_plan(broken, {}, policy="keep", budget_bytes=None)
    with pytest.raises(PlanMismatchError) as info:
        build_execution_map(broken, plan)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_the_execution_map_follows_the_trace():
    from slackswap.runtime import build_execution_map

    w = traced_pair()
    emap = build_execution_map(w, make_plan(w, {}, policy="keep", budget_bytes=None))
    assert [(e.name, e.reader) for e in emap.pack_sequence] == [("x", 0), (w.ops[0].outputs[0], 1)]
    assert emap.aligned
