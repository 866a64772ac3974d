"""Model states (slackswap.memory): parameter counts and the ZeRO paper's accounting."""

from __future__ import annotations

import pytest

from slackswap import get_hardware
from slackswap.errors import UnknownNameError, ValidationError
from slackswap.memory.parameters import parameter_meta
from slackswap.memory import ParameterCount, model_states, parameter_count_of, transformer_parameters
from slackswap.workloads.models import MODELS, build_model_workload, model_spec
from slackswap.workloads.synthetic import chain

# Parameter counts of the Hugging Face checkpoints (model.num_parameters()), derived by hand
# from their configs: gpt2-xl 1,557,611,200; Llama-2-7b 6,738,415,616; bert-large-uncased
# BertForMaskedLM (no pooler) 335,174,458; with grouped-query attention, Meta-Llama-3-8B
# 8,030,261,248 and Llama-2-70b 68,976,648,192 (their model cards' 8B and 70B).
HF_COUNTS = {"gpt2-xl": 1_557_611_200, "llama-7b": 6_738_415_616, "bert-large": 335_174_458,
             "llama-3-8b": 8_030_261_248, "llama-2-70b": 68_976_648_192}


@pytest.mark.parametrize("name", sorted(HF_COUNTS))
def test_builtin_parameter_counts_match_the_published_checkpoints(name):
    whole = MODELS[name].replace(tensor_parallel=1, sequence_parallel=False)  # llama-2-70b is one t=8 rank
    assert transformer_parameters(whole).total == HF_COUNTS[name]


def test_a_tensor_parallel_rank_holds_a_tth_of_the_weights_and_whole_norms():
    spec = MODELS["llama-2-70b"]  # no biases: only the RMSNorm weights are replicated
    whole = transformer_parameters(spec.replace(tensor_parallel=1, sequence_parallel=False)).total
    replicated = (2 * spec.layers + 1) * spec.hidden
    assert 8 * transformer_parameters(spec).total - 7 * replicated == whole
    # Pipeline stages: the first holds the embedding, the last the final norm and LM head.
    stages = [transformer_parameters(spec.replace(pipeline_parallel=4, pipeline_stage=i)).total for i in range(4)]
    assert sum(stages) == transformer_parameters(spec).total
    assert stages[1] == stages[2] < stages[0] and stages[1] < stages[3]


def test_largest_unit_is_a_layer_or_the_embedding():
    # Llama: a layer (202,383,360) is larger than the embedding table (131,072,000).
    assert transformer_parameters(MODELS["llama-7b"]).largest_unit == 4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096
    # BERT-large: the embedding (31,782,912) is larger than a layer (12,596,224).
    assert transformer_parameters(MODELS["bert-large"]).largest_unit == 30522 * 1024 + 514 * 1024 + 2048


# ZeRO paper, Figure 1: 7.5B parameters, N_d = 64, K = 12 (mixed-precision Adam).
ZERO_P, ZERO_N = 7_500_000_000, 64


