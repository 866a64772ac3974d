"""slackswap.compile on FSDP2 (torch.distributed.fsdp.fully_shard) models, CPU and gloo, aot_eager.

- FSDP's hooks are excluded from torch.compile's tracing (PyTorch 2.13), so each fully_shard unit's
  forward compiles as its own graph, and the parameters FSDP gathered are graph inputs like any
  parameter: the graph's workload is the one the unsharded model with the same graph breaks gives.
- Training under a plan is bit-identical to FSDP2 + plain torch.compile for three steps: one rank
  under a keep / swap / recompute plan here; two ranks under all-swap, all-recompute and a mixed plan
  in the slow test, where every rank also plans the same.
- A budget in bytes is refused (one graph serves every unit of a stack).
- Parameters a graph gathers itself (functional collectives, as a traced FSDP or DTensor all-gather
  makes) are parameters, not activations, in the graph's workload.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():  # pragma: no cover - torch built without distributed
    pytest.skip("torch.distributed is not available", allow_module_level=True)

from compiled_checks import fresh_dynamo  # noqa: E402,F401 (autouse)

import slackswap  # noqa: E402
from slackswap import Action  # noqa: E402
from slackswap.compiled import carry_out  # noqa: E402
from slackswap.errors import BudgetError  # noqa: E402
from slackswap.examples.models import ExampleConfig, loss_fn, make_batch, make_example  # noqa: E402

SMALL = ExampleConfig(layers=2, hidden=16, heads=2, ffn=32, seq_len=8, vocab=32)
HARDWARE = "a100-80gb-pcie4"
# (policy, budget) per case: full recompute cannot go below the graph's peak (the block's input stays);
# slackswap at 0.3 of the peak on this hardware keeps, swaps and recomputes.
CASES = {"swap": ("swap-only", 0.5), "recompute": ("full-recompute", 1.0), "mixed": ("slackswap", 0.3)}



def sharded_gpt2():
    """The small GPT-2 with each block a fully_shard unit and the root a unit."""
    from torch.distributed.fsdp import fully_shard

    model = make_example("gpt2", SMALL)
    for block in model.h:
        fully_shard(block)
    return fully_shard(model)


def gpt2_broken_like_fsdp():
    """The unsharded small GPT-2 with a graph break before each block, where FSDP's untraced hooks are."""
    model = make_example("gpt2", SMALL)
    for block in model.h:
        block.register_forward_pre_hook(torch._dynamo.disable(lambda module, args: None))
    return model


def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def train(model, batches):
    """Three SGD-momentum steps: each loss, then the last gradients and the parameters (this rank's shards)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(1234)  # dropout draws from here
    losses = []
    for batch in batches:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model, batch)
        loss.backward()
        losses.append(loss.detach().clone())
        opt.step()
    params = list(model.parameters())
    return losses, [local(p.grad).clone() for p in params], [local(p.detach()).clone() for p in params]


def same(a, b) -> bool:
    return all(len(x) == len(y) and all(torch.equal(u, v) for u, v in zip(x, y)) for x, y in zip(a, b))


def tensors_of(workload):
    return [(t.name, t.size_bytes, t.producer, t.bwd_readers) for t in workload.tensors]


def compiled_case(how: str, batch):
    policy, budget = CASES[how]
    return slackswap.compile(sharded_gpt2(), batch, loss_fn, hardware=HARDWARE, policy=policy, budget=budget,
                             backend="aot_eager")


def test_one_rank_trains_bit_for_bit_and_each_unit_is_a_graph(process_group):
    batches = [make_batch(SMALL, seed=s) for s in range(3)]
    reference = train(torch.compile(sharded_gpt2(), backend="aot_eager"), batches)
    torch._dynamo.reset()
    compiled = compiled_case("mixed", batches[0])
    (graph,) = compiled.slackswap.graphs  # the two blocks share one graph; the root's own ops run eagerly
    counts = {a: graph.plan.count(a) for a in Action}
    assert all(counts.values()), counts
    assert graph.offloaded_bytes and graph.plan_recompute_flops > 0
    assert same(train(compiled, batches), reference)
    # FSDP's gathered parameters are parameters: the workload is the unsharded model's with the same breaks
    torch._dynamo.reset()
    plain = slackswap.compile(gpt2_broken_like_fsdp(), batches[0], loss_fn, hardware=HARDWARE, policy="slackswap",
                              budget=0.3, backend="aot_eager")
    (plain_graph,) = plain.slackswap.graphs
    assert tensors_of(graph.workload) == tensors_of(plain_graph.workload)
    assert graph.saved == plain_graph.saved
    assert graph.plan.actions == plain_graph.plan.actions


def test_a_budget_in_bytes_is_refused_for_fsdp(process_group):
    with pytest.raises(BudgetError) as info:
        slackswap.compile(sharded_gpt2(), hardware=HARDWARE, budget="64KiB", backend="aot_eager")
    message = str(info.value)
    assert "\n" not in message and "FSDP2" in message and "3 here" in message and "as a fraction" in message


class _GathersItsWeight(torch.nn.Module):
    """A layer that all-gathers its weight shard inside the forward, as a traced FSDP does."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(8, 8)
        self.shard = torch.nn.Parameter(torch.randn(8, 8))
        self.b = torch.nn.Linear(8, 8)

    def forward(self, x, y):
        import torch.distributed._functional_collectives as funcol

        weight = funcol.all_gather_tensor(self.shard, 0, dist.group.WORLD)  # (8 x world, 8)
        h = torch.tanh(self.a(x)) @ weight[:8]
        return (self.b(h).sin() - y).pow(2).sum()


