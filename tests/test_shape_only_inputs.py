"""Inputs read only for their metadata (empty_like's, randn_like's): not dependencies (issue 17).

A dropout mask is ``empty_like(x)``, ``bernoulli_``, ``div_``: ``x`` sizes the mask and is never
read. The profiler lists it in ``Op.shape_inputs``, so the mask's recompute group does not re-run
``x``'s producer (here a projection matmul whose output autograd does not save), and the runtime
replays ``empty_like`` on a stand-in of ``x``'s shape and strides. Training stays bit for bit.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from slackswap import Action, Workload, make_plan  # noqa: E402
from slackswap.errors import ValidationError  # noqa: E402
from slackswap.profiler import profile_model  # noqa: E402
from slackswap.runtime import apply_plan  # noqa: E402
from slackswap.workloads.synthetic import chain  # noqa: E402


class ProjectionDropout(nn.Module):
    """A projection, then dropout; then noise drawn in a transposed layout and scaled."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 16)
        self.proj = nn.Linear(16, 16)
        self.drop = nn.Dropout(0.5)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 64).reshape(16, 4))

    def forward(self, x):
        p = self.proj(torch.nn.functional.gelu(self.fc(x)))
        y = self.drop(p)
        # randn_like of a transposed view is laid out like the view, and torch fills a non-contiguous
        # tensor with other normal numbers than a contiguous one: the stand-in must keep the strides
        gate = torch.randn_like(y.t()) * self.scale
        return (y * gate.t()).square().mean()


def _loss(model, batch):
    return model(batch)


BATCHES = [torch.randn(4, 8, generator=torch.Generator().manual_seed(s)) for s in range(3)]


@pytest.fixture(scope="module")
def profiled():
    torch.manual_seed(0)
    model = ProjectionDropout()
    return model, profile_model(model, BATCHES[0], _loss, repeats=1, warmup=0)


def _op(workload, suffix: str):
    return next(op for op in workload.ops if op.name.endswith(suffix))


def _with_shape_inputs_as_inputs(workload: Workload) -> Workload:
    """The workload as the profiler recorded it before shape inputs: every shape input an input."""
    ops = tuple(dataclasses.replace(op, inputs=op.inputs + op.shape_inputs, shape_inputs=()) for op in workload.ops)
    return dataclasses.replace(workload, ops=ops)


def _mask_plan(workload: Workload):
    """Recompute the dropout mask, the noise and the scaled noise; keep everything else."""
    actions = {t.name: Action.KEEP for t in workload.saved_tensors}
    for op in ("drop/div_#2", "model/randn_like#2", "model/mul#3"):
        actions[_op(workload, op).outputs[0]] = Action.RECOMPUTE
    return make_plan(workload, actions, policy="mask-recompute", budget_bytes=None)


def test_the_profile_lists_empty_likes_input_as_shape_only(profiled):
    _, workload = profiled
    projection = _op(workload, "proj/addmm#1").outputs[0]
    empty_like = _op(workload, "drop/empty_like#0")
    assert empty_like.shape_inputs == (projection,) and empty_like.inputs == ()
    randn_like = _op(workload, "randn_like#2")
    assert randn_like.inputs == () and randn_like.shape_inputs  # the view's storage: the dropout's output
    # the mask's multiply reads the projection's values: an input there
    assert projection in _op(workload, "drop/mul#3").inputs


def test_the_masks_group_no_longer_re_runs_the_projection(profiled):
    _, workload = profiled
    plan = _mask_plan(workload)
    rerun = {op.split("/")[-1] for group in plan.recompute_groups.values() for op in group}
    assert rerun == {"empty_like#0", "bernoulli_#1", "div_#2", "randn_like#2", "mul#3"}
    # The same plan on the profile with empty_like's input as a dependency: the group re-runs the
    # projection, FLOPs included.
    before = _with_shape_inputs_as_inputs(workload)
    old = _mask_plan(before)
    old_rerun = {op for group in old.recompute_groups.values() for op in group}
    projection = _op(workload, "proj/addmm#1")
    assert projection.name in old_rerun
    assert plan.recompute_flops(workload) == 0.0 < projection.flops <= old.recompute_flops(before)


