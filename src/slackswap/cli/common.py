"""Arguments and helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from .._outputs import output_target
from ..errors import BudgetError, OutputPathError, ValidationError
from ..hardware import DEFAULT_HARDWARE, Hardware, get_hardware
from ..units import format_bytes, parse_size_bytes
from ..units import parse_budget  # noqa: F401 - the one budget parser, re-exported for the commands
from ..workload import Workload

SPEC_FLAGS = {
    # flag: (spec field, type)
    "layers": int, "hidden": int, "heads": int, "ffn": int, "vocab": int,
    "seq_len": int, "micro_batch": int,
}


def add_workload_args(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    group = parser.add_argument_group("workload (one of --model or --workload)")
    group.add_argument("--model", metavar="NAME", help="built-in model (see 'slackswap models'), or 'custom' with every size flag")
    group.add_argument("--workload", metavar="FILE", help="workload JSON (from export-workload or profile)")
    for flag, kind in SPEC_FLAGS.items():
        group.add_argument(f"--{flag.replace('_', '-')}", dest=f"spec_{flag}", type=kind, metavar="N",
                           help=f"override the model's {flag.replace('_', ' ')}")
    group.add_argument("--attention", dest="spec_attention", choices=("eager", "flash"), help="attention kernel")
    group.add_argument("--mlp", dest="spec_mlp", choices=("gelu", "swiglu"), help="MLP kind")
    group.add_argument("--norm", dest="spec_norm", choices=("layernorm", "rmsnorm"), help="normalization kind")
    group.add_argument("--dropout", dest="spec_dropout", action=argparse.BooleanOptionalAction, default=None,
                       help="dropout on or off")
    add_layout_args(group)
    parser.set_defaults(_workload_required=required)


# flag: (spec field, help); each takes a positive integer.
LAYOUT_FLAGS = {
    "--kv-heads": ("kv_heads", "key/value heads (grouped-query attention; default: as many as --heads)"),
    "--tp": ("tensor_parallel", "tensor-parallel degree t: the workload is one rank's"),
    "--cp": ("context_parallel", "context-parallel degree: each rank holds seq-len/cp tokens"),
    "--pp": ("pipeline_parallel", "pipeline stages p (1F1B: stage i holds p - i micro-batches in flight)"),
    "--pp-stage": ("pipeline_stage", "which pipeline stage's rank to build (default 0, the one holding most)"),
}


def add_layout_args(group) -> None:
    """The parallel-layout options of every command that takes --model."""
    for flag, (field, text) in LAYOUT_FLAGS.items():
        group.add_argument(flag, dest=f"spec_{field}", type=int, metavar="N", help=text)
    group.add_argument("--sp", dest="spec_sequence_parallel", action=argparse.BooleanOptionalAction, default=None,
                       help="Megatron sequence parallelism over the --tp ranks on or off")


def add_hardware_arg(parser: argparse.ArgumentParser, default: str = DEFAULT_HARDWARE) -> None:
    parser.add_argument("--hardware", default=default, metavar="NAME|FILE",
                        help=f"hardware preset (see 'slackswap hardware') or JSON file (default {default})")
    parser.add_argument("--duplex-slowdown", dest="duplex_slowdown", action=argparse.BooleanOptionalAction,
                        default=True, help="model the measured slowdown of H2D while D2H is busy (default on)")
    parser.add_argument("--host-memory", dest="host_memory", metavar="SIZE",
                        help="pinned host memory the swaps may use, such as 64GiB (default: the hardware's, "
                        "unlimited in every preset)")


def add_budget_arg(parser: argparse.ArgumentParser, default: str | None = "0.5") -> None:
    parser.add_argument("--budget", default=default, metavar="F|SIZE",
                        help="activation budget: a fraction of the unconstrained peak (0.5) or a size (12GiB)"
                        + (f" (default {default})" if default else " (default 0.5)"))


def add_device_args(parser: argparse.ArgumentParser) -> None:
    """--gpu-memory and how the model is trained (docs/memory.md)."""
    from ..memory.model_states import OPTIMIZERS, PRECISIONS, SHARDINGS

    group = parser.add_argument_group("device memory (docs/memory.md)")
    group.add_argument("--gpu-memory", dest="gpu_memory", metavar="SIZE",
                       help="plan so that the whole step's simulated reserved peak (model states, activations, "
                       "gradients, workspaces, allocator) fits this much GPU memory, such as 80GiB")
    group.add_argument("--optimizer", default="adam", choices=list(OPTIMIZERS), help="optimizer (default adam)")
    group.add_argument("--precision", default="bf16-mixed", choices=list(PRECISIONS),
                       help="parameter, gradient and optimizer-state precision (default bf16-mixed)")
    group.add_argument("--shard", default=1, type=int, metavar="N", help="shard the model states over N GPUs (default 1)")
    group.add_argument("--sharding", default="fsdp", choices=list(SHARDINGS),
                       help="what --shard shards: zero1, zero2, zero3 or fsdp (default fsdp)")
    group.add_argument("--expandable-segments", dest="expandable_segments", action="store_true",
                       help="model PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")


def device_options(args: argparse.Namespace):
    from ..memory.device_plan import DeviceOptions

    if args.shard < 1:
        raise ValidationError(f"--shard {args.shard}: the shard count must be at least 1")
    return DeviceOptions(optimizer=args.optimizer, precision=args.precision, shard=args.shard,
                         sharding=args.sharding, expandable_segments=args.expandable_segments)


def gpu_memory_arg(args: argparse.Namespace) -> int | None:
    """--gpu-memory in bytes (None when not given); refuses it beside --budget."""
    if args.gpu_memory is None:
        return None
    if getattr(args, "budget", None) is not None:
        raise BudgetError("give either --budget (saved activations) or --gpu-memory (the whole GPU), not both")
    return parse_size_bytes(args.gpu_memory)


def device_lines(memory, gpu_memory_bytes: int | None = None) -> list[str]:
    """Console lines for a DeviceMemory."""
    states = "unknown (the workload does not record its parameters)" if memory.model_state_bytes is None else (
        format_bytes(memory.model_state_bytes))
    gpu = "" if gpu_memory_bytes is None else f" of {format_bytes(gpu_memory_bytes)}"
    return [
        f"model states        {states}",
        f"device memory       allocated peak {format_bytes(memory.allocated_peak_bytes)}, reserved peak "
        f"{format_bytes(memory.reserved_peak_bytes)}{gpu} (fragmentation {format_bytes(memory.allocator.fragmentation_bytes)})",
    ]


def spec_overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {k[5:]: v for k, v in vars(args).items() if k.startswith("spec_") and v is not None}


def load_hardware(args: argparse.Namespace) -> Hardware:
    hardware = get_hardware(args.hardware)
    if not getattr(args, "duplex_slowdown", True):
        hardware = hardware.without_duplex_slowdown()
    if getattr(args, "host_memory", None) is not None:
        hardware = hardware.replace(pinned_host_bytes=parse_size_bytes(args.host_memory))
    return hardware


def load_workload(args: argparse.Namespace, hardware: Hardware) -> Workload:
    """The workload named by --workload (a profile timed on a CPU or another GPU projected onto
    ``hardware`` by the roofline, as slackswap.plan does), or built from --model and the size flags."""
    overrides = spec_overrides(args)
    if args.workload and (args.model or overrides):
        raise ValidationError("give either --workload FILE or --model NAME (with size flags), not both")
    if args.workload:
        from ..profiler.build import timed_for

        return timed_for(Workload.load(args.workload), hardware)
    if not args.model:
        raise ValidationError("no workload given: pass --model NAME (see 'slackswap models') or --workload FILE")
    from ..workloads.models import build_model_workload

    return build_model_workload(args.model, hardware, **overrides)


def check_output_paths(*paths: str | None) -> None:
    """Fail before any work if an output file cannot be written: a missing or read-only
    directory, a directory or a special file given as the file, a name too long, or one file
    named for two outputs. Symlinks are written through (_outputs.py).

    Writing itself goes through a temporary file and a rename, and a command's outputs are
    renamed into place together when it succeeds (``_outputs.outputs_together``).
    """
    given = [p for p in paths if p]
    seen: set[str] = set()
    for path in given:
        target = output_target(path)
        key = os.path.realpath(target)
        if key in seen:
            raise OutputPathError(f"{str(path)!r} is named for two outputs: give each output its own file")
        seen.add(key)
        parent = target.parent if str(target.parent) else Path(".")
        if not parent.is_dir():
            raise OutputPathError(
                f"cannot write {str(path)!r}: directory {str(parent)!r} does not exist; create it first"
            )
        if not os.access(parent, os.W_OK | os.X_OK):
            raise OutputPathError(f"cannot write {str(path)!r}: directory {str(parent)!r} is not writable")


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=1, allow_nan=False)
    sys.stdout.write("\n")


def budget_share(budget_bytes: int, unconstrained_peak_bytes: int) -> str:
    """'40.0% of 1.00 GiB', or why there is no share: a workload that saves nothing has a zero peak."""
    if unconstrained_peak_bytes <= 0:
        return "the workload saves no tensor for backward: nothing to plan"
    return f"{100 * budget_bytes / unconstrained_peak_bytes:.1f}% of {format_bytes(unconstrained_peak_bytes)}"
