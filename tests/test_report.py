"""The HTML report: self-contained (no URL of any kind, every image inline) and complete."""

from __future__ import annotations

import base64
import json
import sys
from html.parser import HTMLParser

import pytest

from slackswap.errors import ValidationError
from slackswap.hardware import Hardware
from slackswap.plans import Action
from slackswap.report.html_report import format_cell, slug, write_report
from slackswap.schedule import make_plan
from slackswap.sim import simulate, simulate_ideal
from slackswap.workloads.synthetic import chain
from test_trace import check_trace_format

def policy(pct, **extra):
    return {"fits": pct is not None, "throughput_pct": pct, **extra}


# The shape of slackswap.experiments.reproduce.run_reproduce's result, with made-up numbers.
RESULT = {
    "rows": [
        {"model": "bert-large", "paper_pct": 96.3, "budget_fraction": 0.5, "budget_bytes": 4 * 1024**3,
         "unconstrained_peak_bytes": 8 * 1024**3, "minimum_budget_bytes": 1024**3, "ideal_step_time_s": 0.116,
         "hardware": "test-link", "workload": "bert-large", "config": {"name": "bert-large", "layers": 24},
         "policies": {"full-recompute": policy(77.5), "slackswap": policy(93.13), "swap-only": policy(None, note="no")},
         "difference_pts": -3.17, "explanation": "-3.2 points from the paper: the link moves too little"},
        {"model": "gpt2-xl", "paper_pct": 97.6, "budget_fraction": 0.5, "budget_bytes": 11 * 1024**3,
         "unconstrained_peak_bytes": 22 * 1024**3, "minimum_budget_bytes": 2 * 1024**3, "ideal_step_time_s": 0.489,
         "hardware": "test-link", "workload": "gpt2-xl", "config": {"name": "gpt2-xl", "layers": 48},
         "policies": {"full-recompute": policy(76.3), "slackswap": policy(97.31), "swap-only": policy(48.1)},
         "difference_pts": -0.29, "explanation": ""},
        {"model": "llama-7b <eager>", "paper_pct": 99.6, "budget_fraction": 0.5, "budget_bytes": 16 * 1024**3,
         "unconstrained_peak_bytes": 32 * 1024**3, "minimum_budget_bytes": 1024**3, "ideal_step_time_s": 1.93,
         "hardware": "test-link", "workload": "llama-7b", "config": {"name": "llama-7b", "layers": 32},
         "policies": {"full-recompute": policy(79.6), "slackswap": policy(99.81), "swap-only": policy(94.0)},
         "difference_pts": 0.21, "explanation": ""},
    ],
    "sensitivity": [
        {"model": "bert-large", "variant": "gemm efficiency 0.5", "policy": "slackswap", "throughput_pct": 94.0},
        {"model": "bert-large", "variant": "gemm efficiency 0.7", "policy": "slackswap", "throughput_pct": 97.0},
    ],
    "parametrization": {"hardware": None, "budget_fraction": 0.5, "tolerance_pts": 2.0,
                        "paper": "SlackSwap, arXiv 2610.13003"},
}


class Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.cells: list[str] = []
        self._in_cell = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in_cell = tag in ("td", "th")

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self._in_cell = False

    def handle_data(self, data):
        if self._in_cell:
            self.cells.append(data)


def parse(path) -> Page:
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def link(bytes_per_s: float) -> Hardware:
    return Hardware(
        name="test-link", peak_flops_per_s=1e12, gemm_efficiency=1.0, attention_efficiency=1.0,
        hbm_bytes_per_s=1e12, hbm_efficiency=1.0, hbm_capacity_bytes=10**12,
        d2h_bytes_per_s=bytes_per_s, h2d_bytes_per_s=bytes_per_s, copy_latency_s=0.0,
    )


def steps():
    w, hw = chain(4), link(100.0)
    plan = make_plan(w, {"a0": Action.SWAP, "a1": Action.RECOMPUTE}, policy="hand", budget_bytes=250, hardware=hw)
    return {"chain4 hand 250 B": simulate(w, hw, plan), "chain4 ideal": simulate_ideal(w, hw)}, {"chain4 hand 250 B": w}, \
        {"chain4 hand 250 B": plan}


