"""Which micro-batch sizes and sequence lengths of a built-in model fit a GPU, under each policy.

For every (micro-batch, sequence length) and policy, ``fit`` plans for the device's memory
(memory/device_plan.py: the simulated reserved peak, model states included, fits the GPU)
and reports the simulated throughput. A policy that does not fit at a micro-batch is not
tried at larger ones for the same sequence length (their activations only grow), and the
row says it was skipped. When nothing fits, ``advice`` says what would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..errors import BudgetError, ValidationError
from ..hardware import Hardware
from ..memory.device_plan import DeviceOptions, plan_for_device
from ..memory.model_states import model_states
from ..units import format_bytes

DEFAULT_POLICIES = ("ideal", "full-recompute", "slackswap")
DEFAULT_MICRO_BATCHES = (1, 2, 4, 8, 16)
MAX_GRID = 200
"""Most (micro-batch, sequence length, policy) cells one call plans: each costs up to seconds."""
_MAX_SHARD = 4096

Progress = Callable[[int, int, str], None]


@dataclass(frozen=True, slots=True)
class FitRow:
    micro_batch: int
    seq_len: int
    policy: str
    fits: bool
    throughput_pct: float | None = None
    """Simulated step throughput in % of the same configuration with everything kept and no memory limit."""
    tokens_per_s: float | None = None
    """Training tokens per second per GPU of the data-parallel replica (``gpu_tokens_per_s``)."""
    step_time_s: float | None = None
    activation_budget_bytes: int | None = None
    reserved_peak_bytes: int | None = None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}


@dataclass(frozen=True, slots=True)
class FitResult:
    model: str
    hardware: str
    gpu_memory_bytes: int
    options: DeviceOptions
    model_state_bytes: int
    rows: tuple[FitRow, ...]
    advice: str | None = None
    """What would fit, when nothing does."""
    tensor_parallel: int = 1
    context_parallel: int = 1
    pipeline_parallel: int = 1
    pipeline_micro_batches: int = 1
    """m: micro-batches per optimizer step through the pipeline (1 without pipeline stages)."""

    @property
    def pipeline_bubble_fraction(self) -> float:
        p = self.pipeline_parallel
        return (p - 1) / (self.pipeline_micro_batches + p - 1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "hardware": self.hardware, "gpu_memory_bytes": self.gpu_memory_bytes,
            **self.options.to_dict(), "model_state_bytes": self.model_state_bytes,
            "tensor_parallel": self.tensor_parallel, "context_parallel": self.context_parallel,
            "pipeline_parallel": self.pipeline_parallel, "pipeline_micro_batches": self.pipeline_micro_batches,
            "pipeline_bubble_fraction": self.pipeline_bubble_fraction,
            "rows": [r.to_dict() for r in self.rows], "advice": self.advice,
        }


DEFAULT_PIPELINE_MICRO_BATCHES_PER_STAGE = 4
"""Micro-batches per optimizer step per pipeline stage when ``pipeline_micro_batches`` is not given
(m = 4p: the 1F1B bubble is then (p-1)/(5p-1), under 20 %); a choice, printed with the table."""


def pipeline_micro_batches_for(spec, pipeline_micro_batches: int | None) -> int:
    """m, the micro-batches each pipeline runs per optimizer step (1 without pipeline parallelism)."""
    if spec.pipeline_parallel == 1:
        return 1
    if pipeline_micro_batches is None:
        return DEFAULT_PIPELINE_MICRO_BATCHES_PER_STAGE * spec.pipeline_parallel
    if isinstance(pipeline_micro_batches, bool) or not isinstance(pipeline_micro_batches, int) \
            or pipeline_micro_batches < spec.pipeline_parallel:
        raise ValidationError(f"pipeline micro-batches {pipeline_micro_batches!r} must be an integer of at least "
                              f"the {spec.pipeline_parallel} pipeline stages (1F1B keeps every stage busy only then)")
    return pipeline_micro_batches


def gpu_tokens_per_s(spec, step_time_s: float, pipeline_micro_batches: int = 1) -> float:
    """Training tokens per second per GPU for the rank workload of ``spec`` that simulates in ``step_time_s``.

    The rank's workload holds the p - i micro-batches stage i keeps in flight, so one micro-batch's
    forward and backward take step_time_s / (p - i) on it. A 1F1B step of m micro-batches takes
    m + p - 1 such slots (stages assumed balanced), and moves m x micro_batch x seq_len tokens
    through the t x cp x p GPUs of one data-parallel replica: tensor-parallel and context-parallel
    ranks share the same tokens, pipeline stages pass them on. Data parallelism changes nothing
    per GPU.
    """
    slot_s = step_time_s / (spec.pipeline_parallel - spec.pipeline_stage)
    replica_step_s = (pipeline_micro_batches + spec.pipeline_parallel - 1) * slot_s
    gpus = spec.tensor_parallel * spec.context_parallel * spec.pipeline_parallel
    return pipeline_micro_batches * spec.tokens / replica_step_s / gpus


def _advice(model: str, hardware: Hardware, gpu: int, options: DeviceOptions, smallest: tuple[int, int],
            overrides: dict) -> str:
    """What would fit when nothing does: more shards, or a shorter sequence."""
    from ..planners import minimum_budget_bytes
    from ..workloads.models import build_model_workload

    micro_batch, seq_len = smallest
    w = build_model_workload(model, hardware, **{**overrides, "micro_batch": micro_batch, "seq_len": seq_len})
    minimum = minimum_budget_bytes(w)
    states = options.states(w, required=True)
    assert states is not None
    head = (f"nothing fits {format_bytes(gpu)}: model states take {format_bytes(states.total_bytes)} per GPU and "
            f"micro-batch {micro_batch} at sequence length {seq_len} needs at least {format_bytes(minimum)} of saved "
            f"activations besides gradients and workspaces")
    shard = options.shard
    while shard < _MAX_SHARD:
        shard *= 2
        sharded = model_states(w, optimizer=options.optimizer, precision=options.precision, ranks=shard,
                               sharding="fsdp" if options.sharding == "none" else options.sharding)
        if sharded.total_bytes + minimum < gpu:
            return (f"{head}; shard the model states over {shard} GPUs (--shard {shard}: "
                    f"{format_bytes(sharded.total_bytes)} per GPU), or use a shorter sequence")
    return f"{head}; use a shorter sequence or a GPU with more memory"


FIT_SPEC_FIELDS = ("micro_batch", "seq_len", "tensor_parallel", "context_parallel", "pipeline_parallel",
                   "pipeline_stage", "tokens")
"""What fit reads from a model's configuration: the grid's two axes and the layout its tokens/s needs."""


def fit(
    model: str,
    hardware: Hardware,
    gpu_memory_bytes: int,
    *,
    micro_batches: Sequence[int] = DEFAULT_MICRO_BATCHES,
    seq_lens: Sequence[int] | None = None,
    policies: Sequence[str] = DEFAULT_POLICIES,
    options: DeviceOptions = DeviceOptions(),
    progress: Progress | None = None,
    pipeline_micro_batches: int | None = None,
    **overrides: Any,
) -> FitResult:
    """Fit table of built-in model ``model`` (TransformerSpec ``overrides`` applied) on a GPU with
    ``gpu_memory_bytes``: one row per (micro-batch, sequence length, policy). With pipeline
    stages, ``pipeline_micro_batches`` is m, the micro-batches per optimizer step (default 4p)."""
    from ..planners import get_planner
    from ..workloads.models import build_model_workload, model_spec

    for policy in policies:
        get_planner(policy)
    spec = model_spec(model, **overrides)
    missing = [field for field in FIT_SPEC_FIELDS if not hasattr(spec, field)]
    if missing:
        raise ValidationError(
            f"fit needs a model whose configuration has {', '.join(FIT_SPEC_FIELDS)}; {model!r} "
            f"({type(spec).__name__}) lacks {', '.join(missing)}: use plan or simulate for it, or add those "
            f"fields to its family (docs/architecture.md)"
        )
    pipeline_m = pipeline_micro_batches_for(spec, pipeline_micro_batches)
    seq_lens = tuple(seq_lens) if seq_lens else (spec.seq_len,)
    micro_batches = tuple(sorted(set(micro_batches)))
    for value, what in [(m, "micro-batch") for m in micro_batches] + [(s, "sequence length") for s in seq_lens]:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValidationError(f"{what} {value!r} must be a positive integer")
    if not micro_batches or not policies:
        raise ValidationError("fit needs at least one micro-batch and one policy")
    total = len(micro_batches) * len(seq_lens) * len(policies)
    if total > MAX_GRID:
        raise ValidationError(f"fit asks for {total} cells; at most {MAX_GRID}: list fewer micro-batches, lengths or policies")
    rows: list[FitRow] = []
    states_bytes = 0
    done = 0
    for seq_len in seq_lens:
        failed_at: dict[str, int] = {}
        for micro_batch in micro_batches:
            w = build_model_workload(model, hardware, **{**overrides, "micro_batch": micro_batch, "seq_len": seq_len})
            states = options.states(w, required=True)
            assert states is not None
            states_bytes = states.total_bytes
            rank_spec = spec.replace(micro_batch=micro_batch, seq_len=seq_len)
            for policy in policies:
                done += 1
                if policy in failed_at:
                    rows.append(FitRow(micro_batch, seq_len, policy, False,
                                       note=f"skipped: micro-batch {failed_at[policy]} does not fit"))
                    continue
                try:
                    result = plan_for_device(w, hardware, gpu_memory_bytes, policy, options)
                except BudgetError as exc:
                    failed_at[policy] = micro_batch
                    why = str(exc).split(" per GPU: ", 1)[-1].split("; shard the model states", 1)[0]
                    rows.append(FitRow(micro_batch, seq_len, policy, False, note=why))
                else:
                    t = result.timeline
                    rows.append(FitRow(micro_batch, seq_len, policy, True, t.throughput_pct,
                                       gpu_tokens_per_s(rank_spec, t.step_time_s, pipeline_m),
                                       t.step_time_s, result.plan.budget_bytes, result.memory.reserved_peak_bytes))
                if progress is not None:
                    progress(done, total, f"micro-batch {micro_batch}, sequence {seq_len}, {policy}")
    advice = None
    if not any(r.fits for r in rows):
        smallest = (micro_batches[0], min(seq_lens))
        advice = _advice(model, hardware, gpu_memory_bytes, options, smallest, overrides)
    return FitResult(model, hardware.name, gpu_memory_bytes, options, states_bytes, tuple(rows), advice,
                     spec.tensor_parallel, spec.context_parallel, spec.pipeline_parallel, pipeline_m)
