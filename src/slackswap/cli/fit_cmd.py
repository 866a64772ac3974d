"""`slackswap fit`: which micro-batch sizes and sequence lengths fit a GPU, under each policy."""

from __future__ import annotations

from ..errors import ValidationError
from ..report.console import progress_reporter
from ..units import format_bytes, format_seconds, parse_size_bytes
from .common import (
    add_device_args, add_hardware_arg, add_layout_args, device_options, load_hardware, print_json, spec_overrides,
)


def _int_list(text: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValidationError(f"cannot read {what} {text!r}: write a comma-separated list such as 1,2,4") from None
    if not values:
        raise ValidationError(f"{what} {text!r} lists nothing: write a comma-separated list such as 1,2,4")
    return values


def register(subparsers) -> None:
    parser = subparsers.add_parser("fit", help="which micro-batch sizes and sequence lengths fit a GPU, and how fast "
                                   "(--gpu-memory defaults to the hardware's memory)")
    parser.add_argument("--model", metavar="NAME", help="built-in model (see 'slackswap models'); required")
    add_layout_args(parser.add_argument_group("parallel layout (the table is one rank's; docs/models.md)"))
    add_hardware_arg(parser)
    add_device_args(parser)
    parser.add_argument("--micro-batches", dest="micro_batches", default="1,2,4,8,16", metavar="LIST",
                        help="micro-batch sizes to try (default 1,2,4,8,16)")
    parser.add_argument("--seq-lens", dest="seq_lens", default=None, metavar="LIST",
                        help="sequence lengths to try (default: the model's)")
    parser.add_argument("--pp-micro-batches", dest="pipeline_micro_batches", type=int, default=None, metavar="M",
                        help="with --pp: micro-batches per optimizer step through the pipeline, for tokens/s "
                        "(1F1B bubble (p-1)/(M+p-1); default 4 x --pp)")
    parser.add_argument("--policies", default="ideal,full-recompute,slackswap", metavar="A,B",
                        help="policies to try (default ideal,full-recompute,slackswap)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quiet", action="store_true", help="print nothing but errors")
    parser.set_defaults(func=run)


def run(args) -> int:
    from ..experiments.fit import fit
    from ..experiments.sweep import parse_policies

    policies = parse_policies(args.policies)
    micro_batches = _int_list(args.micro_batches, "--micro-batches")
    seq_lens = _int_list(args.seq_lens, "--seq-lens") if args.seq_lens else None
    options = device_options(args)
    gpu = None if args.gpu_memory is None else parse_size_bytes(args.gpu_memory)
    hardware = load_hardware(args)
    if not args.model:
        raise ValidationError("no workload given: fit needs --model NAME (a built-in model, see 'slackswap models')")
    if gpu is None:
        gpu = hardware.hbm_capacity_bytes
    with progress_reporter("fit", quiet=args.quiet or args.json) as progress:
        result = fit(args.model, hardware, gpu, micro_batches=micro_batches, seq_lens=seq_lens, policies=policies,
                     options=options, progress=progress, pipeline_micro_batches=args.pipeline_micro_batches,
                     **spec_overrides(args))
    if args.quiet:
        return 0
    if args.json:
        print_json(result.to_dict())
        return 0
    print("\n".join(table_lines(result)))
    return 0


def table_lines(result) -> list[str]:
    o = result.options
    lines = [
        f"{result.model} on {result.hardware}, {format_bytes(result.gpu_memory_bytes)} per GPU, {o.optimizer} "
        f"{o.precision}, model states {format_bytes(result.model_state_bytes)} per GPU"
        + (f" ({o.sharding} over {o.shard} GPUs)" if o.shard > 1 else ""),
        "",
        f"{'micro-batch':>11}  {'seq len':>7}  {'policy':<20} {'fits':<4}  {'throughput':>10}  {'tokens/s':>10}  "
        f"{'step time':>10}  {'reserved peak':>13}",
    ]
    for r in result.rows:
        if r.fits:
            lines.append(f"{r.micro_batch:>11}  {r.seq_len:>7}  {r.policy:<20} {'yes':<4}  {r.throughput_pct:>9.2f}%  "
                         f"{r.tokens_per_s:>10.0f}  {format_seconds(r.step_time_s):>10}  "
                         f"{format_bytes(r.reserved_peak_bytes):>13}")
        else:
            lines.append(f"{r.micro_batch:>11}  {r.seq_len:>7}  {r.policy:<20} {'no':<4}  {r.note}")
    lines.append("")
    lines.append("throughput: % of the same configuration with everything kept and no memory limit (simulated); "
                 "tokens/s: training tokens per second per GPU")
    layout = [f"t={result.tensor_parallel}"] if result.tensor_parallel > 1 else []
    layout += [f"cp={result.context_parallel}"] if result.context_parallel > 1 else []
    if result.pipeline_parallel > 1:
        layout.append(f"p={result.pipeline_parallel} with {result.pipeline_micro_batches} micro-batches per step "
                      f"(1F1B bubble {100 * result.pipeline_bubble_fraction:.1f} %)")
    if layout:
        lines.append(f"parallel layout: {', '.join(layout)}; tokens/s counts each token once per replica of "
                     f"{result.tensor_parallel * result.context_parallel * result.pipeline_parallel} GPUs; step time "
                     "and reserved peak are this rank's")
    if result.advice:
        lines.append(result.advice)
    else:
        # Ties go to the larger micro-batch: fewer optimizer steps per sample (not simulated).
        best = max((r for r in result.rows if r.fits), key=lambda r: (r.tokens_per_s, r.micro_batch, r.seq_len))
        lines.append(f"fastest that fits: micro-batch {best.micro_batch}, sequence length {best.seq_len}, "
                     f"{best.policy}: {best.tokens_per_s:.0f} tokens/s per GPU")
        largest = max(r.micro_batch for r in result.rows)
        if any(r.fits for r in result.rows if r.micro_batch == largest):
            lines.append(f"micro-batch {largest}, the largest tried, fits: larger ones may too "
                         f"(--micro-batches {largest},{2 * largest},{4 * largest})")
    return lines
