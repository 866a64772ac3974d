"""benchmarks/gpu_validate.py, dry-run on CPU: the whole script with a tiny model, so the one run on a
GPU does not fail on a typo. These tests check the files' structure and the script's arithmetic,
not the hardware's numbers."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

import slackswap  # noqa: E402
from slackswap.cli import main as cli_main  # noqa: E402
from slackswap.hardware import Hardware, get_hardware  # noqa: E402
from slackswap.units import format_bytes  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_validate.py"
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_validation.compute import datasheet_for  # noqa: E402
from gpu_validation.device import device_slug  # noqa: E402
from gpu_validation.link import CopySample, copy_latency_s  # noqa: E402
from gpu_validation.report import RATIOS, RESULTS_FORMAT, ratios  # noqa: E402

POLICIES = ("slackswap", "capuchin", "swap-only", "full-recompute")
BUDGETS = (0.3, 0.5, 0.8)
PEERS = ("torch.utils.checkpoint per block", "save_on_cpu(pin_memory=False)")


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-validate")
    result = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(out)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = json.loads((out / "gpu-cpu.json").read_text())
    return out, results, (out / "gpu-cpu.md").read_text()


@pytest.mark.slow  # shares one dry run of about 10 s
def test_writes_the_three_files_and_nothing_else(dry_run):
    out, results, _ = dry_run
    assert sorted(p.name for p in out.iterdir()) == ["cpu-measured.json", "gpu-cpu.json", "gpu-cpu.md"]
    assert results["format"] == RESULTS_FORMAT and results["dry_run"] is True
    assert results["device"]["kind"] == "cpu" and results["device"]["memory_statistics"] is False


@pytest.mark.slow  # shares one dry run of about 10 s
def test_every_configuration_has_its_row(dry_run):
    _, results, _ = dry_run
    rows = {r["name"]: r for r in results["rows"]}
    expected = {"plain training", *PEERS}
    expected |= {f"{p} @ {b:g} ({path})" for p in POLICIES for b in BUDGETS for path in ("runtime", "compiled")}
    assert set(rows) == expected and len(results["rows"]) == len(expected)
    for r in results["rows"]:
        assert r["status"] in ("ok", "skipped", "failed"), r
        if r["status"] != "ok":
            assert r["note"], r  # a row that did not run says why
    for name in ("plain training", *PEERS):
        assert rows[name]["status"] == "ok"
    planned = [r for r in results["rows"] if r["group"] == "plan" and r["method"] == "runtime"]
    assert sum(r["status"] == "ok" for r in planned) >= 9
    for r in planned:
        # A plan that exists runs; the only other outcome is a budget the policy cannot reach.
        assert r["status"] == "ok" or (r["note"].startswith("planning: BudgetError") and "predicted" not in r), r
    for r in results["rows"]:
        p = r.get("predicted")
        if p is not None:  # an allocated/reserved prediction, or the reason there is none, on the page
            assert (p["allocated_peak_bytes"] is not None) == (p["reserved_peak_bytes"] is not None)
            assert p["allocated_peak_bytes"] is not None or p["memory_note"] in results["notes"]
    compiled = [r for r in results["rows"] if r["method"] == "compiled"]
    for r in compiled:
        if (r["budget_fraction"], r["policy"]) != (0.5, "slackswap"):
            assert r["status"] == "skipped" and r["note"] == "the dry run compiles slackswap @ 0.5 only"
        elif not hasattr(slackswap, "compile"):
            assert r["status"] == "skipped" and "slackswap.compile" in r["note"]
        else:  # compiled, planned from its own graph, and run
            assert r["status"] == "ok", r
            assert r["predicted"]["graph_ops"] > 0 and r["measured"]["step_time_s"] > 0


@pytest.mark.slow  # shares one dry run of about 10 s
def test_runtime_rows_run_the_plan_exactly(dry_run):
    """On CPU the runtime copies exactly the simulated bytes, never late, with plain training's gradients."""
    _, results, _ = dry_run
    ok = [r for r in results["rows"] if r["group"] == "plan" and r["method"] == "runtime" and r["status"] == "ok"]
    assert any(r["predicted"]["d2h_bytes"] > 0 for r in ok)
    for r in ok:
        m, p = r["measured"], r["predicted"]
        assert m["d2h_bytes"] == p["d2h_bytes"] and m["h2d_bytes"] == p["h2d_bytes"], r["name"]
        assert m["late_prefetches"] == 0
        assert m["manager_peak_saved_bytes"] <= r["budget_bytes"]
        assert m["grads_bit_identical_deterministic"] is True and m["grad_max_abs_diff"] == 0.0
        assert m["step_time_s"] > 0 and m["host_time_s"] > 0 and m["steps"] == results["config"]["steps"]
        # CPU has no allocator statistics: n/a, never a made-up 0.
        assert m["step_peak_bytes"] is None and m["max_reserved_bytes"] is None


