"""Wrapped models and call contexts (issue 6, item 4): what the profiler and the runtime accept.

- DistributedDataParallel (gloo on CPU, one process and two): profiled and run through its inner
  module, with gradients bit-identical to unplanned DDP training, swapping or recomputing
  everything.
- torch.compile: the wrapper is looked through; under the runtime the model runs eagerly (Dynamo
  skips frames while a TorchDispatchMode is active), which one RuntimeFallbackWarning says.
- FSDP1, DTensor parameters no fully_shard unit manages, multi-GPU DataParallel and CUDA graph
  capture raise UnsupportedModelError, one line naming the wrapper and the fix, before anything
  runs; on the CLI that is exit code 2. FSDP2 (fully_shard) is supported: test_runtime_fsdp.py.
"""

from __future__ import annotations

import copy
import warnings

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():  # pragma: no cover - torch built without distributed
    pytest.skip("torch.distributed is not available", allow_module_level=True)

import slackswap  # noqa: E402
from slackswap import Action, make_plan  # noqa: E402
from slackswap.errors import RuntimeFallbackWarning, UnsupportedModelError  # noqa: E402
from slackswap.examples import loss_fn, make_batch, make_example  # noqa: E402
from slackswap.profiler import profile_model, workload_for  # noqa: E402
from slackswap.runtime import runtime_prefetch_steps  # noqa: E402


def every(workload, how: str):
    candidates = [t.name for t in workload.saved_tensors if t.producer is not None]
    actions = {name: Action(how) for name in candidates}
    return make_plan(workload, actions, policy=how, budget_bytes=None,
                     prefetch_step=runtime_prefetch_steps(workload, actions))


def one_step(model, batch, runtime=None):
    torch.manual_seed(7)  # dropout draws from the global generator
    model.zero_grad(set_to_none=True)
    if runtime is None:
        loss = loss_fn(model, batch)
        loss.backward()
    else:
        with runtime:
            loss = loss_fn(model, batch)
            loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def assert_same(a, b):
    assert torch.equal(a[0], b[0])
    assert len(a[1]) == len(b[1]) and all(torch.equal(x, y) for x, y in zip(a[1], b[1]))


# ---- DistributedDataParallel -----------------------------------------------------------------------

def test_ddp_model_is_profiled_and_trained_through_its_inner_module(process_group):
    from torch.nn.parallel import DistributedDataParallel

    plain = make_example("gpt2")
    ddp = DistributedDataParallel(copy.deepcopy(plain))
    batch = make_batch(seed=0)
    reference = one_step(ddp, batch)

    workload = profile_model(ddp, batch, loss_fn, repeats=1)
    # the inner module's ops only: DDP's buffer broadcast and reducer work are not model ops
    assert workload.name == profile_model(plain, batch, loss_fn, repeats=1).name
    assert workload_for(ddp) is workload
    for how in ("swap", "recompute"):
        runtime = slackswap.apply(ddp, every(workload, how))  # the workload is found through the wrapper
        for _ in range(2):
            assert_same(one_step(ddp, batch, runtime), reference)
        moved = runtime.stats.d2h_bytes if how == "swap" else runtime.stats.recompute_ops
        assert moved > 0, f"{how}: the plan did nothing ({runtime.stats})"


