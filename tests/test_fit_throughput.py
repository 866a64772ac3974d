"""fit's tokens/s for tensor-, context- and pipeline-parallel ranks (issue 16), worked by hand."""

from __future__ import annotations

import pytest

import slackswap
from slackswap.errors import ValidationError
from slackswap.experiments.fit import gpu_tokens_per_s, pipeline_micro_batches_for
from slackswap.workloads.models import model_spec


def llama(**layout):
    return model_spec("llama-7b", micro_batch=1, seq_len=2048, **layout)


def test_one_gpu_counts_every_token_of_the_step():
    assert gpu_tokens_per_s(llama(), 1.0) == 2048.0


def test_tensor_parallel_ranks_share_their_tokens():
    # 8 ranks work on the same 2048 tokens in 1 s: 256 tokens/s each, not 2048.
    assert gpu_tokens_per_s(llama(tensor_parallel=8), 1.0) == 256.0


def test_pipeline_stages_pay_the_1f1b_bubble():
    # t = 2, p = 2, m = 4. Stage 0 holds p - 0 = 2 micro-batches: its 1 s step is two 0.5 s slots.
    # A 1F1B step takes m + p - 1 = 5 slots (2.5 s) for 4 x 2048 tokens over 2 x 2 GPUs:
    # 8192 / 2.5 / 4 = 819.2 tokens/s per GPU (the bubble: 1 of 5 slots idle).
    assert gpu_tokens_per_s(llama(tensor_parallel=2, pipeline_parallel=2), 1.0, 4) == pytest.approx(819.2)
    # Stage 1 holds one micro-batch: its 1 s step is one slot, so the replica's step is 5 s.
    last = llama(tensor_parallel=2, pipeline_parallel=2, pipeline_stage=1)
    assert gpu_tokens_per_s(last, 1.0, 4) == pytest.approx(409.6)


def test_pipeline_micro_batches_default_and_bad_values():
    assert pipeline_micro_batches_for(llama(), None) == 1
    assert pipeline_micro_batches_for(llama(pipeline_parallel=4), None) == 16
    with pytest.raises(ValidationError, match="at least the 4 pipeline stages"):
        pipeline_micro_batches_for(llama(pipeline_parallel=4), 3)


def test_fit_rows_use_the_per_gpu_accounting(capsys):
    one = slackswap.fit("bert-large", "a100-80gb-pcie4", "80GiB", micro_batches=[1], policies=["ideal"],
                        layout={"tensor_parallel": 2, "pipeline_parallel": 2}, pipeline_micro_batches=2)
    row = one.rows[0]
    # stage 0 holds 2 micro-batches: 3 slots of step/2 for 2 x 512 tokens over 4 GPUs
    assert row.fits and row.tokens_per_s == pytest.approx(2 * 512 / (3 * row.step_time_s / 2) / 4)
    assert one.to_dict()["pipeline_bubble_fraction"] == pytest.approx(1 / 3)
    from slackswap.cli.fit_cmd import table_lines

    lines = table_lines(one)
    assert any("p=2 with 2 micro-batches per step (1F1B bubble 33.3 %)" in line for line in lines)
    # the largest micro-batch tried fits, so the table says to try larger ones
    assert "micro-batch 1, the largest tried, fits: larger ones may too (--micro-batches 1,2,4)" in lines
