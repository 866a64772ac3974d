"""FSDP2 (torch.distributed.fsdp.fully_shard) under the profiler and the runtime (issue 14, item 1).

- The profile of a sharded model has the same ops and saved tensors as the unsharded model's:
  FSDP's all-gathers and copies are not model ops, and the gathered parameters are parameters.
- Two gloo ranks on CPU, each with its own batches: three SGD-momentum steps under an all-swap,
  an all-recompute and a mixed plan give losses, gradient shards and parameter shards
  bit-identical to FSDP2 training without slackswap, on both ranks; the all-recompute plan
  re-runs layers whose parameters FSDP freed after forward, so the runtime gathers them again.
- Ranks that apply different plans are refused on every rank; a 2-D mesh and the checkpoint
  backend are refused with one line naming the fix.
- One rank under FSDP2's options (bf16 MixedPrecisionPolicy, CPUOffloadPolicy, a unit of a module
  list) trains bit for bit under a mixed plan (slow).
- slackswap.auto with two ranks and two lengths alternating: one profile per length per rank, the
  same plans on both ranks, bit-identical training; ranks on different lengths are refused (slow).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():  # pragma: no cover - torch built without distributed
    pytest.skip("torch.distributed is not available", allow_module_level=True)

import slackswap  # noqa: E402
from slackswap import Action, make_plan  # noqa: E402
from slackswap.errors import PlanMismatchError, UnsupportedModelError  # noqa: E402
from slackswap.examples import loss_fn, make_batch, make_example  # noqa: E402
from slackswap.profiler import profile_model  # noqa: E402
from slackswap.runtime import runtime_prefetch_steps  # noqa: E402
from runtime_helpers import train as train_steps  # noqa: E402

HOWS = ("swap", "recompute", "mixed")


def plan_for(workload, how: str):
    """Every activation swapped, recomputed, or (mixed) swap / recompute / keep in turn."""
    candidates = [t.name for t in workload.saved_tensors if t.producer is not None]
    cycle = (Action.SWAP, Action.RECOMPUTE, Action.KEEP)
    actions = {name: cycle[i % 3] if how == "mixed" else Action(how) for i, name in enumerate(candidates)}
    return make_plan(workload, actions, policy=how, budget_bytes=None,
                     prefetch_step=runtime_prefetch_steps(workload, actions))


def sharded_gpt2():
    """The example GPT-2 with each block a fully_shard unit and the root a unit (FSDP2's usual layout)."""
    from torch.distributed.fsdp import fully_shard

    model = make_example("gpt2")
    for block in model.h:
        fully_shard(block)
    return fully_shard(model)


def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def train(model, batches, runtime=None):
    """Three SGD-momentum steps: each step's loss, then the last gradients and parameters (this rank's shards)."""
    losses, grads = train_steps(model, batches, runtime)
    return losses, [local(g) for g in grads.values()], [local(p.detach()).clone() for p in model.parameters()]


def same(a, b) -> bool:
    return all(len(x) == len(y) and all(torch.equal(u, v) for u, v in zip(x, y)) for x, y in zip(a, b))


def test_profile_of_a_sharded_model_has_the_unsharded_models_activations(process_group):
    batch = make_batch(seed=0)
    plain = profile_model(make_example("gpt2"), batch, loss_fn, repeats=1)
    sharded = profile_model(sharded_gpt2(), batch, loss_fn, repeats=1)
    assert [op.name for op in sharded.ops] == [op.name for op in plain.ops]
    # every tensor, step inputs included: no gathered parameter is taken for an activation or an input
    assert [(t.name, t.size_bytes, t.bwd_readers) for t in sharded.tensors] == \
        [(t.name, t.size_bytes, t.bwd_readers) for t in plain.tensors]
    assert not any("fsdp" in op.name or "c10d" in op.name or "record_function" in op.name for op in sharded.ops)


def test_one_rank_trains_bit_for_bit_under_a_mixed_plan(process_group):
    batches = [make_batch(seed=s) for s in range(3)]
    reference = train(sharded_gpt2(), batches)
    model = sharded_gpt2()
    workload = profile_model(model, batches[0], loss_fn, repeats=1)  # the model object's profile
    runtime = slackswap.apply(model, plan_for(workload, "mixed"))
    assert same(train(model, batches, runtime), reference)
    stats = runtime.stats
    assert stats.d2h_bytes > 0 and stats.recompute_ops > 0 and stats.fsdp_regathers > 0, stats


def sharded_gpt2_with(option: str):
    """The example GPT-2 sharded with one of FSDP2's options: bf16 parameters for compute
    (MixedPrecisionPolicy), sharded parameters held on the host (CPUOffloadPolicy), or each block's
    attention and MLP as one unit (fully_shard of a list of modules)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    model = make_example("gpt2")
    kwargs = {"mixed-precision": {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                                    reduce_dtype=torch.float32)},
              "cpu-offload": {"offload_policy": CPUOffloadPolicy(pin_memory=False)}}.get(option, {})
    for block in model.h:
        fully_shard([block.attn, block.mlp] if option == "module-list" else block, **kwargs)
    return fully_shard(model, **kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("option", ["mixed-precision", "cpu-offload", "module-list"])
def test_one_rank_trains_bit_for_bit_with_fsdp_options(process_group, option):
    batches = [make_batch(seed=s) for s in range(3)]
    reference = train(sharded_gpt2_with(option), batches)
    model = sharded_gpt2_with(option)
    workload = profile_model(model, batches[0], loss_fn, repeats=1)
    if option == "mixed-precision":  # the activations are bf16: half the float32 model's bytes
        float32 = profile_model(sharded_gpt2(), batches[0], loss_fn, repeats=1)
        assert workload.saved_bytes < float32.saved_bytes
    runtime = slackswap.apply(model, plan_for(workload, "mixed"))
    assert same(train(model, batches, runtime), reference)
    stats = runtime.stats
    assert stats.d2h_bytes > 0 and stats.recompute_ops > 0 and stats.fsdp_regathers > 0, stats


def test_two_dimensional_mesh_and_checkpoint_backend_are_refused(process_group):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    batch = make_batch(seed=0)
    model = sharded_gpt2()
    workload = profile_model(model, batch, loss_fn, repeats=1)
    with pytest.raises(UnsupportedModelError, match=r'backend="checkpoint" does not follow FSDP2.*backend="replay"'):
        slackswap.apply(model, plan_for(workload, "swap"), backend="checkpoint")
    hsdp = fully_shard(make_example("gpt2"), mesh=init_device_mesh("cpu", (1, 1), mesh_dim_names=("replicate", "shard")))
    with pytest.raises(UnsupportedModelError) as info:
        profile_model(hsdp, batch, loss_fn)
    message = str(info.value)
    assert "\n" not in message and "over a 2-D mesh" in message and "fully_shard on a 1-D mesh" in message


def _rank(rank: int, world: int, store: str, out: str) -> None:
    """One rank of test_two_ranks_train_bit_for_bit (module level: spawn imports it by name)."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        batches = [make_batch(seed=10 * rank + s) for s in range(3)]  # each rank its own data
        reference = train(sharded_gpt2(), batches)
        # Profiling runs FSDP's collectives, so every rank profiles; rank 0 plans for all.
        workload = profile_model(sharded_gpt2(), batches[0], loss_fn, repeats=1)
        shared = [workload]
        dist.broadcast_object_list(shared, src=0)
        workload = shared[0]
        result = {}
        for how in HOWS:
            model = sharded_gpt2()
            runtime = slackswap.apply(model, plan_for(workload, how), workload=workload)
            result[how] = (same(train(model, batches, runtime), reference), runtime.stats.d2h_bytes,
                           runtime.stats.recompute_ops, runtime.stats.fsdp_regathers)
        # Different plans on the two ranks: refused on both, before any step.
        try:
            slackswap.apply(sharded_gpt2(), plan_for(workload, HOWS[rank]), workload=workload)
            result["different plans"] = "accepted"
        except PlanMismatchError as error:
            result["different plans"] = str(error)
        torch.save(result, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_train_bit_for_bit(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_rank, args=(2, str(tmp_path / "store"), str(tmp_path / "result")), nprocs=2)
    for rank in range(2):
        result = torch.load(tmp_path / f"result.{rank}")
        for how in HOWS:
            identical, d2h_bytes, recompute_ops, regathers = result[how]
            assert identical, (rank, how)
            assert (d2h_bytes > 0) == (how != "recompute") and (recompute_ops > 0) == (how != "swap")
        # all-recompute rebuilds a block's activations in the next block's backward, before FSDP
        # gathers the block again: the runtime gathered it
        assert result["swap"][3] == 0 and result["recompute"][3] > 0
        assert result["different plans"].startswith("slackswap.apply on an FSDP2 model: rank 1 applies another plan")


# ---- slackswap.auto on FSDP2: two lengths alternating ----------------------------------------------
AUTO_LENGTHS = (16, 8, 16)


def _auto_rank(rank: int, world: int, store: str, out: str, cache: str) -> None:
    """One rank of test_auto_two_ranks_two_lengths (module level: spawn imports it by name)."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        batches = [tuple(t[:, :n].contiguous() for t in make_batch(seed=10 * rank + i))
                   for i, n in enumerate(AUTO_LENGTHS)]  # each rank its own data, the same lengths
        reference = train(sharded_gpt2(), batches)
        model = sharded_gpt2()
        auto = slackswap.auto(model, loss_fn, budget=0.5, policy="capuchin", cache_dir=cache, repeats=1)

        def step(batch):
            value = loss_fn(model, batch)
            value.backward()
            return value

        result = {"identical": None}
        plans = []
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        torch.manual_seed(1234)  # as runtime_helpers.train
        losses = []
        for batch in batches:
            opt.zero_grad(set_to_none=True)
            with auto(batch):
                losses.append(step(batch).detach().clone())
            plans.append(auto.entries(batch)[1][0].plan.to_json())
            opt.step()
        params = list(model.parameters())
        mine = (losses, [local(p.grad) for p in params], [local(p.detach()).clone() for p in params])
        result["identical"] = same(mine, reference)
        result["stats"] = (auto.stats.profiles, auto.stats.steps, auto.stats.disk_hits)
        result["plans"] = plans
        # Ranks stepping on different lengths are refused on every rank, before any step.
        try:
            auto(batches[rank])
            result["different lengths"] = "accepted"
        except PlanMismatchError as error:
            result["different lengths"] = str(error)
        torch.save(result, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_auto_two_ranks_two_lengths(tmp_path):
    import torch.multiprocessing as mp

    cache = tmp_path / "plans"
    mp.spawn(_auto_rank, args=(2, str(tmp_path / "store"), str(tmp_path / "result"), str(cache)), nprocs=2)
    results = [torch.load(tmp_path / f"result.{rank}") for rank in range(2)]
    for result in results:
        assert result["identical"]
        assert result["stats"] == (2, 3, 0)  # each length profiled once on each rank
        assert result["plans"][0] == result["plans"][2] != result["plans"][1]
        assert result["different lengths"].startswith("slackswap.auto on an FSDP2 model: rank 1 steps on a batch")
    assert results[0]["plans"] == results[1]["plans"]  # every rank applies rank 0's plan
    assert len(list(cache.iterdir())) == 2  # written once, by rank 0
