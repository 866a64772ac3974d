"""Timeline JSON: a simulated timeline survives the round trip bit for bit; bad files name the field."""

from __future__ import annotations

import copy
import json
import math

import pytest

from slackswap.errors import ValidationError
from slackswap.hardware import PRESETS
from slackswap.plans import Action
from slackswap.schedule import make_plan
from slackswap.sim import simulate
from slackswap.timeline import Timeline
from slackswap.workloads.synthetic import chain


def simulated(budget=None) -> Timeline:
    w = chain(5, fwd_time_s=(0.1, 0.3, 1e-7, 2.5, 0.7), size_bytes=10**7)
    hardware = PRESETS["a100-40gb-pcie4"]
    plan = make_plan(w, {"a0": Action.SWAP, "a1": Action.RECOMPUTE, "a3": Action.SWAP}, policy="hand",
                     budget_bytes=budget, hardware=hardware)
    return simulate(w, hardware, plan)


@pytest.mark.parametrize("budget", [None, 4 * 10**7])
def test_round_trip_is_exact(budget, tmp_path):
    timeline = simulated(budget)
    assert any(e.kind == "copy_in" for e in timeline.events) and timeline.recompute_time_s > 0
    again = Timeline.from_dict(json.loads(json.dumps(timeline.to_dict())))
    assert again == timeline
    path = tmp_path / "timeline.json"
    timeline.save(path)
    assert Timeline.load(path) == timeline
    assert again.summary() == timeline.summary()


BAD = [
    (lambda d: d["events"][0].__setitem__(0, "gpu"), "timeline.events[0].stream is 'gpu'"),
    (lambda d: d["events"][0].__setitem__(1, "sleep"), "timeline.events[0].kind is 'sleep'"),
    (lambda d: d["events"][1].__setitem__(3, "soon"), "timeline.events[1].start_s must be a number"),
    (lambda d: d["events"][1].__setitem__(4, math.nan), "timeline.events[1].end_s must be finite"),
    (lambda d: d["events"][1].__setitem__(3, 1e9), "timeline.events[1] ends at"),  # start after end
    (lambda d: d["events"][1].__setitem__(5, -1), "timeline.events[1].size_bytes must be at least 0"),
    (lambda d: d["events"][1].__setitem__(6, 1.5), "timeline.events[1].step must be an integer"),
    (lambda d: d["events"][1].pop(), "timeline.events[1] must be [stream, kind"),
    (lambda d: d["memory"][1].__setitem__(1, "many"), "timeline.memory[1].bytes must be an integer"),
    (lambda d: d["memory"].__setitem__(1, {"t": 0}), "timeline.memory[1] must be [time_s, bytes]"),
    (lambda d: d.update(step_time_s=-1.0), "timeline.step_time_s must be zero or positive"),
    (lambda d: d.update(stall_copy_s="0"), "timeline.stall_copy_s must be a number"),
    (lambda d: d.update(peak_memory_bytes=2.5), "timeline.peak_memory_bytes must be an integer"),
    (lambda d: d.update(budget_bytes=0), "timeline.budget_bytes must be at least 1"),
    (lambda d: d.update(events={}), "timeline.events must be a list"),
    (lambda d: d.update(gpu="a100"), "timeline has unknown field 'gpu'"),
    (lambda d: d.pop("hardware"), "timeline.hardware is missing"),
    (lambda d: d.update(format="slackswap.timeline/2"), "timeline.format is 'slackswap.timeline/2'"),
]


@pytest.mark.parametrize("mutate, message", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_timeline_names_the_field(mutate, message):
    data = copy.deepcopy(simulated().to_dict())
    mutate(data)
    with pytest.raises(ValidationError) as info:
        Timeline.from_dict(data)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_malformed_timeline_file(tmp_path):
    path = tmp_path / "t.json"
    path.write_text("{not json")
    with pytest.raises(ValidationError, match=r"timeline file .* is not valid JSON"):
        Timeline.load(path)