def _train(model, runtime=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(7)  # dropout and randn_like draw from here
    losses = []
    for batch in BATCHES:
        opt.zero_grad(set_to_none=True)
        with runtime if runtime is not None else contextlib.nullcontext():
            loss = _loss(model, batch)
            loss.backward()
        losses.append(loss.detach())
        opt.step()
    return losses, [p.grad.clone() for p in model.parameters()]


def _step_flops(model, runtime=None) -> int:
    torch.manual_seed(3)
    with FlopCounterMode(display=False) as counter:
        with runtime if runtime is not None else contextlib.nullcontext():
            _loss(model, BATCHES[0]).backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("shape_only", [True, False], ids=["shape-inputs", "old-profile"])
def test_training_under_the_mask_plan_is_bit_for_bit(profiled, shape_only):
    """The mask and the noise rebuilt from stand-ins (or, on a profile without shape inputs, from the
    re-run projection as before) give the gradients of plain training, re-running the plan's FLOPs."""
    base, workload = profiled
    if not shape_only:
        workload = _with_shape_inputs_as_inputs(workload)
    plan = _mask_plan(workload)
    reference = _train(copy.deepcopy(base))
    model = copy.deepcopy(base)
    runtime = apply_plan(model, plan, workload, backend="replay")
    got = _train(model, runtime)
    assert all(torch.equal(a, b) for a, b in zip(reference[0], got[0]))
    assert all(torch.equal(a, b) for a, b in zip(reference[1], got[1]))
    assert runtime.stats.step_recompute_ops == sum(len(g) for g in plan.recompute_groups.values())
    assert _step_flops(model, runtime) - _step_flops(copy.deepcopy(base)) == plan.recompute_flops(workload)


def test_shape_inputs_round_trip_as_format_2_and_old_files_load(profiled):
    _, workload = profiled
    data = json.loads(workload.to_json())
    assert data["format"] == "slackswap.workload/2"
    again = Workload.from_json(workload.to_json())
    assert again.ops == workload.ops and again.fingerprint == workload.fingerprint
    # A workload without shape inputs is written as version 1, as before (its fingerprint unchanged).
    builtin = chain(4, size_bytes=(3, 5, 7, 11))
    assert json.loads(builtin.to_json())["format"] == "slackswap.workload/1"
    old = json.loads(_with_shape_inputs_as_inputs(workload).to_json())
    assert old["format"] == "slackswap.workload/1"
    assert Workload.from_dict(old).ops == _with_shape_inputs_as_inputs(workload).ops
    # the field is version 2's: a version-1 file that has it is refused
    data["format"] = "slackswap.workload/1"
    with pytest.raises(ValidationError, match="unknown field 'shape_inputs'"):
        Workload.from_dict(data)


def test_bad_shape_inputs_are_refused(profiled):
    _, workload = profiled
    i = workload.op_index[_op(workload, "drop/empty_like#0").name]
    for shape_inputs, message in ((("nope",), "shape_inputs names unknown tensor 'nope'"),
                                  (workload.ops[i + 2].outputs, "before any earlier op produces it")):
        ops = list(workload.ops)
        ops[i] = dataclasses.replace(ops[i], shape_inputs=shape_inputs)
        with pytest.raises(ValidationError, match=message):
            dataclasses.replace(workload, ops=tuple(ops))
    ops = list(workload.ops)
    ops[i] = dataclasses.replace(ops[i], inputs=ops[i].shape_inputs)
    with pytest.raises(ValidationError, match="both inputs and shape_inputs"):
        dataclasses.replace(workload, ops=tuple(ops))