@pytest.mark.slow  # shares one dry run of about 10 s
def test_ratios_are_computed_from_the_recorded_numbers(dry_run):
    _, results, md = dry_run
    lines = {}
    for line in md.splitlines():  # each row's first line is in the step-time table
        if " | ok | " in line:
            lines.setdefault(line.split(" | ")[0].lstrip("| "), line)
    checked = 0
    for r in results["rows"]:
        for name, m_key, p_key in RATIOS:
            m, p = (r.get("measured") or {}).get(m_key), (r.get("predicted") or {}).get(p_key)
            if m is None or not p:
                assert r["ratios"][name] is None
                continue
            assert r["ratios"][name] == pytest.approx(m / p, rel=1e-12)
            checked += 1
        if r.get("measured"):
            m = r["measured"]
            assert m["host_per_device"] == pytest.approx(m["host_time_s"] / m["step_time_s"], rel=1e-12)
        if r["ratios"]["step_time"] is not None:
            assert f"| {r['ratios']['step_time']:.3f}x |" in lines[r["name"]]
    assert checked >= 9 * 4  # step time, held peak, D2H, H2D of every plan that ran
    runtime = results["summary"]["runtime"]
    ran = [r for r in results["rows"] if r["method"] == "runtime" and r["status"] == "ok"]
    assert runtime["ran"] == len(ran) and runtime["bit_identical"] == len(ran)
    steps = [r["ratios"]["step_time"] for r in ran]
    assert runtime["step_time"] == {"min": min(steps), "max": max(steps)}
    plain = results["rows"][0]["ratios"]["step_time"]
    assert f"| step time | {plain:.3f}x | {min(steps):.3f}x - {max(steps):.3f}x |" in md


@pytest.mark.slow  # shares one dry run of about 10 s
def test_markdown_figures_carry_units(dry_run):
    _, results, md = dry_run
    text_columns = {"configuration", "status", "method", "field", "direction", "quantity",
                    "bf16 GEMM (batch x m x k x n)"}
    one = (r"(-?\d+(\.\d+)?(e[-+]?\d+)? ?(B|KiB|MiB|GiB|TiB|us|ms|s|GB/s|GFLOP/s|TFLOP/s|%|x|per step|\(abs\)))")
    figure = re.compile(rf"^(n/a|yes|no|{one}|{one} - {one})$")  # a figure, or a range of two
    header, cells = None, 0
    for line in md.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        parts = [c.strip() for c in line.strip("|").split("|")]
        if header is None:
            header = parts
        elif not set(line) <= set("|-"):
            for column, cell in zip(header, parts, strict=True):
                if column not in text_columns:
                    assert figure.match(cell), f"{column!r}: {cell!r} in {line}"
                    cells += 1
    assert cells > 300
    for r in results["rows"]:
        assert md.count(f"| {r['name']} |") >= 3  # step time, memory, copies and gradients


