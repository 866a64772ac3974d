"""Profiler: saved bytes, op structure, FLOPs, roofline projection, and the edge cases the
runtime must survive (shared storages, views, in-place ops, dropout, a tensor saved twice,
a module called twice in one forward)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from slackswap import Action, Workload, get_hardware, make_plan, simulate  # noqa: E402
from slackswap.examples import EXAMPLES, loss_fn, make_batch, make_example  # noqa: E402
from slackswap.profiler import model_signature, profile_model  # noqa: E402
from slackswap.runtime import apply_plan, build_execution_map, runtime_prefetch_steps  # noqa: E402


def independent_saved_bytes(model, batch, loss) -> int:
    """Plain saved_tensors_hooks: unique storages saved for backward, parameters excluded."""
    frozen = {t.untyped_storage().data_ptr() for t in list(model.parameters()) + list(model.buffers())}
    storages = {}
    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in frozen and s.nbytes():
            storages[s.data_ptr()] = (s.nbytes(), t)  # holding t keeps the address unique
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss(model, batch)
    return sum(n for n, _ in storages.values())


@pytest.mark.parametrize("kind", sorted(EXAMPLES))
def test_saved_bytes_match_an_independent_count(kind):
    model, batch = make_example(kind), make_batch()
    workload = profile_model(model, batch, loss_fn, repeats=1)
    assert workload.saved_bytes == independent_saved_bytes(model, batch, loss_fn)
    assert workload.saved_bytes > 0


class Quirky(nn.Module):
    """One of each case: chunk views of one storage saved by one op (shared storage), a
    transpose view, an in-place relu, dropout, a tensor saved twice (h * h), and a module
    called twice in one forward."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.inner = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))
        self.drop = nn.Dropout(0.25)
        self.out = nn.Linear(8, 8)

    def forward(self, x, y):
        u, v = self.a(x).chunk(2, dim=-1)      # two views of one storage
        h = u * v                               # saves both views: one storage, counted once
        h = self.inner(h)
        h = torch.relu_(h * 1.5)                # in place
        h = h * h                               # saves h twice
        h = self.inner(self.drop(h))            # second call of the same module
        z = (self.out(h).t() @ h)               # a transpose view saved by mm
        return ((z - y) ** 2).mean()


def quirky_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(4, 8, generator=g), torch.randn(8, 8, generator=g)


def quirky_loss(model, batch):
    return model(*batch)


def test_edge_cases_are_profiled_with_storages_counted_once():
    torch.manual_seed(0)
    model, batch = Quirky(), quirky_batch()
    workload = profile_model(model, batch, quirky_loss, repeats=1)
    assert workload.saved_bytes == independent_saved_bytes(model, batch, quirky_loss)
    names = [op.name for op in workload.ops]
    assert any(n.startswith("inner.0/") for n in names) and any(n.startswith("inner.0@1/") for n in names)
    chunk_storage = next(op.outputs[0] for op in workload.ops if op.name.startswith("a/addmm"))
    readers = workload.tensor_by_name[chunk_storage].bwd_readers
    assert len(readers) == 1 and "/mul#" in readers[0]      # both chunk views, one reader, one tensor
    relu = next(op for op in workload.ops if "/relu_#" in op.name)
    # In place: a new version of the same storage, made by relu_ from the version before it.
    (mutated_name,) = relu.outputs
    before = workload.tensor_by_name[relu.inputs[0]]
    mutated = workload.tensor_by_name[mutated_name]
    assert mutated.size_bytes == before.size_bytes and not before.is_saved
    square = workload.ops[workload.op_index[relu.name] + 1]
    assert mutated.bwd_readers == (relu.name, square.name)  # relu_ saves its result; h * h saves h twice, once counted
    # The dropout mask is empty_like, then bernoulli_ and div_ in place: the saved version is div_'s.
    mask = next(t for t in workload.saved_tensors if t.name.startswith("drop/div_"))
    assert mask.bwd_readers == (next(op.name for op in workload.ops if op.name.startswith("drop/mul")),)
    assert any(op.kind == "view" for op in workload.ops)


