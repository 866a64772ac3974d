"""The state of one planning call in one object: what it plans for, what it has simulated, what it spent.

A planner that searches by simulation (`slackswap`, and the sizing loop the other heuristics
share) makes one ``Search`` per call and hands it to every step: ``selection.fit_need``,
``repair.repair``, ``exact.branch_and_bound`` and the rules in slackswap.py. It holds

- the inputs: workload, hardware, budget and the policy name written into every plan;
- the workload's facts (common.Facts, computed once per workload);
- the memo: a plan already simulated under the same limit is not simulated again (one dict
  per call, so one workload and one link);
- the counters that `slackswap` reports in its plan's info: simulations asked for by the
  targeted steps (sizing is not counted, as before the search object), the wide search's
  allowance and what is left of it, and the exact search's simulations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..hardware import Hardware
from ..plans import Action, Plan
from ..workload import Workload
from .common import Candidate, Facts, build, evaluate, facts_for


@dataclass(eq=False)
class Search:
    workload: Workload
    hardware: Hardware
    budget_bytes: int
    policy: str
    facts: Facts = field(init=False, repr=False)
    memo: dict = field(default_factory=dict, repr=False)
    targeted_simulations: int = 0
    """Simulations of repair proposals and of the exact search's leaves (plan info ``simulations``)."""
    wide_allowance: int = 0
    """Simulations the wide search may spend beyond the targeted ones (0: the wide search is off)."""
    wide_left: int = 0
    """What is left of ``wide_allowance``; repairs and enumerations draw on it."""

    def __post_init__(self) -> None:
        self.facts = facts_for(self.workload)

    def plan(self, actions: Mapping[str, Action], *, prefetch_step: Mapping[str, int] | None = None,
             info: Mapping[str, Any] | None = None) -> Plan:
        """``actions`` completed into a plan for this budget (prefetch as late as the link allows)."""
        return build(self.workload, self.hardware, actions, self.policy, self.budget_bytes,
                     prefetch_step=prefetch_step, info=info)

    def evaluate(self, plan: Plan, *, unlimited: bool = False) -> Candidate:
        """``plan`` simulated under the budget (or with no memory limit), memoized."""
        return evaluate(self.workload, self.hardware, plan, math.inf if unlimited else self.budget_bytes, self.memo)

    def try_actions(self, actions: Mapping[str, Action], *, unlimited: bool = False) -> Candidate:
        return self.evaluate(self.plan(actions), unlimited=unlimited)

    @property
    def simulations(self) -> int:
        """What `slackswap` reports: targeted simulations plus the wide search's spending."""
        return self.targeted_simulations + self.wide_allowance - self.wide_left
