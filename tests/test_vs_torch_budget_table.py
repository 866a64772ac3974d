"""benchmarks/vs_torch_budget.py's committed table: a compiled-only run of the larger model adds its own
section and leaves the other models' rows as they are; a run of the other models keeps that section."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "vs_torch_budget.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("vs_torch_budget", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(bench, model: str, held: int) -> dict:
    row = {"model": model, "budget": 0.4, "torch_held": held, "torch_flops": 100, "compiled_keep_flops": 80,
           "torch_throughput": 90.0}
    for policy in (*bench.COMPILED_POLICIES, bench.AT_PEAK):
        row[f"compiled {policy}"] = [held, 90, 95.0]
    row[f"compiled {bench.compiled_path.MIXED}"] = [held, 90, 95.0, 4096]  # swaps 4 KiB
    return row


def _committed(bench) -> str:
    return (f"# table\n\neager rows\n\n{bench.COMPILED_HEADING}\n\nold compiled rows\n\n"
            f"{bench.SUMMARY_HEADING}, and the least slackswap can hold:\n\nsummary rows\n")


def test_larger_model_rows_go_to_their_own_section_and_replace_only_it(bench):
    once = bench._splice_compiled(_committed(bench), [_row(bench, bench.LARGER, 10 * 1024)])
    assert "old compiled rows" in once and "eager rows" in once and once.endswith("summary rows\n")
    assert once.index(bench.COMPILED_HEADING) < once.index(bench.LARGER_HEADING) < once.index(bench.SUMMARY_HEADING)
    assert f"| {bench.LARGER} | 0.4 | 10.0 KiB |" in once
    assert "swap a tensor in 1 of the 1 cells" in once
    twice = bench._splice_compiled(once, [_row(bench, bench.LARGER, 20 * 1024)])
    assert twice.count(bench.LARGER_HEADING) == 1 and "old compiled rows" in twice
    assert f"| {bench.LARGER} | 0.4 | 20.0 KiB |" in twice and "10.0 KiB" not in twice


def test_a_run_of_the_other_models_keeps_the_larger_section(bench):
    with_larger = bench._splice_compiled(_committed(bench), [_row(bench, bench.LARGER, 10 * 1024)])
    rerun = bench._splice_compiled(with_larger, [_row(bench, "example-gpt2", 30 * 1024)])
    assert "old compiled rows" not in rerun and "| example-gpt2 | 0.4 | 30.0 KiB |" in rerun
    assert rerun.count(bench.LARGER_HEADING) == 1 and f"| {bench.LARGER} | 0.4 | 10.0 KiB |" in rerun
    assert rerun.index(bench.COMPILED_HEADING) < rerun.index("example-gpt2 |") < rerun.index(bench.LARGER_HEADING)
    assert rerun.endswith("summary rows\n")
