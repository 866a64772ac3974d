"""The model-family registry: a family is one module plus one line in FAMILIES, and a registered
family is built, planned and simulated by the API and the CLI like the built-in transformers."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import pytest

import slackswap
from slackswap.cli import main
from slackswap.errors import UnknownNameError, ValidationError
from slackswap.hardware import get_hardware
from slackswap.plans import Action, Plan
from slackswap.workload import Workload
from slackswap.workloads.families import FAMILIES, family_of, model_names
from slackswap.workloads.family import ModelFamily
from slackswap.workloads.models import MODELS, build_model_workload, model_spec
from slackswap.workloads.synthetic import chain


@dataclass(frozen=True, slots=True, kw_only=True)
class ChainSpec:
    """A line of ``layers`` ops, each saving ``size_bytes`` for the next op's backward."""
    name: str
    layers: int = 4
    size_bytes: int = 100

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def build_chain(spec: ChainSpec, hardware, *, name: str, meta: dict) -> Workload:
    # 1 ms forward and 2 ms backward per op on any hardware: the test needs sizes, not times.
    ops = chain(spec.layers, size_bytes=spec.size_bytes, fwd_time_s=1e-3, bwd_time_s=2e-3)
    return Workload(name=name, ops=ops.ops, tensors=ops.tensors, meta=meta)


CHAIN = ModelFamily(
    name="chain", spec_type=ChainSpec, models={"tiny-chain": ChainSpec(name="tiny-chain")},
    sources={"tiny-chain": "a test's own chain"}, build=build_chain,
    assumptions=lambda spec: [f"{spec.layers} ops in a line"],
)


@pytest.fixture
def chain_family(monkeypatch):
    monkeypatch.setitem(FAMILIES, "chain", CHAIN)  # the one registry line, for this test only


def saved_bytes(layers: int, size_bytes: int) -> int:
    # chain(): the 1-byte step input and the outputs of every op but the last are saved.
    return 1 + (layers - 1) * size_bytes


def test_every_built_in_model_belongs_to_one_family():
    assert list(FAMILIES) == ["transformer"]
    assert model_names() == list(MODELS)
    for name in MODELS:
        assert family_of(name) is FAMILIES["transformer"]
    assert family_of("custom") is FAMILIES["transformer"]


def test_a_registered_family_builds_through_build_model_workload(chain_family):
    hw = get_hardware("a100-80gb-pcie4")
    w = build_model_workload("tiny-chain", hw)
    assert w.name == "tiny-chain"
    assert w.saved_bytes == saved_bytes(4, 100)
    assert w.meta == {"kind": "chain", "model": {"name": "tiny-chain", "layers": 4, "size_bytes": 100},
                      "hardware": "a100-80gb-pcie4", "assumptions": ["4 ops in a line"],
                      "source": "a test's own chain"}
    longer = build_model_workload("tiny-chain", hw, layers=6, size_bytes=50)
    assert longer.name == "tiny-chain[layers=6,size_bytes=50]"  # the label names every changed setting
    assert longer.saved_bytes == saved_bytes(6, 50)
    assert longer.fingerprint != w.fingerprint
    with pytest.raises(ValidationError, match="unknown model setting 'hidden': use one of layers, size_bytes"):
        model_spec("tiny-chain", hidden=64)
    # The transformers are untouched by the new family.
    assert build_model_workload("gpt2-xl", hw, layers=2).name == "gpt2-xl[layers=2]"


def test_an_unregistered_family_is_an_unknown_model():
    with pytest.raises(UnknownNameError, match="unknown model 'tiny-chain': choose one of bert-large"):
        build_model_workload("tiny-chain", get_hardware("a100-80gb-pcie4"))


def test_the_api_and_the_cli_plan_a_registered_family_alike(chain_family, tmp_path, capsys):
    out = tmp_path / "cli.json"
    assert main(["plan", "--model", "tiny-chain", "--budget", "0.7", "--out", str(out), "--quiet"]) == 0
    plan = slackswap.plan("tiny-chain", budget=0.7)
    plan.save(tmp_path / "api.json")
    assert out.read_bytes() == (tmp_path / "api.json").read_bytes()
    # 0.7 of the 301 saved bytes (the ideal peak): one of the three 100-byte outputs must leave.
    assert saved_bytes(4, 100) - 100 <= plan.budget_bytes <= 0.7 * saved_bytes(4, 100)
    assert plan.count(Action.KEEP) <= 3  # the step input and at most two outputs stay
    timeline = slackswap.simulate("tiny-chain", plan=Plan.load(out))
    assert timeline.peak_memory_bytes <= plan.budget_bytes
    # A CLI size flag reaches the family when its configuration has that field ...
    assert main(["simulate", "--model", "tiny-chain", "--layers", "6", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["workload"] == "tiny-chain[layers=6]"
    # ... and one it does not have is one line and exit 2.
    assert main(["plan", "--model", "tiny-chain", "--hidden", "8", "--budget", "0.7",
                 "--out", str(tmp_path / "no.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "slackswap: error: unknown model setting 'hidden': use one of layers, size_bytes"
    assert not (tmp_path / "no.json").exists()


def test_models_lists_a_registered_family(chain_family, capsys):
    assert main(["models", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["tiny-chain"] == {"name": "tiny-chain", "layers": 4, "size_bytes": 100}
    assert list(listed)[:len(MODELS)] == list(MODELS)


def test_two_families_claiming_one_name_are_refused(monkeypatch):
    clash = dataclasses.replace(CHAIN, name="clash", models={"gpt2-xl": ChainSpec(name="gpt2-xl")})
    monkeypatch.setitem(FAMILIES, "clash", clash)
    with pytest.raises(ValidationError, match="'gpt2-xl' is claimed by the families transformer, clash"):
        build_model_workload("gpt2-xl", get_hardware("a100-80gb-pcie4"))


def test_a_family_checks_its_built_in_models():
    with pytest.raises(ValidationError, match="built-in 'a' must be a ChainSpec named 'a'"):
        dataclasses.replace(CHAIN, models={"a": ChainSpec(name="b")})
    with pytest.raises(ValidationError, match="spec_type must be a dataclass with a name field"):
        dataclasses.replace(CHAIN, spec_type=dict, models={})


def test_fit_refuses_a_family_without_a_batch_layout_in_one_line(chain_family, capsys):
    # ChainSpec has neither micro-batch nor sequence length: fit has no grid to walk for it.
    with pytest.raises(ValidationError, match="'tiny-chain' \\(ChainSpec\\) lacks micro_batch, seq_len"):
        slackswap.fit("tiny-chain", hardware="a100-80gb-pcie4", gpu_memory="80GiB")
    assert main(["fit", "--model", "tiny-chain", "--hardware", "a100-80gb-pcie4", "--gpu-memory", "80GiB"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "use plan or simulate for it" in err
