"""The window check's lower-bound answer (copies.WindowBooking._clearly_late_before): without a
deadline for the copy out, a check that finds a copy back at the start of backward clearly late
under lower bounds answers no without walking the whole copy-out stream. Its answers must be
round_trip_fits's; checked on the spill pass of rule 5 (slackswap.windowed_swaps) on gpt2-xl with
12 layers, where the copy outs run into backward and the bound fires."""

from __future__ import annotations

from slackswap.hardware import PRESETS
from slackswap.planners import slackswap as policy
from slackswap.planners.common import facts_for
from slackswap.planners.copies import WindowBooking, round_trip_fits
from slackswap.workloads.models import build_model_workload


def test_lower_bound_answers_are_round_trip_fits_and_fire(monkeypatch):
    hw = PRESETS["a100-80gb-pcie4"]
    facts = facts_for(build_model_workload("gpt2-xl", hw, layers=12))
    fired = []
    bound = WindowBooking._clearly_late_before

    def counted(self, *args):
        fired.append(bound(self, *args))
        return fired[-1]

    monkeypatch.setattr(WindowBooking, "_clearly_late_before", counted)
    ranked = policy.swap_orders(facts)["value"]
    booked = policy.windowed_swaps(facts, hw, ranked)
    booking = WindowBooking(facts, hw, booked)
    for name in ranked:  # the spill pass, each answer checked against the full walk
        if name in booked:
            continue
        fits = booking.fits(name, out_deadline_s=None)
        assert fits == round_trip_fits(facts, hw, booked + [name], out_deadline_s=None), name
        if fits:
            booking.add(name)
            booked.append(name)
    assert any(fired) and not all(fired)