@pytest.mark.parametrize("sharding, per_rank_bytes", [
    ("none", 16 * ZERO_P),  # 120 GB
    ("zero1", 4 * ZERO_P + 12 * ZERO_P // ZERO_N),  # P_os: 31.4 GB
    ("zero2", 2 * ZERO_P + 14 * ZERO_P // ZERO_N),  # P_os+g: 16.6 GB
    ("zero3", 16 * ZERO_P // ZERO_N),  # P_os+g+p: 1.9 GB
])
def test_zero_paper_figure_1(sharding, per_rank_bytes):
    states = model_states(ZERO_P, optimizer="adam", precision="bf16-mixed", ranks=ZERO_N, sharding=sharding)
    assert states.persistent_bytes == per_rank_bytes
    assert round(per_rank_bytes / 1e9, 1) == {"none": 120.0, "zero1": 31.4, "zero2": 16.6, "zero3": 1.9}[sharding]


def test_mixed_precision_adam_is_2_2_12_bytes_per_parameter():
    s = model_states(1000, optimizer="adamw", precision="bf16-mixed")
    assert (s.parameter_bytes, s.gradient_bytes, s.optimizer_state_bytes) == (2000, 2000, 12000)
    assert s.gathered_bytes == 0 and s.sharding == "none"


@pytest.mark.parametrize("optimizer, precision, per_param", [
    ("sgd", "fp32", (4, 4, 0)),
    ("sgd-momentum", "fp32", (4, 4, 4)),
    ("adam", "fp32", (4, 4, 8)),
    ("sgd", "bf16", (2, 2, 0)),
    ("sgd-momentum", "bf16", (2, 2, 2)),
    ("adam", "bf16", (2, 2, 4)),
    ("sgd", "bf16-mixed", (2, 2, 4)),  # the fp32 master copy only
    ("sgd-momentum", "bf16-mixed", (2, 2, 8)),
])
def test_bytes_per_parameter(optimizer, precision, per_param):
    s = model_states(10, optimizer=optimizer, precision=precision)
    assert (s.parameter_bytes, s.gradient_bytes, s.optimizer_state_bytes) == tuple(10 * b for b in per_param)


def test_shards_are_padded_to_equal_size_and_fsdp_gathers_two_units_and_one_gradient():
    count = ParameterCount(total=1001, largest_unit=100)
    s = model_states(count, optimizer="adam", precision="bf16-mixed", ranks=4, sharding="fsdp")
    assert (s.parameter_bytes, s.gradient_bytes, s.optimizer_state_bytes) == (251 * 2, 251 * 2, 251 * 12)
    assert s.gathered_bytes == 2 * 100 * 2 + 100 * 2
    assert s.total_bytes == s.persistent_bytes + s.gathered_bytes
    zero2 = model_states(count, ranks=4, sharding="zero2")
    assert zero2.gathered_bytes == 0 and zero2.parameter_bytes == 1001 * 2


def test_builtin_workloads_and_specs_agree():
    hw = get_hardware("a100-80gb-pcie4")
    w = build_model_workload("gpt2-xl", hw)
    assert parameter_count_of(w) == transformer_parameters(MODELS["gpt2-xl"])
    # A custom configuration: its spec travels in the workload's meta.
    spec = model_spec("llama-7b", layers=2)
    w2 = build_model_workload("llama-7b", hw, layers=2)
    assert parameter_count_of(w2).total == transformer_parameters(spec).total == 2 * 202_383_360 + 2 * 131_072_000 + 4096


def test_profiled_workload_meta_counts_parameters_by_block():
    # (block index, count) per parameter, as the profiler passes them: wte, h.0.attn, h.0.mlp, h.1.attn, ln_f.
    meta = parameter_meta([(None, 50), (0, 30), (0, 40), (1, 30), (None, 5)])
    assert meta == {"parameter_count": 155, "largest_unit_parameter_count": 70}  # block 0: 30 + 40
    w = chain(3)
    w = type(w)(name=w.name, ops=w.ops, tensors=w.tensors, meta={**meta})
    assert parameter_count_of(w) == ParameterCount(total=155, largest_unit=70)


def test_errors_name_the_problem():
    with pytest.raises(ValidationError, match="does not record its parameter count"):
        parameter_count_of(chain(3))
    with pytest.raises(UnknownNameError, match="unknown optimizer 'lion'"):
        model_states(10, optimizer="lion")
    with pytest.raises(UnknownNameError, match="unknown precision"):
        model_states(10, precision="fp8")
    with pytest.raises(ValidationError, match="shard count"):
        model_states(10, ranks=0)


def test_public_api_takes_a_model_name():
    import slackswap

    s = slackswap.model_states("llama-7b", optimizer="adam", precision="bf16-mixed", shard=8, sharding="zero3")
    assert s.persistent_bytes == 16 * -(-HF_COUNTS["llama-7b"] // 8)
    assert s.to_dict()["total_bytes"] == s.persistent_bytes + s.gathered_bytes
