"""Both runtime backends leave the same way after an exception: step abandoned, recorder parked."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

import slackswap  # noqa: E402
from slackswap import get_hardware, make_plan  # noqa: E402
from slackswap.examples import loss_fn  # noqa: E402
from runtime_helpers import profile_cache  # noqa: E402

HW = get_hardware("a100-80gb-pcie4")


class _Bug(Exception):
    pass


@pytest.fixture(scope="module")
def profiled():
    return profile_cache(1, HW)


@pytest.mark.parametrize("backend", ["replay", "checkpoint"])
def test_an_exception_mid_forward_parks_the_recorder(profiled, backend):
    base, batches, workload = profiled("gpt2")
    plan = make_plan(workload, {}, policy="keep", budget_bytes=None)
    model = copy.deepcopy(base)
    options = {"hardware": HW} if backend == "checkpoint" else {}
    runtime = slackswap.apply(model, plan, backend=backend, workload=workload, **options)
    blocks = [m for name, m in model.named_modules() if name.count(".") == 1 and name.split(".")[1].isdigit()]

    def fail(module, args, output):
        raise _Bug

    handle = blocks[0].register_forward_hook(fail)
    try:
        with pytest.raises(_Bug):
            with runtime:
                loss_fn(model, batches[0])
    finally:
        handle.remove()
    assert runtime.recorder.i == runtime.recorder.n  # records nothing until the next step starts
    assert runtime.stats.device_saved_bytes == 0
    with runtime:
        loss_fn(model, batches[0]).backward()
    assert runtime.stats.late_prefetches == 0 and runtime.stats.device_saved_bytes == 0
