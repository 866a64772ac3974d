"""The `slackswap profile` command and examples/train.py, end to end on CPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from slackswap import Workload  # noqa: E402
from slackswap.cli import main  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_profile_command_writes_a_workload(tmp_path, capsys):
    out = tmp_path / "w.json"
    assert main(["profile", str(ROOT / "examples" / "tiny_gpt.py"), "--out", str(out), "--repeats", "1"]) == 0
    workload = Workload.load(out)
    assert workload.name.startswith("GPT2Like-") and workload.saved_bytes > 0
    assert "saved" in capsys.readouterr().out


@pytest.mark.parametrize("missing", ["make_model", "make_batch", "loss_fn"])
def test_profile_command_names_a_missing_function_in_one_line(tmp_path, capsys, missing):
    source = (ROOT / "examples" / "tiny_gpt.py").read_text()
    bad = tmp_path / "bad.py"
    bad.write_text(source.replace(f"def {missing}(", f"def not_{missing}(") if missing != "loss_fn"
                   else source.replace("loss_fn, make_batch as", "make_batch as").replace('"loss_fn"', '"x"'))
    code = main(["profile", str(bad), "--out", str(tmp_path / "w.json")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and f"does not define {missing}()" in err
    assert not (tmp_path / "w.json").exists()


def test_train_example_matches_unmodified_training():
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "train.py"), "--model", "llama", "--steps", "2",
         "--layers", "1", "--hidden", "32", "--seq-len", "16"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "max |loss - unmodified loss|: 0" in result.stdout


@pytest.mark.slow
def test_hf_trainer_example_trains_as_the_plain_trainer(tmp_path, capsys):
    """examples/hf_trainer.py: the Hugging Face Trainer under slackswap.auto (two padded lengths)
    ends with the plain Trainer's losses and weights, bit for bit; a second run reads the plans
    from cache_dir instead of profiling."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    import runpy

    import torch

    example = runpy.run_path(str(ROOT / "examples" / "hf_trainer.py"))
    planned = example["main"](["--steps", "4", "--cache-dir", str(tmp_path)])
    stats = planned.plans.stats
    assert stats.steps == 4 and stats.profiles == 2 and stats.disk_hits == 0  # lengths 12 and 8
    plain = example["main"](["--steps", "4", "--plain"])
    assert [e["loss"] for e in planned.state.log_history if "loss" in e] == \
        [e["loss"] for e in plain.state.log_history if "loss" in e]
    for a, b in zip(planned.model.parameters(), plain.model.parameters()):
        assert torch.equal(a, b)
    again = example["main"](["--steps", "4", "--cache-dir", str(tmp_path)])
    assert again.plans.stats.profiles == 0 and again.plans.stats.disk_hits == 2
    assert "2 shapes profiled and planned" in capsys.readouterr().out