def check_self_contained(path) -> Page:
    text = path.read_text(encoding="utf-8")
    assert "http://" not in text and "https://" not in text
    page = parse(path)
    for tag, attrs in page.tags:
        assert tag not in ("script", "link", "iframe", "object", "embed"), tag
        for key in ("src", "href"):
            value = attrs.get(key)
            if value is None:
                continue
            assert "://" not in value and not value.startswith("//"), value
            if tag == "img":
                assert value.startswith("data:image/png;base64,")
                assert base64.b64decode(value.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
            else:
                assert (path.parent / value).is_file(), value
    return page


def result_with_hardware():
    from slackswap.hardware import PRESETS

    return {**RESULT, "parametrization": {**RESULT["parametrization"], "hardware": PRESETS["a100-80gb-pcie4"].to_dict()}}


def test_report_is_self_contained_and_complete(tmp_path):
    pytest.importorskip("matplotlib")
    timelines, workloads, plans = steps()
    path = write_report(tmp_path / "report", result_with_hardware(), timelines=timelines, workloads=workloads, plans=plans,
                        sweep_rows=[{"model": "chain4", "policy": "hand", "budget_fraction": 0.5, "throughput_pct": 85.7}])
    assert path == tmp_path / "report" / "index.html"
    page = check_self_contained(path)
    images = [a for t, a in page.tags if t == "img"]
    assert len(images) == 1 + 1 + len(timelines)  # reproduce, sweep, one per step
    cells = page.cells
    for row in RESULT["rows"]:
        assert cells.count(row["model"]) >= 2  # main table and the every-policy table; escaped on the page
    assert "llama-7b &lt;eager&gt;" in path.read_text()
    assert ["bert-large", "96.30%", "93.13%", "-3.17 pts", "4.00 GiB", "8.00 GiB", "1.00 GiB", "116.00 ms"] == \
        cells[cells.index("bert-large"):cells.index("bert-large") + 8]
    every_policy = cells[cells.index("full-recompute"):]
    assert every_policy[:3] == ["full-recompute", "slackswap", "swap-only"]
    assert every_policy[3:7] == ["bert-large", "77.50%", "93.13%", "does not fit"]
    assert "the link moves too little" in path.read_text()  # the explanation of the difference
    assert "24.0 GB/s" in cells and "312.0 TFLOP/s" in cells and "6.0 us" in cells and "+2.00 pts" in cells  # parametrization
    assert "gemm efficiency 0.7" in cells and "97.00%" in cells  # sensitivity
    traces = sorted(p.name for p in (tmp_path / "report").glob("trace-*.json"))
    assert traces == ["trace-chain4-hand-250-b.json", "trace-chain4-ideal.json"]
    for name in traces:
        check_trace_format(json.loads((tmp_path / "report" / name).read_text()))
    hrefs = sorted(a["href"] for t, a in page.tags if t == "a")
    assert hrefs == traces


def test_report_is_deterministic(tmp_path):
    pytest.importorskip("matplotlib")
    timelines, workloads, plans = steps()
    a = write_report(tmp_path / "a", RESULT, timelines=timelines, workloads=workloads, plans=plans)
    b = write_report(tmp_path / "b", RESULT, timelines=timelines, workloads=workloads, plans=plans)
    assert a.read_bytes() == b.read_bytes()


def test_report_without_matplotlib_still_has_every_table(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    timelines, _, _ = steps()
    path = write_report(tmp_path, RESULT, timelines=timelines)
    page = check_self_contained(path)
    assert not [t for t, _ in page.tags if t == "img"]
    text = path.read_text()
    assert text.count("Figure left out") == 1 + len(timelines) and "slackswap[plot]" in text
    assert "gpt2-xl" in page.cells


def test_labels_that_collide_on_disk_are_refused(tmp_path):
    timelines, _, _ = steps()
    same = next(iter(timelines.values()))
    with pytest.raises(ValidationError, match="distinct labels"):
        write_report(tmp_path, RESULT, timelines={"a b": same, "a-b": same})


def test_cell_units_and_slugs():
    assert format_cell("peak_memory_bytes", 3 * 1024**2) == "3.00 MiB"
    assert format_cell("step_time_s", 0.0125) == "12.50 ms"
    assert format_cell("budget_fraction", 0.5) == "50%"
    assert format_cell("throughput_pct", 99.126) == "99.13%"
    assert format_cell("note", None) == "-" and format_cell("x", [1, 2]) == "[1, 2]"
    assert format_cell("d2h_bytes_per_s", 24e9) == "24.0 GB/s" and format_cell("peak_flops_per_s", 312e12) == "312.0 TFLOP/s"
    assert format_cell("difference_pts", -0.288) == "-0.29 pts" and format_cell("sources", ["a", "b"]) == "a; b"
    assert slug("GPT2-XL slackswap @ 50%") == "gpt2-xl-slackswap-50"


def test_reproduce_steps_rebuild_the_rows_exactly(tmp_path):
    from slackswap.experiments.reproduce import run_reproduce
    from slackswap.report.steps import reproduce_steps

    result = run_reproduce(models=("bert-large",), policies=("full-recompute", "slackswap"), sensitivity=False)
    timelines, workloads, plans = reproduce_steps(result)
    assert list(timelines) == ["bert-large slackswap"]
    timeline = timelines["bert-large slackswap"]
    row = result["rows"][0]
    assert timeline.throughput_pct == row["policies"]["slackswap"]["throughput_pct"]
    assert timeline.budget_bytes == row["budget_bytes"] and plans["bert-large slackswap"].policy == "slackswap"
    assert workloads["bert-large slackswap"].name == row["workload"]


# ---- the CLI ------------------------------------------------------------------------------------
@pytest.fixture
def fast_reproduce(monkeypatch):
    """reproduce over every policy and model takes minutes; the wiring is the same on one model."""
    from slackswap.cli import reproduce_cmd
    from slackswap.experiments.reproduce import run_reproduce

    def one_model(**kwargs):
        return run_reproduce(models=("bert-large",), policies=("full-recompute", "slackswap"),
                             sensitivity=False, progress=kwargs.get("progress"))

    monkeypatch.setattr(reproduce_cmd, "run_reproduce", one_model)


def test_reproduce_report_and_plot_flags(tmp_path, capsys, fast_reproduce):
    pytest.importorskip("matplotlib")
    from slackswap.cli import main

    code = main(["reproduce", "--report", str(tmp_path / "rep"), "--plot", str(tmp_path / "bars.png"), "--quiet"])
    assert code == 0 and capsys.readouterr() == ("", "")
    assert (tmp_path / "bars.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = check_self_contained(tmp_path / "rep" / "index.html")
    assert len([t for t, _ in page.tags if t == "img"]) == 2  # the bars and bert-large's step
    assert "bert-large" in page.cells
    check_trace_format(json.loads((tmp_path / "rep" / "trace-bert-large-slackswap.json").read_text()))


def test_reproduce_report_without_matplotlib(tmp_path, capsys, monkeypatch, fast_reproduce):
    from slackswap.cli import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["reproduce", "--report", str(tmp_path / "rep"), "--quiet"]) == 0
    text = (tmp_path / "rep" / "index.html").read_text()
    assert "<img" not in text and "slackswap[plot]" in text
    assert main(["reproduce", "--plot", str(tmp_path / "bars.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'slackswap[plot]'" in err


def test_report_directory_that_cannot_be_made_is_refused(tmp_path):
    from slackswap.errors import OutputPathError

    (tmp_path / "a_file").write_text("keep me\n")
    for target, fragment in ((tmp_path / "a_file", "is a file"), (tmp_path / "a_file" / "rep", "is a file")):
        with pytest.raises(OutputPathError, match=fragment):
            write_report(target, RESULT)
    assert (tmp_path / "a_file").read_text() == "keep me\n"
    write_report(tmp_path / "new" / "nested", RESULT)  # missing parents are created
    assert (tmp_path / "new" / "nested" / "index.html").is_file()
