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

RESULT = {
    "hardware": "a100-80gb-pcie4",
    "budget_fraction": 0.5,
    "rows": [
        {"model": "bert-large", "policy": "slackswap", "paper_throughput_pct": 96.3, "throughput_pct": 95.12,
         "budget_bytes": 6 * 1024**3, "step_time_s": 0.412},
        {"model": "gpt2-xl", "policy": "slackswap", "paper_throughput_pct": 97.6, "throughput_pct": 98.0,
         "budget_bytes": 20 * 1024**3, "step_time_s": 1.25},
        {"model": "llama-7b <eager>", "policy": "slackswap", "paper_throughput_pct": 99.6, "throughput_pct": 99.1,
         "budget_bytes": 40 * 1024**3, "step_time_s": 3.5},
    ],
    "sensitivity": {"gemm_efficiency": [{"value": 0.5, "throughput_pct": 94.0}, {"value": 0.7, "throughput_pct": 97.0}]},
    "parametrization": {"gemm_efficiency": 0.6, "copy_latency_s": 6e-6, "sources": ["A100 datasheet"]},
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


def test_report_is_self_contained_and_complete(tmp_path):
    pytest.importorskip("matplotlib")
    timelines, workloads, plans = steps()
    path = write_report(tmp_path / "report", RESULT, timelines=timelines, workloads=workloads, plans=plans,
                        sweep_rows=[{"model": "chain4", "policy": "hand", "budget_fraction": 0.5, "throughput_pct": 85.7}])
    assert path == tmp_path / "report" / "index.html"
    page = check_self_contained(path)
    images = [a for t, a in page.tags if t == "img"]
    assert len(images) == 1 + 1 + len(timelines)  # reproduce, sweep, one per step
    cells = page.cells
    for row in RESULT["rows"]:
        assert row["model"] in cells  # escaped on the page, unescaped by the parser
    assert "96.30%" in cells and "6.00 GiB" in cells and "412.00 ms" in cells
    assert "6.0 us" in cells and "gemm_efficiency" in cells  # parametrization
    assert "94.00%" in cells  # sensitivity
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
    assert slug("GPT2-XL slackswap @ 50%") == "gpt2-xl-slackswap-50"
