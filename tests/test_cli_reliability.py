"""Command-line defects of issue 15: each test reproduces one probe that failed."""

from __future__ import annotations

import json

import pytest

from slackswap.cli import main
from slackswap.plans import Plan
from slackswap.workload import Op, Tensor, Workload


@pytest.fixture
def nothing_saved(tmp_path):
    """One op whose output no backward reads: the unconstrained activation peak is 0 bytes."""
    w = Workload(name="nothing-saved", ops=(
        Op(name="a", layer=0, kind="gemm", fwd_time_s=1e-3, bwd_time_s=2e-3, flops=1e9, bytes_accessed=1e6,
           inputs=("x",), outputs=("y",)),
    ), tensors=(Tensor(name="x", size_bytes=1024, producer=None), Tensor(name="y", size_bytes=1024, producer="a")))
    path = tmp_path / "w.json"
    w.save(path)
    return path


def test_a_workload_that_saves_nothing_plans_and_simulates(nothing_saved, tmp_path, capsys):
    plan_file, trace, timeline = tmp_path / "p.json", tmp_path / "t.json", tmp_path / "tl.json"
    assert main(["plan", "--workload", str(nothing_saved), "--budget", "0.5", "--out", str(plan_file)]) == 0
    assert "nothing to plan" in capsys.readouterr().out
    assert Plan.load(plan_file).actions == {}
    assert main(["simulate", "--workload", str(nothing_saved), "--policy", "slackswap", "--budget", "0.5",
                 "--trace", str(trace), "--timeline", str(timeline)]) == 0
    out = capsys.readouterr().out
    assert "nothing to plan" in out and "100.00% of ideal" in out
    assert json.loads(timeline.read_text())["peak_memory_bytes"] == 0


# ---- outputs: together or not at all, symlinks, special files, long names (defects 5, 6, 7, 14) ----
def fails_on_disk_full(monkeypatch, suffix: str):
    """Make the temporary file of the output ending in ``suffix`` a /dev/full descriptor: its write
    fails with ENOSPC, as on a full disk."""
    import os

    from slackswap import _outputs

    real_mkstemp = _outputs.tempfile.mkstemp

    def mkstemp(**kwargs):
        fd, path = real_mkstemp(**kwargs)
        if any(str(p).endswith(suffix) for p in fails_on_disk_full.targets):
            os.close(fd)
            fd = os.open("/dev/full", os.O_WRONLY)
        return fd, path

    real_stage = _outputs._stage

    def stage(path, data):
        fails_on_disk_full.targets = [path]
        return real_stage(path, data)

    monkeypatch.setattr(_outputs.tempfile, "mkstemp", mkstemp)
    monkeypatch.setattr(_outputs, "_stage", stage)