@pytest.mark.slow  # shares one dry run of about 10 s
def test_hardware_file_loads_with_slackswaps_loader_and_the_cli(dry_run, capsys):
    out, results, _ = dry_run
    path = out / "cpu-measured.json"
    hw = Hardware.load(path)
    assert get_hardware(str(path)) == hw and hw.name == "cpu-measured"
    link = results["link"]
    largest = max(link["sizes"], key=lambda s: s["size_bytes"])
    assert hw.h2d_bytes_per_s == largest["h2d_bytes_per_s"] and hw.d2h_bytes_per_s == largest["d2h_bytes_per_s"]
    assert hw.duplex_h2d_factor == min(1.0, link["duplex"]["h2d_factor"])
    assert {k: v for k, v in results["hardware"].items() if k != "file"} == hw.to_dict()
    assert cli_main(["simulate", "--model", "bert-large", "--hardware", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hardware"] == "cpu-measured"


def test_without_cuda_one_line_exit_2_nothing_written(tmp_path, capsys):
    import torch

    import gpu_validate

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert gpu_validate.main(["--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--dry-run" in err and not (tmp_path / "r").exists()


def test_copy_latency_is_the_intercept_of_latency_plus_bytes_over_bandwidth():
    def sample(size, latency_h2d, latency_d2h, rate=10e9):
        return CopySample(size, latency_h2d + size / rate, latency_d2h + size / rate)

    # The largest copy's rate includes its own latency share: the intercept is exact when it is large.
    samples = [sample(64 * 1024, 5e-6, 7e-6), sample(2**40, 0.0, 0.0)]
    assert copy_latency_s(samples) == pytest.approx(6e-6, rel=1e-6)
    assert copy_latency_s([sample(64 * 1024, 0.0, 0.0), sample(2**20, 1e-3, 1e-3)]) == 0.0  # never negative


def test_ratios_slug_and_datasheets():
    r = ratios({"step_time_s": 3.0, "d2h_bytes": 5}, {"step_time_s": 2.0, "d2h_bytes": 0})
    assert r["step_time"] == 1.5 and r["d2h_bytes"] is None and r["reserved_peak"] is None
    assert device_slug("NVIDIA H100 80GB HBM3") == "h100-80gb-hbm3" and device_slug("cpu") == "cpu"
    assert datasheet_for("NVIDIA H100 PCIe")[0] == 756e12 and datasheet_for("NVIDIA H100 80GB HBM3")[0] == 989e12
    assert datasheet_for("NVIDIA H200")[1] == 4800e9 and datasheet_for("some new GPU") is None


def test_micro_batch_is_the_largest_power_of_two_that_fits_a_quarter_of_free_memory():
    import gpu_validate

    GiB = 2**30
    assert gpu_validate.micro_batch_for(3 * GiB, 141 * 10**9) == 8  # 8 x 3 GiB = 25.8 GB <= 35.25 GB
    assert gpu_validate.micro_batch_for(5 * GiB, 141 * 10**9) == 4  # 8 x 5 GiB = 42.9 GB > 35.25 GB
    assert gpu_validate.micro_batch_for(10 * GiB, 80 * 10**9) == 1  # 2 x 10 GiB = 21.5 GB > 20 GB
    assert gpu_validate.micro_batch_for(100 * GiB, 80 * 10**9) == 1  # never 0
    assert gpu_validate.micro_batch_for(1, 10**15) == gpu_validate.MAX_MICRO_BATCH


def test_budget_half_runs_first():
    import gpu_validate

    order = gpu_validate.by_priority((0.3, 0.5, 0.8), ("a", "b"))
    assert order == [(0.5, "a"), (0.5, "b"), (0.3, "a"), (0.3, "b"), (0.8, "a"), (0.8, "b")]


@pytest.mark.slow  # a second, shorter dry run
def test_past_the_time_limit_rows_are_skipped_and_the_files_still_complete(tmp_path):
    argv = ["--dry-run", "--out", str(tmp_path), "--time-limit-s", "0", "--policies", "slackswap", "--budgets", "0.5"]
    result = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = json.loads((tmp_path / "gpu-cpu.json").read_text())
    rows = {r["name"]: r for r in results["rows"]}
    assert set(rows) == {"plain training", *PEERS, "slackswap @ 0.5 (runtime)", "slackswap @ 0.5 (compiled)"}
    for name in ("slackswap @ 0.5 (runtime)", *PEERS):
        assert rows[name]["status"] == "skipped" and rows[name]["note"] == "time limit (0 s) reached"
    assert rows["plain training"]["status"] == "ok" and results["profile"]["ops"] > 0
    assert Hardware.load(tmp_path / "cpu-measured.json").name == "cpu-measured"


class FakeTrackingDevice:
    """A CPU device that reports allocator figures (fixed numbers), to run the GPU-only branches."""

    kind, name, slug, pinned_host, tracks_memory = "fake", "fake", "fake", False, True

    def __init__(self):
        import torch

        self.torch_device = torch.device("cpu")
        self.resets = 0

    def mark(self, stream=None):
        return time.perf_counter()

    def elapsed_s(self, start, end):
        return end - start

    def synchronize(self):
        pass

    def allocated_bytes(self):
        return 1000

    def max_allocated_bytes(self):
        return 1000 + 300 * self.resets

    def max_reserved_bytes(self):
        return 4096

    def reset_peak(self):
        self.resets += 1

    def release_cached(self):
        pass


@pytest.mark.slow  # uses the shared dry run
def test_memory_figures_flow_from_the_device_into_the_rows_and_the_page(dry_run):
    import torch

    from gpu_validation.report import render_markdown, summarize
    from gpu_validation.training import Method, Trainer
    from slackswap.examples import TINY, loss_fn, make_batch, make_example

    model, batch = make_example("gpt2", TINY), make_batch(TINY)
    device = FakeTrackingDevice()
    measured = Trainer(device, model).measure(Method("plain", lambda: loss_fn(model, batch)), warmup=1, steps=2,
                                              is_reference=True).to_dict()
    # Step k (1-based, resets counted) peaks at 1000 + 300 k: the timed steps are the 2nd and 3rd.
    assert measured["step_peak_bytes"] == 900 and measured["max_allocated_bytes"] == 1900
    assert measured["max_reserved_bytes"] == 4096 and torch.is_grad_enabled()

    _, results, _ = dry_run
    results = json.loads(json.dumps(results))
    for r in results["rows"]:  # give every row that ran GPU-like memory figures, then recompute as save() does
        if r["status"] == "ok":
            r["measured"].update(step_peak_bytes=2 * 2**20, max_allocated_bytes=3 * 2**20, max_reserved_bytes=4 * 2**20)
        r["ratios"] = ratios(r.get("measured"), r.get("predicted"))
    results["summary"] = summarize(results["rows"])
    md = render_markdown(results)
    plain = results["rows"][0]
    expected = 3 * 2**20 / plain["predicted"]["allocated_peak_bytes"]
    assert plain["ratios"]["allocated_peak"] == pytest.approx(expected, rel=1e-12)
    assert f"| 3.00 MiB | {format_bytes(plain['predicted']['allocated_peak_bytes'])} | {expected:.3f}x |" in md
    assert results["summary"]["runtime"]["reserved_peak"] is not None