def _ddp_rank(rank: int, world: int, store: str, out: str) -> None:
    """One rank of test_ddp_with_two_processes (module level: spawn imports it by name)."""
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)  # the same initial weights on both ranks
        ddp = DistributedDataParallel(make_example("gpt2"))
        batch = make_batch(seed=rank)  # each rank its own data: the allreduce averages
        reference = one_step(ddp, batch)
        workload = profile_model(ddp, batch, loss_fn, repeats=1)  # no collective: ranks profile alone
        same = {}
        for how in ("swap", "recompute"):
            runtime = slackswap.apply(ddp, every(workload, how))
            got = one_step(ddp, batch, runtime)
            same[how] = torch.equal(got[0], reference[0]) and all(
                torch.equal(a, b) for a, b in zip(got[1], reference[1]))
        torch.save(same, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def test_ddp_with_two_processes_trains_bit_for_bit(tmp_path):
    """Two gloo ranks on CPU with different batches: after DDP's allreduce, every gradient under
    an all-swap and an all-recompute plan equals unplanned DDP training's, on both ranks."""
    import torch.multiprocessing as mp

    mp.spawn(_ddp_rank, args=(2, str(tmp_path / "store"), str(tmp_path / "same")), nprocs=2)
    for rank in range(2):
        assert torch.load(tmp_path / f"same.{rank}") == {"swap": True, "recompute": True}


def test_single_device_data_parallel_is_looked_through_and_multi_gpu_refused():
    model = make_example("gpt2")
    batch = make_batch(seed=0)
    wrapped = torch.nn.DataParallel(model)  # on CPU: no devices, forward calls the module
    workload = profile_model(wrapped, batch, loss_fn, repeats=1)
    assert workload_for(model) is workload
    wrapped.device_ids = [0, 1]  # what DataParallel over two GPUs holds
    with pytest.raises(UnsupportedModelError, match=r"^profile: torch.nn.DataParallel over 2 GPUs .* "
                                                    r"use DistributedDataParallel"):
        profile_model(wrapped, batch, loss_fn, repeats=1)
    with pytest.raises(UnsupportedModelError, match="DataParallel over 2 GPUs"):
        slackswap.apply(wrapped, every(workload, "swap"))


# ---- FSDP1 and tensor-parallel DTensor: refused ------------------------------------------------------

def test_fsdp1_submodule_is_refused_by_name(process_group):
    from torch.distributed.fsdp import FullyShardedDataParallel

    model = make_example("gpt2")
    name, child = next((n, m) for n, m in model.named_children() if any(True for _ in m.parameters()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "switching to NO_SHARD since the world size is 1"
        setattr(model, name, FullyShardedDataParallel(child, device_id=torch.device("cpu")))
    with pytest.raises(UnsupportedModelError, match=rf"module '{name}' is wrapped by FullyShardedDataParallel \(FSDP1\)"):
        profile_model(model, make_batch(seed=0), loss_fn)


def test_dtensor_parameter_is_refused_by_name(process_group):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    mesh = init_device_mesh("cpu", (1,))
    layer = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    layer[1].weight = torch.nn.Parameter(distribute_tensor(layer[1].weight.detach(), mesh, [Replicate()]))
    with pytest.raises(UnsupportedModelError, match=r"parameter '1.weight' is a DTensor that no fully_shard unit manages"):
        profile_model(layer, torch.randn(2, 3), lambda m, b: m(b).sum())


# ---- CUDA graph capture: refused at the step's start ------------------------------------------------

def test_cuda_graph_capture_is_refused_and_the_model_stays_usable(monkeypatch):
    model = make_example("gpt2")
    batch = make_batch(seed=0)
    workload = profile_model(model, batch, loss_fn, repeats=1)
    plan = every(workload, "swap")
    reference = one_step(model, batch)
    with monkeypatch.context() as patch:
        # what torch reports inside torch.cuda.graph(...) on a GPU
        patch.setattr(torch.cuda, "is_available", lambda: True)
        patch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
        with pytest.raises(UnsupportedModelError, match=r"^profile: a CUDA graph is being captured"):
            profile_model(model, batch, loss_fn)
        runtime = slackswap.apply(model, plan)
        with pytest.raises(UnsupportedModelError, match=r"^slackswap.apply: a CUDA graph is being captured.*"
                                                        r"outside torch.cuda.graph"):
            one_step(model, batch, runtime)
        assert runtime.stats.steps == 0
    assert_same(one_step(model, batch, runtime), reference)
    assert runtime.stats.d2h_bytes > 0


# ---- torch.compile: looked through, runs eagerly under the runtime, says so -------------------------

def test_compiled_model_runs_eagerly_under_the_runtime_with_one_warning():
    model = make_example("gpt2")
    batch = make_batch(seed=0)
    workload = profile_model(model, batch, loss_fn, repeats=1)
    reference = one_step(model, batch)
    compiled = torch.compile(model, backend="aot_eager")
    assert profile_model(compiled, batch, loss_fn, repeats=1).name == workload.name
    plan = every(workload, "swap")
    runtime = slackswap.apply(compiled, plan, workload=workload)  # the eager model's plan
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            assert_same(one_step(compiled, batch, runtime), reference)
    fallbacks = [w for w in caught if issubclass(w.category, RuntimeFallbackWarning)]
    assert len(fallbacks) == 1, [str(w.message) for w in caught]
    assert "runs uncompiled under the runtime" in str(fallbacks[0].message)
    assert runtime.stats.d2h_bytes > 0
    # the eager model under the runtime warns about nothing
    eager_runtime = slackswap.apply(model, plan, workload=workload)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert_same(one_step(model, batch, eager_runtime), reference)
    assert not [w for w in caught if issubclass(w.category, RuntimeFallbackWarning)]


def test_profile_command_refuses_a_sharded_model_with_exit_code_2(process_group, tmp_path, capsys):
    from slackswap.cli import main

    source = tmp_path / "sharded.py"
    source.write_text(
        "import warnings, torch\n"
        "from torch.distributed.fsdp import FullyShardedDataParallel\n"
        "from slackswap.examples import loss_fn, make_batch as example_batch, make_example\n"
        "def make_model():\n"
        "    with warnings.catch_warnings():\n"
        "        warnings.simplefilter('ignore')\n"
        "        return FullyShardedDataParallel(make_example('gpt2'), device_id=torch.device('cpu'))\n"
        "def make_batch():\n"
        "    return example_batch(seed=0)\n"
    )
    out = tmp_path / "w.json"
    assert main(["profile", str(source), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "wrapped by FullyShardedDataParallel (FSDP1)" in err and "Traceback" not in err
    assert not out.exists() and list(tmp_path.iterdir()) == [source]


def test_dynamo_compiles_nothing_under_the_runtime():
    """Why the warning is true: with the runtime's dispatch mode active, Dynamo compiles no frame
    of a fresh compiled model; without it, it compiles the model. If a torch release starts
    compiling under dispatch modes, this fails and the warning must be revisited."""
    from torch._dynamo.utils import counters

    model = make_example("gpt2")
    batch = make_batch(seed=0)
    workload = profile_model(model, batch, loss_fn, repeats=1)
    runtime = slackswap.apply(model, every(workload, "keep"), workload=workload, backend="replay")
    torch._dynamo.reset()
    counters.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeFallbackWarning)
        one_step(torch.compile(model, backend="aot_eager"), batch, runtime)
    assert counters["stats"]["unique_graphs"] == 0
    torch._dynamo.reset()
    counters.clear()
    one_step(torch.compile(model, backend="aot_eager"), batch)
    assert counters["stats"]["unique_graphs"] >= 1
