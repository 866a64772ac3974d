"""Plots: rendered to real PNG files, then inspected through matplotlib's objects."""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("matplotlib")  # an optional extra: the plot tests need it, the rest of the suite does not

from matplotlib.collections import PolyCollection  # noqa: E402

from slackswap.errors import MissingExtraError, ValidationError  # noqa: E402
from slackswap.hardware import Hardware  # noqa: E402
from slackswap.plans import Action  # noqa: E402
from slackswap.report import plots  # noqa: E402
from slackswap.schedule import make_plan  # noqa: E402
from slackswap.sim import simulate, simulate_ideal  # noqa: E402
from slackswap.workloads.synthetic import chain  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def link(bytes_per_s: float) -> Hardware:
    return Hardware(
        name="test-link", peak_flops_per_s=1e12, gemm_efficiency=1.0, attention_efficiency=1.0,
        hbm_bytes_per_s=1e12, hbm_efficiency=1.0, hbm_capacity_bytes=10**12,
        d2h_bytes_per_s=bytes_per_s, h2d_bytes_per_s=bytes_per_s, copy_latency_s=0.0,
    )


def hand_timeline():
    """chain(4) with a0 swapped and a1 recomputed (see test_trace.hand_case): 14 s step, one
    1 s stall waiting for the copy back, issued at step 1 by hand, budget 250 B, peak 201 B."""
    w, hw = chain(4), link(100.0)
    plan = make_plan(w, {"a0": Action.SWAP, "a1": Action.RECOMPUTE}, policy="hand", budget_bytes=250, hardware=hw,
                     prefetch_step={"a0": 1})
    return simulate(w, hw, plan)


