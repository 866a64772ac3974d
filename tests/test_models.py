"""Built-in models, custom configurations, names, metadata and the ideal peak."""

from __future__ import annotations

import json
import time

import pytest

from slackswap.errors import UnknownNameError, ValidationError
from slackswap.hardware import PRESETS
from slackswap.sim import simulate_ideal
from slackswap.workload import Workload
from slackswap.workloads.models import (
    MODELS, build_model_workload, build_transformer, closed_form_saved_bytes, get_model,
)
from slackswap.workloads.spec import TransformerSpec

HW = PRESETS["a100-80gb-pcie4"]
CUSTOM = dict(layers=2, hidden=96, heads=6, ffn=384, vocab=211, seq_len=24, micro_batch=3)


def test_builtin_configs_are_the_documented_ones():
    shape = {n: (s.layers, s.hidden, s.heads, s.ffn, s.vocab, s.seq_len, s.micro_batch) for n, s in MODELS.items()}
    assert shape == {
        "bert-large": (24, 1024, 16, 4096, 30522, 512, 16),
        "gpt2-xl": (48, 1600, 25, 6400, 50257, 1024, 8),
        "llama-7b": (32, 4096, 32, 11008, 32000, 2048, 4),
        "llama-3-8b": (32, 4096, 32, 14336, 128256, 8192, 1),
        "llama-2-70b": (80, 8192, 64, 28672, 32000, 4096, 1),
    }
    assert {n: s.num_kv_heads for n, s in MODELS.items() if s.num_kv_heads != s.heads} == {
        "llama-3-8b": 8, "llama-2-70b": 8}
    assert {n: (s.tensor_parallel, s.sequence_parallel) for n, s in MODELS.items() if s.is_parallel} == {
        "llama-2-70b": (8, True)}
    assert {n: s.attention for n, s in MODELS.items()} == dict.fromkeys(MODELS, "flash")
    llama = MODELS["llama-7b"]
    assert (llama.mlp, llama.norm, llama.dropout, llama.rope) == ("swiglu", "rmsnorm", False, True)
    bert = MODELS["bert-large"]
    assert (bert.causal, bert.post_norm, bert.dropout) == (False, True, True)


def test_llama_ideal_peak_equals_the_closed_form():
    spec = MODELS["llama-7b"]
    T, h, f, a, V, L = spec.tokens, spec.hidden, spec.ffn, spec.heads, spec.vocab, spec.layers
    per_layer = 16 * T * h + 6 * T * f + 4 * a * T + 2 * 4 * T  # bf16 saves, fp32 LSE, two fp32 rstd
    embedding = 8 * T  # int64 token ids
    head = 2 * T * h + 4 * T + 2 * T * h  # final RMSNorm input and rstd, LM head input
    loss = 2 * T * V + 4 * T * V + 8 * T  # bf16 logits, fp32 log-probabilities, int64 labels
    expected = L * per_layer + embedding + head + loss
    peak = simulate_ideal(build_model_workload("llama-7b", HW), HW).peak_memory_bytes
    assert peak == expected == closed_form_saved_bytes(spec)["total"]
    assert 33 * 2**30 < peak < 34 * 2**30  # 32.2 GiB of layers (reference sec. 6) + 1.5 GiB of logits


def test_gpt2_xl_eager_activations_are_about_67_gib():
    w = build_model_workload("gpt2-xl", HW, attention="eager")
    layers_bytes = 48 * closed_form_saved_bytes(get_model("gpt2-xl").replace(attention="eager"))["per_layer_korthikanti"]
    assert layers_bytes / 2**30 == pytest.approx(66.8, abs=0.1)  # reference sec. 1 and 6
    assert w.saved_bytes > layers_bytes


def test_unknown_model_names_the_choices():
    with pytest.raises(UnknownNameError, match=r"unknown model 'gpt-5': choose one of bert-large, gpt2-xl, llama-7b"):
        get_model("gpt-5")
    with pytest.raises(UnknownNameError, match="unknown model 'bert'"):
        build_model_workload("bert", HW)