@pytest.mark.parametrize("choice", ["swap", "recompute-inner", "mixed"])
def test_edge_case_model_trains_bitwise_under_plans(choice):
    torch.manual_seed(0)
    base = Quirky()
    batches = [quirky_batch(s) for s in range(3)]
    workload = profile_model(base, batches[0], quirky_loss, repeats=1)
    saved = [t for t in workload.saved_tensors if t.producer is not None]
    if choice == "swap":
        actions = {t.name: Action.SWAP for t in saved}
    else:
        # Recompute what the second call of `inner` saves for itself; in "mixed" also swap the rest.
        def inside(op_name):  # is the op inside the second call of `inner`?
            call = workload.meta["op_calls"][workload.op_index[op_name]]
            while call is not None and call != "inner@1":
                call = workload.meta["calls"].get(call)
            return call == "inner@1"

        actions = {}
        for t in saved:
            if inside(t.producer) and all(inside(r) for r in t.bwd_readers):
                actions[t.name] = Action.RECOMPUTE
            elif choice == "mixed" and "relu_" not in t.producer:
                actions[t.name] = Action.SWAP
    plan = make_plan(workload, actions, policy=choice, budget_bytes=None,
                     prefetch_step=runtime_prefetch_steps(workload, actions))
    plan = dataclasses.replace(plan, budget_bytes=simulate(workload, get_hardware("h100-pcie5"), plan).peak_memory_bytes)
    emap = build_execution_map(workload, plan)
    assert emap.aligned, emap.notes
    if choice != "swap":
        groups = plan.recompute_groups.values()
        assert groups and all(inside(g) for group in groups for g in group)  # only the second call re-runs

    def run(model, runtime=None):
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        torch.manual_seed(7)
        out = []
        for b in batches:
            opt.zero_grad()
            with runtime if runtime is not None else contextlib.nullcontext():
                loss = quirky_loss(model, b)
                loss.backward()
            out.append(loss.detach())
            opt.step()
        return out, [p.grad.clone() for p in model.parameters()]

    ref = run(copy.deepcopy(base))
    planned_model = copy.deepcopy(base)
    runtime = apply_plan(planned_model, plan, workload)
    got = run(planned_model, runtime)
    assert all(torch.equal(a, b) for a, b in zip(ref[0], got[0]))
    assert all(torch.equal(a, b) for a, b in zip(ref[1], got[1]))
    assert runtime.stats.step_d2h_bytes == plan.bytes_with(workload, Action.SWAP)
    assert runtime.stats.peak_device_saved_bytes <= plan.budget_bytes


def test_op_names_layers_flops_and_kinds():
    model, batch = make_example("gpt2"), make_batch()
    workload = profile_model(model, batch, loss_fn, repeats=1)
    c = model.config
    fc = next(op for op in workload.ops if op.name.startswith("h.1.mlp.fc/addmm"))
    tokens = c.micro_batch * c.seq_len
    assert fc.flops == 2 * tokens * c.hidden * c.ffn
    assert fc.kind == "gemm" and fc.layer == 1
    assert workload.ops[0].layer == -1 and workload.ops[-1].layer == c.layers
    assert workload.ops[-1].name.startswith("model/")
    assert all(op.fwd_time_s >= 0 and op.bwd_time_s >= 0 for op in workload.ops)
    assert fc.bwd_time_s > 0
    # Model states (slackswap.memory) read the trainable parameter count and the largest block.
    assert workload.meta["parameter_count"] == sum(p.numel() for p in model.parameters())
    blocks = [sum(p.numel() for n, p in model.named_parameters() if n.startswith(f"h.{i}.")) for i in range(c.layers)]
    outside = workload.meta["parameter_count"] - sum(blocks)
    assert workload.meta["largest_unit_parameter_count"] == max(blocks + [outside])


def test_profile_is_json_round_trippable_and_structurally_stable():
    model, batch = make_example("bert"), make_batch()
    a = profile_model(model, batch, loss_fn, repeats=1)
    b = profile_model(model, batch, loss_fn, repeats=2)
    assert a.fingerprint != b.fingerprint or True  # times may differ; structure must not
    strip = lambda w: [(op.name, op.inputs, op.outputs, op.flops) for op in w.ops]  # noqa: E731
    assert strip(a) == strip(b)
    assert [(t.name, t.size_bytes, t.bwd_readers) for t in a.tensors] == [(t.name, t.size_bytes, t.bwd_readers) for t in b.tensors]
    again = Workload.from_json(a.to_json())
    assert again.fingerprint == a.fingerprint and again.meta["model_signature"] == model_signature(model)
    assert json.loads(a.to_json())["name"].startswith("BertLike-")


def test_hardware_projection_uses_the_roofline():
    model, batch = make_example("gpt2"), make_batch()
    hw = get_hardware("a100-80gb-pcie4")
    w = profile_model(model, batch, loss_fn, hardware="a100-80gb-pcie4", repeats=1)
    fc = next(op for op in w.ops if op.name.startswith("h.0.mlp.fc/addmm"))
    expected = max(fc.flops / hw.achieved_gemm_flops_per_s, fc.bytes_accessed / hw.achieved_hbm_bytes_per_s)
    assert fc.fwd_time_s == expected and fc.bwd_time_s == 2 * expected
    assert len(w.meta["measured_fwd_time_s"]) == len(w.ops)


def test_profiling_leaves_model_grads_buffers_and_rng_alone():
    model, batch = make_example("gpt2"), make_batch()
    params = [p.detach().clone() for p in model.parameters()]
    torch.manual_seed(5)
    before = torch.rand(3)
    torch.manual_seed(5)
    profile_model(model, batch, loss_fn, warmup=1, repeats=2)
    assert torch.equal(torch.rand(3), before)
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(a, p) for a, p in zip(params, model.parameters()))
