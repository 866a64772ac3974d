"""The state of one planning call in one object: what it plans for, what it has simulated, what it spent.

A planner that searches by simulation (`slackswap`, and the sizing loop the other heuristics
share) makes one ``Search`` per call and hands it to every step: ``selection.fit_need``,
``repair.repair``, ``exact.branch_and_bound`` and the rules in slackswap.py. It holds

- the inputs: workload, hardware, budget and the policy name written into every plan;
- the workload's facts (common.Facts, computed once per workload);
- the memo: a plan already simulated under the same limit is not simulated again (one dict
  per call, so one workload and one link), and a plan whose memory floor (a lower bound on
  its peak whatever the schedule, Facts.peak_floor_bytes) is over the budget is not simulated
  at all: it cannot fit. A caller that keeps a plan only when it runs in at most some time
  (``cutoff_s``: a repair keeps only a plan at least as fast as the current one) gets a plan
  whose step time floor (every compute task's duration, Search.step_floor_s) is over it back
  unsimulated. Evaluations answered either way still count as tried, so the caps of the search
  steps, and so the plans, do not depend on them; plans built from the same actions are built
  once;
- the counters that `slackswap` reports in its plan's info: simulations asked for by the
  targeted steps (sizing is not counted, as before the search object), the wide search's
  allowance and what is left of it, and the exact search's simulations.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..errors import InfeasiblePlanError
from ..hardware import Hardware
from ..plans import Action, Plan
from ..sim.simulator import simulate_unlimited_with_fork
from ..workload import Workload
from .common import Candidate, Facts, build, evaluate, facts_for, memo_key


# Relative slack on the step time floor: the simulator's clock adds task durations one at a time
# and the floor sums them with fsum, so the two can differ in the last bits (a few hundred
# roundings of 1e-16 each); a floor over the cutoff by more than this cannot be float noise.
STEP_FLOOR_MARGIN = 1e-9


_SHARED: list[dict] = []


@contextmanager
def shared_simulations():
    """Within it, the searches of the same workload, link and budget share one memo, so a plan one
    planner simulated is not simulated again by another: `slackswap` runs the other heuristics as
    starts (rule 6), and recompute-optimal sizes the same recompute-only family as its rule 1.
    registry.plan_workload opens one per call, so the memo lives as long as the call."""
    _SHARED.append({})
    try:
        yield
    finally:
        _SHARED.pop()


@dataclass(eq=False)
class Search:
    workload: Workload
    hardware: Hardware
    budget_bytes: int
    policy: str
    facts: Facts = field(init=False, repr=False)
    memo: dict = field(default_factory=dict, repr=False)
    fork: tuple | None = field(default=None, repr=False)
    """(memo key under the budget, resume or None, unlimited candidate) of the last plan simulated
    without a limit (``_unlimited``)."""
    plans: dict = field(default_factory=dict, repr=False)
    """Plans built in this call, by their actions and prefetch steps (``plan``)."""
    targeted_simulations: int = 0
    """Simulations of repair proposals and of the exact search's leaves (plan info ``simulations``)."""
    wide_allowance: int = 0
    """Simulations the wide search may spend beyond the targeted ones (0: the wide search is off)."""
    wide_left: int = 0
    """What is left of ``wide_allowance``; repairs and enumerations draw on it."""
    skipped_simulations: int = 0
    """Evaluations answered without the simulator: the plan's memory floor is over the budget."""
    pruned_simulations: int = 0
    """Evaluations answered without the simulator: the plan's step time floor is over the cutoff."""
    least_peak_bytes: int | None = None
    """The lowest unlimited peak of any plan simulated so far: the smallest budget they reach."""

    def __post_init__(self) -> None:
        self.facts = facts_for(self.workload)
        if _SHARED:  # inside a planning call: one memo for its searches of this workload, link and budget
            key = (id(self.workload), self.hardware, self.budget_bytes)
            held = _SHARED[-1].get(key)
            if held is None or held[0] is not self.workload:
                held = _SHARED[-1][key] = (self.workload, self.memo)
            self.memo = held[1]

    def plan(self, actions: Mapping[str, Action], *, prefetch_step: Mapping[str, int] | None = None,
             info: Mapping[str, Any] | None = None) -> Plan:
        """``actions`` completed into a plan for this budget (prefetch as late as the link allows).
        Without ``info`` the plan is memoized: the same actions and prefetch steps build the same
        plan (make_plan is a pure function of them), and sizing loops and repairs ask again."""
        if info is not None:
            return build(self.workload, self.hardware, actions, self.policy, self.budget_bytes,
                         prefetch_step=prefetch_step, info=info)
        get, keep = actions.get, Action.KEEP
        key = (tuple([get(name, keep) for name in self.facts.saved_names]),
               None if prefetch_step is None else tuple(sorted(prefetch_step.items())))
        plan = self.plans.get(key)
        if plan is None:
            plan = self.plans[key] = build(self.workload, self.hardware, actions, self.policy, self.budget_bytes,
                                           prefetch_step=prefetch_step)
        return plan

    def evaluate(self, plan: Plan, *, unlimited: bool = False, cutoff_s: float | None = None) -> Candidate:
        """``plan`` simulated under the budget (or with no memory limit), memoized. Under the
        budget, a plan whose memory floor (Facts.peak_floor_bytes) is over it is not simulated:
        the simulator would find it infeasible. With ``cutoff_s`` (the caller keeps the plan only
        if it runs in at most that time), a plan whose step time floor (``step_floor_s``) is over
        it is not simulated either and comes back as not fitting."""
        if cutoff_s is not None and self.step_floor_s(plan) > cutoff_s * (1 + STEP_FLOOR_MARGIN):
            self.pruned_simulations += 1
            return Candidate(plan, None)
        if not unlimited and self._over_floor(plan.actions):
            self.skipped_simulations += 1
            return Candidate(plan, None)
        if Action.SWAP not in plan.actions.values():
            # Without copies nothing frees memory while compute waits: the run under the budget is
            # the unlimited run when that peaks within it, and infeasible otherwise. One
            # simulation answers both limits.
            free = self._note_peak(evaluate(self.workload, self.hardware, plan, math.inf, self.memo))
            if unlimited:
                return free
            if free.timeline.peak_memory_bytes > self.budget_bytes:
                return Candidate(plan, None)
            return dataclasses.replace(free, timeline=dataclasses.replace(free.timeline, budget_bytes=self.budget_bytes))
        if unlimited:
            return self._note_peak(self._unlimited(plan))
        key = memo_key(self.budget_bytes, plan)
        if self.fork is not None and self.fork[0] == key and key not in self.memo:
            found = self.memo[key] = self._resume(plan)
            return found
        return evaluate(self.workload, self.hardware, plan, self.budget_bytes, self.memo)

    def _unlimited(self, plan: Plan) -> Candidate:
        """``plan`` (with copies) simulated with no memory limit, memoized; the state where its run
        under the budget departs from this one is kept in ``fork`` for the next evaluation under the
        budget (a sizing loop asks for it next when the plan's unlimited peak is over the budget)."""
        key = memo_key(math.inf, plan)
        if key in self.memo:
            return dataclasses.replace(self.memo[key], plan=plan)
        records: list = []
        try:
            timeline, resume = simulate_unlimited_with_fork(self.workload, self.hardware, plan, self.budget_bytes,
                                                            event_records=records, memory_records=[])
        except InfeasiblePlanError:
            found = self.memo[key] = Candidate(plan, None)
            return found
        found = self.memo[key] = Candidate(plan, timeline, tuple(records))
        self.fork = (memo_key(self.budget_bytes, plan), resume, found)
        return found

    def _resume(self, plan: Plan) -> Candidate:
        """The run under the budget of the plan ``fork`` was kept for."""
        _, resume, free = self.fork
        self.fork = None
        if resume is None:  # the budget never bound: the run under it is the unlimited run
            return dataclasses.replace(free, plan=plan, timeline=dataclasses.replace(
                free.timeline, budget_bytes=self.budget_bytes))
        records: list = []
        try:
            return Candidate(plan, resume(records, []), tuple(records))  # samples dropped: common.evaluate
        except InfeasiblePlanError:
            return Candidate(plan, None)

    def step_floor_s(self, plan: Plan) -> float:
        """A lower bound on ``plan``'s simulated step time, whatever waits: the compute stream runs
        every forward, recompute and backward task one after another, so the step takes at least
        their durations (the ideal step plus the forward time of every recompute group's ops)."""
        ops, index = self.workload.ops, self.workload.op_index
        return self.workload.ideal_step_time_s + math.fsum(
            ops[index[name]].fwd_time_s for group in plan.recompute_groups.values() for name in group)

    def _note_peak(self, free: Candidate) -> Candidate:
        peak = free.timeline.peak_memory_bytes
        if self.least_peak_bytes is None or peak < self.least_peak_bytes:
            self.least_peak_bytes = peak
        return free

    def try_actions(self, actions: Mapping[str, Action], *, unlimited: bool = False,
                    cutoff_s: float | None = None) -> Candidate:
        """``actions`` (unnamed tensors kept) as a plan, evaluated (``cutoff_s`` as in ``evaluate``);
        under the budget, when their memory floor is over it, neither planned nor simulated (the
        candidate's plan is None)."""
        if not unlimited and self._over_floor(actions):
            self.skipped_simulations += 1
            return Candidate(None, None)
        return self.evaluate(self.plan(actions), unlimited=unlimited, cutoff_s=cutoff_s)

    def _over_floor(self, actions: Mapping[str, Action]) -> bool:
        get, keep = actions.get, Action.KEEP
        kept = [n for n in self.facts.candidates if get(n, keep) is keep]
        return self.facts.peak_floor_bytes(kept) > self.budget_bytes

    @property
    def simulations(self) -> int:
        """What `slackswap` reports: targeted simulations plus the wide search's spending."""
        return self.targeted_simulations + self.wide_allowance - self.wide_left