def test_custom_model_needs_every_size_flag():
    partial = dict(CUSTOM)
    del partial["seq_len"], partial["heads"]
    with pytest.raises(ValidationError, match=r"model 'custom' needs --heads, --seq-len: give every size flag") as err:
        build_model_workload("custom", HW, **partial)
    assert "\n" not in str(err.value)


def test_custom_model_builds_with_defaults_and_a_name_that_spells_its_config():
    w = build_model_workload("custom", HW, **CUSTOM)
    assert w.name == "custom[layers=2,hidden=96,heads=6,ffn=384,vocab=211,seq_len=24,micro_batch=3]"
    spec = TransformerSpec.from_dict(w.meta["model"])
    assert spec == TransformerSpec(name="custom", **CUSTOM)
    assert w.saved_bytes == closed_form_saved_bytes(spec)["total"]
    eager = build_model_workload("custom", HW, attention="eager", dropout=False, **CUSTOM)
    assert eager.name.endswith(",attention=eager,dropout=false]")


def test_overrides_change_the_config_and_the_name():
    base = build_model_workload("gpt2-xl", HW)
    longer = build_model_workload("gpt2-xl", HW, seq_len=2048, micro_batch=4, attention="eager")
    assert base.name == "gpt2-xl"
    assert longer.name == "gpt2-xl[seq_len=2048,micro_batch=4,attention=eager]"
    assert longer.meta["model"]["seq_len"] == 2048
    assert longer.saved_bytes > base.saved_bytes  # the s^2 probabilities
    assert longer.fingerprint != base.fingerprint
    # an override equal to the default leaves the name alone
    assert build_model_workload("gpt2-xl", HW, layers=48).name == "gpt2-xl"


def test_bad_overrides_are_one_line_errors():
    with pytest.raises(ValidationError, match="unknown model setting 'hiddn'"):
        build_model_workload("llama-7b", HW, hiddn=10)
    with pytest.raises(ValidationError, match=r"hidden \(4096\) must be divisible by heads \(5\)"):
        build_model_workload("llama-7b", HW, heads=5)
    with pytest.raises(ValidationError, match="attention is 'sparse'"):
        build_model_workload("llama-7b", HW, attention="sparse")


def test_meta_records_config_hardware_and_assumptions():
    w = build_model_workload("bert-large", PRESETS["h100-pcie5"])
    assert w.meta["hardware"] == "h100-pcie5"
    assert w.meta["model"] == MODELS["bert-large"].to_dict()
    assert any("not in the activation budget" in line for line in w.meta["assumptions"])
    json.dumps(w.meta)  # reports print it: it must be plain JSON


@pytest.mark.parametrize("name", [*MODELS, "custom"])
def test_json_round_trip(name):
    w = build_model_workload(name, HW, **(CUSTOM if name == "custom" else {}))
    again = Workload.from_dict(w.to_dict())
    assert again == w
    assert Workload.from_json(w.to_json()) == w
    assert again.fingerprint == w.fingerprint
    assert again.meta == w.meta


def test_building_twice_is_bit_for_bit_identical():
    assert build_model_workload("gpt2-xl", HW).to_json() == build_model_workload("gpt2-xl", HW).to_json()


def test_build_transformer_is_reexported_and_names_the_spec():
    w = build_transformer(MODELS["bert-large"], HW)
    assert w.name == "bert-large"


def test_llama_build_time(summary_lines):
    start = time.perf_counter()
    w = build_model_workload("llama-7b", HW)
    elapsed = time.perf_counter() - start
    summary_lines.append(f"building llama-7b ({len(w.ops)} ops, {len(w.saved_tensors)} saved tensors): "
                         f"{elapsed * 1e3:.1f} ms")
    assert len(w.ops) == 32 * 11 + 4  # 11 ops per layer; embed, final norm, LM head, loss