def assert_png(path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 5000


def legend_texts(legend) -> list[str]:
    return [t.get_text() for t in legend.get_texts()]


def test_step_plot_memory_budget_and_gantt(tmp_path):
    timeline = hand_timeline()
    fig = plots.plot_step(timeline, tmp_path / "step.png")
    assert_png(tmp_path / "step.png")
    ax_mem, ax_gantt = fig.axes[:2]
    assert ax_mem.get_ylabel() == "activation memory (B)"
    assert ax_gantt.get_xlabel() == "time (ms)"
    assert ax_mem.get_shared_x_axes().joined(ax_mem, ax_gantt)
    memory_line, budget_line = ax_mem.get_lines()
    assert list(budget_line.get_ydata()) == [250, 250]
    # one sample per instant (the settled value), extended to the end of the step, in ms
    assert list(memory_line.get_xdata()) == [0, 1000, 2000, 3000, 6000, 7000, 10000, 12000, 14000]
    assert list(memory_line.get_ydata()) == [101, 201, 201, 101, 101, 201, 101, 1, 1]
    assert legend_texts(ax_mem.get_legend()) == ["activations in use (peak 201 B)", "budget 250 B"]
    assert [t.get_text() for t in ax_gantt.get_yticklabels()] == ["compute", "D2H (to host)", "H2D (to device)"]
    bars = [c for c in ax_gantt.collections if isinstance(c, PolyCollection)]
    assert sum(len(c.get_paths()) for c in bars) == len(timeline.events)
    assert legend_texts(ax_gantt.get_legend()) == [
        "forward", "backward", "recompute", "stall: waiting for a copy back", "copy to host (D2H)", "copy back (H2D)",
    ]
    assert "14.000 s" in ax_mem.get_title() and "85.7% of ideal" in ax_mem.get_title()


def test_step_plot_without_budget_has_no_budget_line(tmp_path):
    timeline = simulate_ideal(chain(3, size_bytes=3 * 1024**2), link(1e9))
    fig = plots.build_step_figure(timeline)
    ax_mem = fig.axes[0]
    assert len(ax_mem.get_lines()) == 1 and ax_mem.get_ylabel() == "activation memory (MiB)"
    assert legend_texts(ax_mem.get_legend()) == ["activations in use (peak 6.00 MiB)"]


def test_settled_memory_keeps_the_peak():
    timeline = hand_timeline()
    settled = plots.settled_memory(timeline.memory)
    assert [t for t, _ in settled] == sorted({t for t, _ in timeline.memory})
    assert max(b for _, b in settled) == timeline.peak_memory_bytes


SWEEP_ROWS = [
    {"workload": m, "hardware": "a100-80gb-pcie4", "policy": p, "budget_fraction": f, "throughput_pct": tp}
    for m in ("bert-large", "gpt2-xl")
    for p, base in (("slackswap", 99.0), ("recompute-only", 80.0), ("swap-only", 70.0))
    for f, tp in ((0.3, base - 20.0), (0.5, base - 5.0), (0.8, base))
] + [{"workload": "gpt2-xl", "hardware": "a100-80gb-pcie4", "policy": "swap-only", "budget_fraction": 0.1,
      "throughput_pct": None}]


def test_sweep_plot_one_panel_per_model_one_line_per_policy(tmp_path):
    fig = plots.plot_sweep(SWEEP_ROWS, tmp_path / "sweep.png")
    assert_png(tmp_path / "sweep.png")
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == ["bert-large on a100-80gb-pcie4", "gpt2-xl on a100-80gb-pcie4"]
    for ax in panels:
        assert ax.get_xlabel() == "activation budget (% of unconstrained peak)"
        assert ax.get_ylabel() == "throughput (% of ideal)"
        lines = [line for line in ax.get_lines() if line.get_label() in ("slackswap", "recompute-only", "swap-only")]
        assert len(lines) == 3
        # the infeasible point (throughput None) is left out, not drawn at zero
        assert all(list(line.get_xdata()) == [30.0, 50.0, 80.0] for line in lines)
    slack = next(line for line in panels[0].get_lines() if line.get_label() == "slackswap")
    assert list(slack.get_ydata()) == [79.0, 94.0, 99.0]
    assert legend_texts(fig.legends[0]) == ["slackswap", "recompute-only", "swap-only"]


def test_sweep_plot_of_a_real_sweep(tmp_path):
    from slackswap.experiments.sweep import run_sweep

    rows = run_sweep(chain(6, fwd_time_s=0.5), link(100.0), [0.4, 0.7, 1.0], ["full-recompute", "slackswap"])
    fig = plots.plot_sweep(rows, tmp_path / "sweep.png")
    assert_png(tmp_path / "sweep.png")
    (ax,) = [ax for ax in fig.axes if ax.get_visible()]
    assert ax.get_title() == "chain6 on test-link"
    for policy in ("full-recompute", "slackswap"):
        line = next(line for line in ax.get_lines() if line.get_label() == policy)
        expected = [(100 * r["budget_fraction"], r["throughput_pct"]) for r in rows
                    if r["policy"] == policy and r["fits"]]
        assert list(zip(line.get_xdata(), line.get_ydata())) == expected and expected


def test_sweep_plot_rejects_no_rows():
    with pytest.raises(ValidationError, match="no rows"):
        plots.build_sweep_figure([])


def policies(**pcts):
    return {name.replace("_", "-"): {"fits": v is not None, "throughput_pct": v} for name, v in pcts.items()}


# The shape of run_reproduce's result (only the keys the figure reads), made-up numbers.
REPRODUCE = {"rows": [
    {"model": "bert-large", "paper_pct": 96.3, "budget_fraction": 0.5, "hardware": "a100-80gb-pcie4",
     "policies": policies(ideal=100.0, full_recompute=77.5, slackswap=95.1)},
    {"model": "gpt2-xl", "paper_pct": 97.6, "budget_fraction": 0.5, "hardware": "a100-80gb-pcie4",
     "policies": policies(ideal=100.0, full_recompute=76.3, slackswap=98.0)},
    {"model": "llama-7b", "paper_pct": 99.6, "budget_fraction": 0.5, "hardware": "a100-80gb-pcie4",
     "policies": policies(ideal=100.0, full_recompute=79.6, slackswap=None)},
]}


def test_reproduce_plot_grouped_bars_paper_vs_ours(tmp_path):
    fig = plots.plot_reproduce(REPRODUCE, tmp_path / "reproduce.png")
    assert_png(tmp_path / "reproduce.png")
    ax = fig.axes[0]
    assert ax.get_ylabel() == "throughput (% of ideal)" and ax.get_xlabel() == "model"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["bert-large", "gpt2-xl", "llama-7b"]
    # paper, then every policy but ideal (100% by definition), three bars each
    assert len(ax.containers) == 3 and all(len(c) == 3 for c in ax.containers)
    paper, recompute, ours = ax.containers
    assert [round(b.get_height(), 1) for b in paper] == [96.3, 97.6, 99.6]
    assert [round(b.get_height(), 1) for b in recompute] == [77.5, 76.3, 79.6]
    assert [round(b.get_height(), 1) for b in ours] == [95.1, 98.0, 0.0]
    assert legend_texts(ax.get_legend()) == ["paper (SlackSwap)", "full-recompute", "slackswap"]
    labels = [t.get_text() for t in ax.texts]
    assert labels.count("n/a") == 1
    assert ax.get_ylim()[0] == 70.0  # lowest bar 76.3, less 5, down to a multiple of 10
    assert "50% of each model's activation peak, a100-80gb-pcie4" in ax.get_title()


def test_reproduce_plot_chosen_policies():
    fig = plots.build_reproduce_figure(REPRODUCE, policies=["slackswap"])
    ax = fig.axes[0]
    assert legend_texts(ax.get_legend()) == ["paper (SlackSwap)", "slackswap"]
    assert ax.get_ylim()[0] == 90.0


def test_plot_file_type_is_checked(tmp_path):
    with pytest.raises(ValidationError, match=r"\.png"):
        plots.plot_step(hand_timeline(), tmp_path / "step.txt")


def test_missing_matplotlib_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingExtraError) as info:
        plots.build_step_figure(hand_timeline())
    message = str(info.value)
    assert "slackswap[plot]" in message and "matplotlib" in message and "\n" not in message


