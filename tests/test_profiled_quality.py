"""`slackswap` on profiled models nobody tuned it for (issue 17, item 3): never below another
heuristic policy, never refusing a budget one of them meets, and within 1 point of `optimal`'s MILP
plan where the MILP solves, at 20-90 % of the peak.

The workloads in tests/profiled/ were profiled once on CPU with
``slackswap.profile(model, batch, loss_fn, hardware="a100-80gb-pcie4")`` (times projected by the
roofline); tests/profiled/make_fixtures.py makes them again:

- example-gpt2, example-bert, example-llama: ``slackswap.examples.make_example(kind)`` (TINY
  config), its make_batch and loss_fn;
- hf-llama: transformers' LlamaForCausalLM(LlamaConfig(hidden_size=64, num_hidden_layers=2,
  num_attention_heads=4, num_key_value_heads=4, intermediate_size=128, vocab_size=128,
  max_position_embeddings=32)), input_ids of shape (2, 32) as their own labels, train mode;
- hf-gpt2: GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128,
  n_positions=32)), the same batch; hf-bert: BertForMaskedLM of the same sizes, the same batch;
- hf-vit: ViTForImageClassification(image_size=32, patch_size=4, hidden_size=64, 2 layers,
  4 heads, intermediate_size=128, 10 labels), two random images.

At 40 % of the peak neither `slackswap`'s link-free floor nor any of its swap families fitted on
example-gpt2 and hf-llama, and it started from everything swapped: 2.67 % of ideal on
example-gpt2 where `capuchin` reaches 83.96 %. Rule 6 now also starts from the other heuristics'
plans on workloads this small, and `recompute-optimal` searches the recompute space by its groups'
real peaks (recompute_space.frontier_descent), which found plans at 30-40 % that every other
policy refused or ran at a few % of ideal (hf-gpt2 at 40 %: 46.15 % before, 86.70 % now).

The whole grid (7 workloads x 8 budgets, every heuristic and the MILP planned in each cell) is
`slow`; the default run checks one budget per workload, a different one for each.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slackswap.errors import BudgetError
from slackswap.hardware import PRESETS
from slackswap.planners import HEURISTICS, plan_workload
from slackswap.sim import simulate, simulate_ideal
from slackswap.workload import Workload

pytest.importorskip("scipy")  # `optimal` is in the 'milp' extra; the test extra installs it

HW = PRESETS["a100-80gb-pcie4"]
PROFILED = Path(__file__).parent / "profiled"
NAMES = sorted(p.stem for p in PROFILED.glob("*.json"))
FRACTIONS = tuple(k / 10 for k in range(2, 10))
FLOAT_NOISE_PTS = 1e-9
OPTIMAL_GAP_PTS = 1.0
DEFAULT_CELLS = [(name, FRACTIONS[(3 * i + 2) % len(FRACTIONS)]) for i, name in enumerate(NAMES)]
"""One budget per workload in the default run, spread over the grid (0.4, 0.7, 0.2, ...)."""


def throughput(workload: Workload, budget: int, policy: str) -> float | None:
    try:
        plan = plan_workload(workload, HW, budget, policy)
    except BudgetError:
        return None
    timeline = simulate(workload, HW, plan, budget)
    assert timeline.peak_memory_bytes <= budget
    return timeline.throughput_pct


def check_cell(name: str, fraction: float) -> float | None:
    """Checks one cell; returns slackswap's throughput there (None: it refuses, as every other does)."""
    workload = Workload.load(PROFILED / f"{name}.json")
    budget = int(fraction * simulate_ideal(workload, HW).peak_memory_bytes)
    ours = throughput(workload, budget, "slackswap")
    theirs = {policy: throughput(workload, budget, policy) for policy in HEURISTICS}
    met = {p: t for p, t in theirs.items() if t is not None}
    assert ours is not None or not met, f"{name} at {fraction}: slackswap refuses, {met} fit"
    below = {p: t for p, t in met.items() if ours < t - FLOAT_NOISE_PTS}
    assert not below, f"{name} at {fraction}: slackswap {ours:.2f} % is below {below}"
    best = milp_throughput(workload, budget)
    if best is not None:
        assert ours is not None and ours >= best - OPTIMAL_GAP_PTS, (
            f"{name} at {fraction}: slackswap {ours} % is more than {OPTIMAL_GAP_PTS} point below optimal {best:.2f} %")
    return ours


def milp_throughput(workload: Workload, budget: int) -> float | None:
    """The throughput of the MILP's own plan (the fastest of its rounds that fits; None where it has
    none). Not `optimal`'s returned plan: that is `slackswap`'s where it simulates faster, so
    comparing against it could not fail."""
    try:
        plan = plan_workload(workload, HW, budget, "optimal")
    except BudgetError:
        return None
    fitting = [r["simulated_step_time_s"] for r in plan.info["milp_rounds"] if r["simulated_step_time_s"] is not None]
    assert simulate(workload, HW, plan, budget).peak_memory_bytes <= budget
    return 100.0 * workload.ideal_step_time_s / min(fitting) if fitting else None


@pytest.mark.parametrize("name, fraction", DEFAULT_CELLS)
def test_slackswap_against_every_heuristic_and_the_milp(name, fraction):
    check_cell(name, fraction)


@pytest.mark.slow  # 7 workloads x 8 budgets; every heuristic and the MILP planned in each cell
@pytest.mark.parametrize("name", NAMES)
def test_slackswap_against_every_heuristic_and_the_milp_on_the_whole_grid(name):
    ours = [check_cell(name, fraction) for fraction in FRACTIONS]
    # And more budget never made it slower on this grid (issue 17, item 5, on profiled models).
    pairs = list(zip(FRACTIONS, ours))
    for (low, low_pct), (high, high_pct) in zip(pairs, pairs[1:]):
        if low_pct is not None:
            assert high_pct is not None and high_pct >= low_pct - FLOAT_NOISE_PTS, (name, low, high, low_pct, high_pct)