def test_parameters_gathered_inside_the_graph_are_parameters(process_group):
    x, y = torch.randn(4, 8, generator=torch.Generator().manual_seed(1)), torch.zeros(4, 8)
    reference_model = _GathersItsWeight()
    reference = torch.compile(reference_model, backend="aot_eager")
    reference(x, y).backward()
    torch._dynamo.reset()
    model = _GathersItsWeight()
    compiled = slackswap.compile(model, (x, y), lambda m, b: m(*b), hardware=HARDWARE, policy="swap-only",
                                 backend="aot_eager")
    (graph,) = compiled.slackswap.graphs
    ops = [op.name for op in graph.workload.ops]
    assert not any("all_gather" in name or "wait_tensor" in name for name in ops), ops
    assert graph.graph_workload.gathered_nodes >= {"all_gather_into_tensor", "wait_tensor"}
    # Activations by hand, float32: the input x and y (128 B each) and 4 x 8 results of a, tanh, mm, b,
    # sin, sub, pow (128 B each), the loss (4 B); the 256 B gathered weight is not one of them.
    sizes = sorted(t.size_bytes for t in graph.workload.tensors)
    assert sizes == [4] + [128] * 9, sizes
    kinds = {(size, kind) for _, size, kind in graph.saved}
    assert (256, carry_out.PARAMETER) in kinds and carry_out.OFFLOADED in {k for _, k in kinds}, graph.saved
    compiled(x, y).backward()
    for p, q in zip(model.parameters(), reference_model.parameters()):
        assert torch.equal(p.grad, q.grad)


def _rank(rank: int, world: int, store: str, out: str) -> None:
    """One rank of test_two_ranks_train_bit_for_bit (module level: spawn imports it by name)."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        batches = [make_batch(SMALL, seed=10 * rank + s) for s in range(3)]  # each rank its own data
        reference = train(torch.compile(sharded_gpt2(), backend="aot_eager"), batches)
        result = {}
        for how in CASES:
            torch._dynamo.reset()
            compiled = compiled_case(how, batches[0])
            (graph,) = compiled.slackswap.graphs
            digests = [None] * world
            dist.all_gather_object(digests, graph.plan.to_json())
            result[how] = (same(train(compiled, batches), reference), {a.value: graph.plan.count(a) for a in Action},
                           sum(graph.offloaded_bytes.values()), graph.plan_recompute_flops,
                           len(set(digests)) == 1, sum(t.size_bytes for t in graph.workload.tensors))
        torch.save(result, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_train_bit_for_bit(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_rank, args=(2, str(tmp_path / "store"), str(tmp_path / "result")), nprocs=2)
    results = [torch.load(tmp_path / f"result.{rank}") for rank in range(2)]
    for rank, result in enumerate(results):
        for how in CASES:
            identical, counts, offloaded_bytes, recompute_flops, same_plan, activation_bytes = result[how]
            assert identical and same_plan, (rank, how)
            assert (offloaded_bytes > 0) == (how != "recompute") and (counts["swap"] > 0) == (how != "recompute")
            assert (counts["recompute"] > 0) == (how != "swap"), (rank, how, counts)
        assert result["mixed"][1]["keep"] > 0 and result["mixed"][3] > 0
    # each rank's graph holds its own activations (the same shapes on both ranks: the same bytes)
    assert {r[how][5] for r in results for how in CASES} == {results[0]["swap"][5]}