# ---- the CLI ------------------------------------------------------------------------------------
def test_simulate_plot_flag(tmp_path, capsys):
    from slackswap.cli import main

    chain(5).save(tmp_path / "w.json")
    code = main(["simulate", "--workload", str(tmp_path / "w.json"), "--plot", str(tmp_path / "step.png"), "--json"])
    assert code == 0
    assert_png(tmp_path / "step.png")
    assert '"throughput_pct"' in capsys.readouterr().out


def test_simulate_plot_without_matplotlib_is_one_line_naming_the_extra(tmp_path, capsys, monkeypatch):
    from slackswap.cli import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    chain(5).save(tmp_path / "w.json")
    code = main(["simulate", "--workload", str(tmp_path / "w.json"), "--plot", str(tmp_path / "step.png")])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and not (tmp_path / "step.png").exists()
    assert err.count("\n") == 1 and "pip install 'slackswap[plot]'" in err and "matplotlib" in err
    # without --plot the same command still works
    assert main(["simulate", "--workload", str(tmp_path / "w.json"), "--quiet"]) == 0


def test_simulate_plot_with_a_bad_extension_fails_before_simulating(tmp_path, capsys):
    from slackswap.cli import main

    code = main(["simulate", "--workload", str(tmp_path / "missing.json"), "--plot", str(tmp_path / "step.jpg")])
    assert code == 2 and "must end in .png, .svg or .pdf" in capsys.readouterr().err


def test_sweep_plot_flag(tmp_path, capsys):
    from slackswap.cli import main

    chain(5, fwd_time_s=0.5).save(tmp_path / "w.json")
    link(100.0).save(tmp_path / "hw.json")
    code = main(["sweep", "--workload", str(tmp_path / "w.json"), "--hardware", str(tmp_path / "hw.json"),
                 "--budgets", "0.5,1.0", "--policies", "full-recompute,slackswap", "--out", str(tmp_path / "s.csv"),
                 "--plot", str(tmp_path / "sweep.png"), "--quiet"])
    assert code == 0 and capsys.readouterr() == ("", "")
    assert_png(tmp_path / "sweep.png")
    assert (tmp_path / "s.csv").read_text().count("\n") == 5


def test_sweep_plot_without_matplotlib_fails_before_sweeping(tmp_path, capsys, monkeypatch):
    from slackswap.cli import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    chain(5).save(tmp_path / "w.json")
    code = main(["sweep", "--workload", str(tmp_path / "w.json"), "--budgets", "0.5", "--out", str(tmp_path / "s.csv"),
                 "--plot", str(tmp_path / "sweep.png")])
    err = capsys.readouterr().err
    assert code == 2 and "slackswap[plot]" in err and err.count("\n") == 1
    assert not (tmp_path / "s.csv").exists()


def test_unwritable_plot_path_is_one_line_error(tmp_path):
    from slackswap.errors import OutputPathError

    with pytest.raises(OutputPathError, match="cannot write plot") as info:
        plots.plot_step(hand_timeline(), tmp_path / "missing" / "step.png")
    assert "\n" not in str(info.value)