def recompute_step_floor(search: Search, swapped_bytes: int, rest: Sequence[str], *,
                         shared_by: Iterable[str] | None = None) -> Callable[[int], float]:
    """For a plan family that takes ``swapped_bytes`` off by swaps and then recomputes a set of
    ``rest``'s tensors of at least the bytes still needed (or all of them): ``floor(need)``, a lower
    bound on the step time of the family's plan for every need from ``need`` on (selection.fit_need).

    Such a plan re-runs every op that rebuilds one of its recomputed tensors (Facts.rebuild_ops)
    at least once, on the compute stream beside the ideal step (Search.step_floor_s). Each op's
    forward time is shared out among the producers in ``rest`` (or in ``shared_by``, a superset:
    then the bound holds for a recomputed set anywhere in it, with what is not in ``rest`` free)
    that need it, so a set's shares never sum to more than its ops' time; the least sum of shares
    for a given number of bytes is at least the fractional knapsack's (cheapest share per byte
    first, the last producer in part), which grows with the need."""
    facts, workload = search.facts, search.workload
    by_name = workload.tensor_by_name
    users: dict[int, int] = {}
    for name in {by_name[n].producer: n for n in (rest if shared_by is None else shared_by)}.values():
        for op in facts.rebuild_ops[name]:
            users[op] = users.get(op, 0) + 1
    items: dict[str, list] = {}  # producer -> [bytes, tensor]
    for name in rest:
        item = items.setdefault(by_name[name].producer, [0, name])
        item[0] += facts.size[name]
    ops = workload.ops
    priced = sorted((math.fsum(ops[op].fwd_time_s / users[op] for op in facts.rebuild_ops[name]) / size, size)
                    for size, name in items.values())
    upto_bytes = list(itertools.accumulate(size for _, size in priced))
    upto_s = list(itertools.accumulate(per_byte * size for per_byte, size in priced))
    ideal_s = workload.ideal_step_time_s

    def floor(need: int) -> float:
        left = need - swapped_bytes
        if left <= 0 or not priced:
            return ideal_s
        whole = bisect.bisect_left(upto_bytes, left)  # producers taken whole before the one in part
        if whole == len(priced):
            return ideal_s + upto_s[-1]
        before_bytes = upto_bytes[whole - 1] if whole else 0
        before_s = upto_s[whole - 1] if whole else 0.0
        return ideal_s + before_s + priced[whole][0] * (left - before_bytes)
    return floor
