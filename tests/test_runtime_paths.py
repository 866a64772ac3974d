"""slackswap.apply's default backend="auto" takes a fast path where the plan allows one and runs
exactly the plan's actions on each path.

keep: an all-keep plan installs no dispatch mode and no saved-tensor hooks. checkpoint: a plan
whose recompute groups coincide with module calls (full recompute per block) runs through
torch.utils.checkpoint alone. Anything else falls back to the replay path. Every path is
compared bit for bit (torch.equal: the tiny float32 CPU models are deterministic) with the
plain step and with the replay path.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")


import slackswap  # noqa: E402
from slackswap import Action, get_hardware, make_plan  # noqa: E402
from slackswap.errors import PlanMismatchError  # noqa: E402
from slackswap.examples import EXAMPLES, ExampleConfig, loss_fn, make_batch  # noqa: E402
from slackswap.runtime import choose_path, runtime_prefetch_steps  # noqa: E402
from slackswap.sim import simulate  # noqa: E402
from runtime_helpers import profile_cache, step_flops, train  # noqa: E402

HW = get_hardware("a100-80gb-pcie4")
STEPS = 2


@pytest.fixture(scope="module")
def profiled():
    return profile_cache(STEPS, HW)


def all_keep(workload):
    return make_plan(workload, {}, policy="all-keep", budget_bytes=None, prefetch_step={})


def all_swap(workload):
    actions = {t.name: Action.SWAP for t in workload.saved_tensors if t.producer is not None}
    return make_plan(workload, actions, policy="all-swap", budget_bytes=None,
                     prefetch_step=runtime_prefetch_steps(workload, actions))


def full_recompute(workload):
    return slackswap.plan(workload, HW, 1.0, "full-recompute")


def keep_one_in_first_block(workload):
    """The full-recompute plan with one tensor of the first block's MLP kept: that block needs a
    selective-checkpoint policy, the others are checkpointed whole."""
    plan = full_recompute(workload)
    calls = workload.meta["op_calls"]
    inside = [n for n, a in plan.actions.items() if a is Action.RECOMPUTE
              and calls[workload.op_index[workload.tensor_by_name[n].producer]].split(".")[:3] in
              (["h", "0", "mlp"], ["layers", "0", "mlp"])]
    actions = dict(plan.actions)
    actions[inside[0]] = Action.KEEP
    return make_plan(workload, actions, policy="keep-one", budget_bytes=None, prefetch_step=dict(plan.prefetch_step),
                     recompute_regions=plan.recompute_regions)


def hooks_seen(model):
    """Forward hook on the model's first submodule: records the dispatch mode and saved-tensor hooks
    active while it runs (outside every checkpointed call)."""
    seen = []
    first = next(model.children())

    def hook(module, args, output):
        from torch.utils._python_dispatch import _get_current_dispatch_mode

        seen.append((_get_current_dispatch_mode(), torch._C._autograd._top_saved_tensors_default_hooks(False)))

    return seen, first.register_forward_hook(hook)


def run(base, batches, plan, workload, backend="auto"):
    model = copy.deepcopy(base)
    runtime = slackswap.apply(model, plan, workload=workload, backend=backend)
    seen, handle = hooks_seen(model)
    losses, grads = train(model, batches, runtime)
    handle.remove()
    return runtime, [*losses, *grads.values()], seen


def assert_equal(a, b):
    assert len(a) == len(b)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("kind", sorted(EXAMPLES))
def test_all_keep_plan_takes_the_keep_path_with_nothing_installed(profiled, kind):
    base, batches, workload = profiled(kind)
    plan = all_keep(workload)
    plain = train(copy.deepcopy(base), batches)
    runtime, out, seen = run(base, batches, plan, workload)
    assert runtime.path == "keep"
    assert_equal([*plain[0], *plain[1].values()], out)
    assert seen == [(None, None)] * STEPS  # no dispatch mode, no saved-tensor hooks during the step
    assert runtime.stats.steps == STEPS and runtime.stats.recorded_ops == 0 and runtime.stats.packs == 0
    replay, replayed, seen = run(base, batches, plan, workload, backend="replay")
    assert replay.path == "replay"
    assert_equal(out, replayed)
    assert replay.stats.recorded_ops >= STEPS * len(workload.ops) - STEPS  # the counter counts
    assert all(mode is not None and hooks is not None for mode, hooks in seen)


@pytest.mark.parametrize("kind", sorted(EXAMPLES))
def test_full_recompute_per_block_takes_the_checkpoint_path(profiled, kind):
    base, batches, workload = profiled(kind)
    plan = full_recompute(workload)
    runtime, out, seen = run(base, batches, plan, workload)
    assert runtime.path == "checkpoint", runtime.path_reason
    plain = train(copy.deepcopy(base), batches)
    assert_equal([*plain[0], *plain[1].values()], out)
    replay, replayed, _ = run(base, batches, plan, workload, backend="replay")
    assert replay.path == "replay"
    assert_equal(out, replayed)

    regions = runtime.checkpoint_map.regions
    blocks = ExampleConfig().layers
    assert len(regions) == blocks and all(all(r.recompute) for r in regions)  # whole blocks, no SAC policy
    assert seen == [(None, None)] * STEPS  # nothing installed outside the checkpointed calls
    s = runtime.stats
    assert s.recorded_ops == 0 and s.packs == 0
    assert s.checkpointed_calls == s.region_recomputes == STEPS * blocks
    assert s.step_recompute_ops == sum(len(g) for g in plan.recompute_groups.values())
    # It re-runs exactly the plan's recompute FLOPs, and the simulator is given the plan as it runs.
    predicted = sum(workload.ops[workload.op_index[g]].flops for grp in plan.recompute_groups.values() for g in grp)
    model = runtime.model
    assert step_flops(model, batches[0], runtime, seed=5) - step_flops(model, batches[0], seed=5) == predicted
    sim = runtime.simulated_plan
    assert sim.actions == plan.actions
    assert sum(workload.ops[workload.op_index[g]].flops for grp in sim.recompute_groups.values() for g in grp) \
        == predicted
    # Its groups are the regions' re-runs at their first unpack, not derived ones: simulated unchecked.
    peak = simulate(workload, HW, sim, check=False).peak_memory_bytes
    assert peak <= runtime.checkpoint_map.predicted_peak_bytes <= plan.budget_bytes


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_a_block_that_keeps_some_tensors_runs_with_a_selective_checkpoint_policy(profiled, kind):
    base, batches, workload = profiled(kind)
    plan = keep_one_in_first_block(workload)
    runtime, out, _ = run(base, batches, plan, workload)
    assert runtime.path == "checkpoint", runtime.path_reason
    assert [all(r.recompute) for r in runtime.checkpoint_map.regions][:2] == [False, True]
    plain = train(copy.deepcopy(base), batches)
    assert_equal([*plain[0], *plain[1].values()], out)
    _, replayed, _ = run(base, batches, plan, workload, backend="replay")
    assert_equal(out, replayed)
    predicted = sum(workload.ops[workload.op_index[g]].flops for grp in plan.recompute_groups.values() for g in grp)
    model = runtime.model
    assert step_flops(model, batches[0], runtime, seed=5) - step_flops(model, batches[0], seed=5) == predicted


@pytest.mark.parametrize("plan_kind", ["all-swap", "mixed"])
def test_a_plan_no_fast_path_runs_exactly_falls_back_to_replay(profiled, plan_kind):
    base, batches, workload = profiled("gpt2")
    plan = all_swap(workload) if plan_kind == "all-swap" else slackswap.plan(workload, HW, 0.5, "slackswap")
    choice = choose_path(workload, plan, HW)
    assert choice.path == "replay" and choice.reason
    runtime, out, _ = run(base, batches, plan, workload)
    assert runtime.path == "replay" and runtime.path_reason == choice.reason
    assert runtime.stats.recorded_ops > 0
    plain = train(copy.deepcopy(base), batches)
    assert_equal([*plain[0], *plain[1].values()], out)


def test_choose_path_refuses_checkpoint_when_it_would_run_other_ops(profiled):
    """What the `slackswap` policy recomputes on the GPT-2-like example at 50 % (its swaps kept): a
    checkpointed block would re-run dropout ops the plan keeps, so the checkpoint path is not taken."""
    _, _, workload = profiled("gpt2")
    mixed = slackswap.plan(workload, HW, 0.5, "slackswap")
    actions = {n: a for n, a in mixed.actions.items() if a is Action.RECOMPUTE}
    plan = make_plan(workload, actions, policy="recompute-only", budget_bytes=None,
                     prefetch_step=runtime_prefetch_steps(workload, actions))
    choice = choose_path(workload, plan, HW)
    assert choice.path == "replay"
    assert choice.checkpoint_map is not None and not choice.checkpoint_map.faithful
    assert "would re-run" in choice.reason


@pytest.mark.parametrize("plan_of", [all_keep, full_recompute], ids=["keep", "checkpoint"])
def test_fast_paths_refuse_a_changed_batch_before_any_gradient(profiled, plan_of):
    base, _, workload = profiled("gpt2")
    model = copy.deepcopy(base)
    runtime = slackswap.apply(model, plan_of(workload), workload=workload)
    assert runtime.path in ("keep", "checkpoint")
    with pytest.raises(PlanMismatchError, match="changed since profiling"):
        with runtime:
            loss_fn(model, make_batch(ExampleConfig(micro_batch=3)))
    assert all(p.grad is None for p in model.parameters())


def test_fast_path_refuses_nesting_and_reentry(profiled):
    base, batches, workload = profiled("gpt2")
    model = copy.deepcopy(base)
    runtime = slackswap.apply(model, all_keep(workload), workload=workload)
    other = slackswap.apply(model, full_recompute(workload), workload=workload)
    with runtime:
        with pytest.raises(RuntimeError, match="already active"):
            runtime.__enter__()
        with pytest.raises(slackswap.errors.RuntimeUsageError, match="nested"):
            other.__enter__()
    with other:  # usable again after leaving, and the module wrappers are gone after
        loss_fn(model, batches[0]).backward()
    assert "forward" not in model.h[0].__dict__


@pytest.mark.slow
def test_runtime_overhead_benchmark_quick_run_writes_its_table(tmp_path, monkeypatch):
    """benchmarks/runtime_overhead.py --quick: every row runs, matches the plain step and takes the
    path the docs say (the numbers of so short a run mean nothing)."""
    import importlib.util
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "runtime_overhead.py"
    spec = importlib.util.spec_from_file_location("runtime_overhead", script)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, bench)  # its dataclasses look their module up there
    spec.loader.exec_module(bench)
    out = tmp_path / "table.md"
    assert bench.main(["--quick", "--kinds", "llama", "--results", str(out)]) == 0
    rows = [line.split(" | ") for line in out.read_text().splitlines() if line.startswith("| llama")]
    path = {r[2]: r[3] for r in rows}
    assert path["slackswap.apply all-keep"] == "keep"
    assert path["slackswap.apply full-recompute policy"] == "checkpoint"
    assert path['slackswap.apply full-recompute policy (backend="replay")'] == "replay"
    assert path["slackswap.apply all-swap"] == "replay"
    assert len(rows) == 9 and all(r[-1].strip(" |") in ("yes", "-") for r in rows)
    assert "Load average" in out.read_text()


class _Memo:
    """A cache object a block fills on its first call and reads afterwards (as Hugging Face T5's
    EncoderDecoderCache does for cross-attention keys): a re-run of the call takes the other branch."""

    def __init__(self):
        self.filled = set()


class _MemoBlock(torch.nn.Module):
    def __init__(self, i):
        super().__init__()
        self.i, self.a, self.b = i, torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x, memo=None):
        if memo is not None and self.i in memo.filled:
            return torch.tanh(self.b(x))
        if memo is not None:
            memo.filled.add(self.i)
        return torch.tanh(self.b(torch.relu(self.a(x))))


class _MemoModel(torch.nn.Module):
    def __init__(self, use_memo=True):
        super().__init__()
        self.use_memo = use_memo
        self.blocks = torch.nn.ModuleList(_MemoBlock(i) for i in range(4))

    def forward(self, x):
        memo = _Memo() if self.use_memo else None
        for block in self.blocks:
            x = block(x, memo=memo)
        return x


def unbudgeted_recompute(workload):
    """The full-recompute plan's actions without a budget (the tiny blocks' rebuild would exceed it)."""
    plan = full_recompute(workload)
    return make_plan(workload, plan.actions, policy="full-recompute", budget_bytes=None, prefetch_step={},
                     recompute_regions=plan.recompute_regions)


def test_a_call_that_takes_a_cache_object_is_not_checkpointed():
    """Regression (HF T5 under selective-recompute): checkpoint re-runs a call's Python, so a call
    given an object it changes re-runs other ops (CheckpointError: a different number of tensors
    saved). The profile notes such calls and the auto backend takes the replay path for them."""
    torch.manual_seed(0)
    batch = torch.randn(64, 8)

    def loss(m, x):
        return m(x).square().sum()

    # Without the cache object the same plan takes the checkpoint path.
    plain_model = _MemoModel(use_memo=False)
    plain_workload = slackswap.profile(plain_model, batch, loss, repeats=1)
    assert "stateful_call_args" not in plain_workload.meta
    assert choose_path(plain_workload, unbudgeted_recompute(plain_workload), HW).path == "checkpoint"

    model = _MemoModel()
    workload = slackswap.profile(model, batch, loss, repeats=1)
    assert workload.meta["stateful_call_args"] == {f"blocks.{i}": ["_Memo"] for i in range(4)}
    plan = unbudgeted_recompute(workload)
    assert plan.recompute_groups
    assert choose_path(workload, plan, HW).path == "replay"
    runtime = slackswap.apply(model, plan, workload=workload)
    assert runtime.path == "replay" and "_Memo" in runtime.path_reason

    def grads(rt=None):
        model.zero_grad()
        if rt is None:
            loss(model, batch).backward()
        else:
            with rt:
                loss(model, batch).backward()
        return [p.grad.clone() for p in model.parameters()]

    assert_equal(grads(), grads(runtime))