@pytest.mark.parametrize("plot", ["step.svg", "step.pdf"])
def test_a_plot_that_cannot_be_written_leaves_no_output_and_the_old_files(nothing_saved, tmp_path, capsys,
                                                                          monkeypatch, plot):
    pytest.importorskip("matplotlib")
    timeline, trace, figure = tmp_path / "tl.json", tmp_path / "t.json", tmp_path / plot
    figure.write_bytes(b"old plot")
    fails_on_disk_full(monkeypatch, plot)
    code = main(["simulate", "--workload", str(nothing_saved), "--timeline", str(timeline), "--trace", str(trace),
                 "--plot", str(figure)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "No space left on device" in err
    assert not timeline.exists() and not trace.exists()
    assert figure.read_bytes() == b"old plot"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["w.json", plot])  # no temporary file left


def test_a_symlinked_output_is_written_through_and_stays_a_link(nothing_saved, tmp_path):
    real, link = tmp_path / "real.json", tmp_path / "link.json"
    real.write_text("old")
    link.symlink_to(real.name)
    assert main(["export-workload", "--workload", str(nothing_saved), "--out", str(link), "--quiet"]) == 0
    assert link.is_symlink()
    assert Workload.load(real).name == "nothing-saved"


@pytest.mark.parametrize("make,fragment", [
    (lambda p: __import__("os").mkfifo(p), "not a regular file"),
    (lambda p: None, "under /dev"),
])
def test_special_files_are_refused(nothing_saved, tmp_path, capsys, make, fragment):
    target = tmp_path / "fifo.json"
    make(target)
    out = str(target) if target.exists() else "/dev/stdout"
    code = main(["export-workload", "--workload", str(nothing_saved), "--out", out, "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and err.count("\n") == 1


@pytest.mark.parametrize("name,ok", [("a" * 245 + ".json", True), ("a" * 300 + ".json", False),
                                     ("d/" * 2500 + "x.json", False), ("newname/", False)])
def test_long_names_and_a_trailing_slash(nothing_saved, tmp_path, capsys, name, ok):
    out = tmp_path / name if not name.endswith("/") else str(tmp_path / name.rstrip("/")) + "/"
    code = main(["export-workload", "--workload", str(nothing_saved), "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert (code == 0) == ok
    if ok:
        assert Workload.load(out).name == "nothing-saved"
    else:
        assert code == 2 and err.count("\n") == 1
        assert sorted(p.name for p in tmp_path.iterdir()) == ["w.json"]


def test_a_non_utf8_output_name_is_written_and_printed(nothing_saved, tmp_path, capsys):
    import os

    out = os.fsdecode(os.fsencode(str(tmp_path)) + b"/caf\xe9.json")
    assert main(["plan", "--workload", str(nothing_saved), "--budget", "0.5", "--out", out]) == 0
    assert "caf" in capsys.readouterr().out
    assert os.path.exists(out)


def test_a_failed_command_removes_the_directories_it_created(tmp_path):
    from slackswap._outputs import make_output_directory, outputs_together, write_text_atomic

    with pytest.raises(RuntimeError):
        with outputs_together():
            make_output_directory(tmp_path / "a" / "b")
            write_text_atomic(tmp_path / "a" / "b" / "f.txt", "x")
            raise RuntimeError("later step failed")
    assert list(tmp_path.iterdir()) == []


def test_a_report_directory_whose_index_is_a_directory_is_refused_at_once(tmp_path, capsys):
    (tmp_path / "r" / "index.html").mkdir(parents=True)
    assert main(["reproduce", "--report", str(tmp_path / "r")]) == 2
    assert "index.html" in capsys.readouterr().err


def test_simulate_refuses_a_budget_without_a_policy_as_plan_does(nothing_saved, capsys):
    assert main(["simulate", "--workload", str(nothing_saved), "--budget", "2"]) == 2
    assert "--budget '2' needs --policy or --plan" in capsys.readouterr().err


def test_an_error_after_a_text_progress_bar_is_one_line(monkeypatch):
    import io

    from slackswap.report import console

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(console, "_rich", lambda: None)
    stream = Terminal()
    with pytest.raises(ValueError):
        with console.progress_reporter("plan", stream=stream) as report:
            report(1, 4, "working")
            raise ValueError("boom")
    assert "\n" not in stream.getvalue()


# ---- inputs: size cap, profile files (defects 8, 9, 10) ----------------------------------------
def test_reading_dev_zero_is_capped(capsys):
    assert main(["simulate", "--workload", "/dev/zero"]) == 2
    assert "larger than 256 MiB" in capsys.readouterr().err


@pytest.mark.parametrize("name,text,fragment", [
    ("m.txt", "x = 1\n", "must be a Python file ending in .py"),
    ("twolines.py", "raise ImportError('line one\\nline two')\n", "ImportError: line one"),
    ("exits.py", "import sys\ndef make_model(): sys.exit(0)\ndef make_batch(): pass\ndef loss_fn(m, b): pass\n",
     "called sys.exit(0)"),
])
def test_profile_file_problems_are_one_line(tmp_path, capsys, name, text, fragment):
    pytest.importorskip("torch")
    source = tmp_path / name
    source.write_text(text)
    assert main(["profile", str(source), "--out", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1
    assert not (tmp_path / "o.json").exists()


def test_profile_refuses_absurd_repeats(tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["profile", str(tmp_path / "m.py"), "--out", str(tmp_path / "o.json"), "--repeats", "100000000"])
    assert exit_info.value.code == 2
