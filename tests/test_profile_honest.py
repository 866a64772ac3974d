"""Honest profiles (issue 14, item 4).

- A profile timed on a CPU, or on another GPU than the hardware it is planned for, is projected
  onto that hardware by the roofline when planned, simulated or explained: the same plan as from a
  profile projected at profiling time. One plan fits the measured and the projected profile
  (the fingerprint leaves times out), so apply finds it through the model.
- profile warns (ProfileNoiseWarning, one line with both step times in ms) when its repeated steps
  disagree by more than max_spread, and not otherwise.
"""

from __future__ import annotations

import dataclasses
import json
import warnings

import pytest

from slackswap import get_hardware
from slackswap.errors import ProfileNoiseWarning, ValidationError
from slackswap.profiler.build import project_onto, timed_for
from slackswap.workload import Workload

torch = pytest.importorskip("torch")

import slackswap  # noqa: E402
from slackswap.examples import loss_fn, make_batch, make_example  # noqa: E402
from slackswap.profiler.profile import warn_if_noisy  # noqa: E402

HW = get_hardware("a100-80gb-pcie4")


@pytest.fixture(scope="module")
def measured():
    model = make_example("gpt2")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileNoiseWarning)  # a busy test machine is not the point here
        return model, slackswap.profile(model, make_batch(seed=0), loss_fn, repeats=1)


def with_device(workload: Workload, device: str, name: str) -> Workload:
    return dataclasses.replace(workload, meta={**workload.meta, "device": device, "device_name": name})


def test_cpu_profile_is_projected_for_a_gpu_and_keeps_its_fingerprint(measured):
    model, workload = measured
    assert workload.meta["device"] == "cpu" and workload.meta["times"].startswith("measured")
    projected = timed_for(workload, HW)
    assert projected.meta["times"].startswith("roofline on a100-80gb-pcie4")
    assert projected.meta["measured_fwd_time_s"] == [op.fwd_time_s for op in workload.ops]
    assert [op.fwd_time_s for op in projected.ops] == [op.fwd_time_s for op in project_onto(workload, HW).ops]
    assert projected.fingerprint == workload.fingerprint
    assert timed_for(projected, HW) is projected  # projected once
    # the plan is the one of the projected profile, and applies to the model through its measured profile
    plan = slackswap.plan(workload, HW, budget=0.5)
    assert plan == slackswap.plan(project_onto(workload, HW), HW, budget=0.5)
    assert slackswap.simulate(workload, HW, plan).step_time_s == slackswap.simulate(projected, HW, plan).step_time_s
    with slackswap.apply(model, plan):
        loss_fn(model, make_batch(seed=0)).backward()


def test_gpu_profile_is_projected_only_for_another_gpu(measured):
    _, workload = measured
    on_a100 = with_device(workload, "cuda", "NVIDIA A100-SXM4-80GB")
    assert timed_for(on_a100, HW) is on_a100
    assert timed_for(on_a100, get_hardware("h100-pcie5")).meta["times"].startswith("roofline on h100-pcie5")
    unnamed = with_device(workload, "cuda", "")
    assert timed_for(unnamed, get_hardware("h100-pcie5")) is unnamed  # nothing to compare: trusted
    from slackswap.workloads.models import build_model_workload

    builtin = build_model_workload("gpt2-xl", HW)  # modeled for its hardware, not measured
    assert timed_for(builtin, get_hardware("h100-pcie5")) is builtin


def test_explain_command_projects_a_cpu_profile(measured, tmp_path, capsys):
    from slackswap.cli import main

    _, workload = measured
    path = tmp_path / "w.json"
    workload.save(path)
    assert main(["explain", "--workload", str(path), "--budget", "0.5", "--json"]) == 0
    from_file = json.loads(capsys.readouterr().out)
    project_onto(workload, HW).save(path)
    assert main(["explain", "--workload", str(path), "--budget", "0.5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == from_file


def test_noise_warning_names_the_spread_and_the_fix():
    with pytest.warns(ProfileNoiseWarning) as caught:
        warn_if_noisy([[0.010], [0.016]], [[0.030], [0.048]], 0.5)  # 40 ms and 64 ms: spread 60 %
    message = str(caught[0].message)
    assert "\n" not in message
    assert "40.000 to 64.000 ms (spread 60 %, more than 50 %)" in message and "profile again" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_noisy([[0.010], [0.014]], [[0.030], [0.042]], 0.5)  # 40 and 56 ms: 40 %
        warn_if_noisy([[0.010]], [[0.030]], 0.5)  # one run: nothing to compare


def test_profile_warns_on_noise_beyond_max_spread():
    model = make_example("gpt2")
    batch = make_batch(seed=0)
    with pytest.warns(ProfileNoiseWarning, match=r"^profile: the 2 repeated steps took"):
        slackswap.profile(model, batch, loss_fn, warmup=0, repeats=2, max_spread=1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ProfileNoiseWarning)
        slackswap.profile(model, batch, loss_fn, warmup=0, repeats=2, max_spread=1e12)
    with pytest.raises(ValidationError, match="max_spread must be a number above 0"):
        slackswap.profile(model, batch, loss_fn, max_spread=0)
