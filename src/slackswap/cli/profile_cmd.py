"""`slackswap profile FILE.py --out workload.json`: measure a model's training step.

FILE.py must define three functions (see docs/runtime.md):
``make_model()`` -> torch.nn.Module, ``make_batch()`` -> any batch object, and
``loss_fn(model, batch)`` -> scalar loss tensor.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from ..errors import SlackswapError, ValidationError, require
from ..units import format_bytes, format_seconds
from ..report.console import progress_reporter
from .common import check_output_paths, print_json

REQUIRED = ("make_model", "make_batch", "loss_fn")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "profile", help="measure a PyTorch model's training step into a workload JSON (extra 'torch')",
        description="FILE.py defines make_model(), make_batch() and loss_fn(model, batch) (a scalar loss).",
    )
    parser.add_argument("file", metavar="FILE.py", help="Python file defining make_model, make_batch, loss_fn")
    parser.add_argument("--out", required=True, metavar="FILE", help="workload JSON to write")
    parser.add_argument("--hardware", default=None, metavar="NAME|FILE",
                        help="project the measured times onto this hardware by roofline (default: keep measured times)")
    parser.add_argument("--warmup", type=steps_arg(0), default=1, metavar="N",
                        help=f"warm-up steps before measuring, 0 to {MAX_STEPS} (default 1)")
    parser.add_argument("--repeats", type=steps_arg(1), default=3, metavar="N",
                        help=f"measured steps, 1 to {MAX_STEPS}; times are medians (default 3)")
    parser.add_argument("--json", action="store_true", help="print a JSON summary of the profile")
    parser.add_argument("--quiet", action="store_true", help="print nothing but errors (the workload is still written)")
    parser.set_defaults(func=run)


MAX_STEPS = 1000
"""Most warm-up or measured steps: medians settle within a few; beyond this a typo is likelier."""


def steps_arg(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if not minimum <= value <= MAX_STEPS:
            raise argparse.ArgumentTypeError(f"{value} is not between {minimum} and {MAX_STEPS}")
        return value

    return parse


def load_user_file(path: str):
    """Import FILE.py and return its (make_model, make_batch, loss_fn)."""
    source = Path(path)
    if not source.is_file():
        raise ValidationError(f"model file {path!r} does not exist: check the path")
    if source.suffix != ".py":
        raise ValidationError(f"model file {path!r} must be a Python file ending in .py: rename it")
    spec = importlib.util.spec_from_file_location(f"_slackswap_user_{source.stem}", source)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(source.parent.resolve()))
    try:
        _call_user(path, "import", lambda: spec.loader.exec_module(module))
    finally:
        sys.path.pop(0)
    for name in REQUIRED:
        if not callable(getattr(module, name, None)):
            raise ValidationError(
                f"{path!r} does not define {name}(): a profile file defines make_model(), make_batch() "
                "and loss_fn(model, batch)"
            )
    return module.make_model, module.make_batch, module.loss_fn


def _call_user(path: str, what: str, fn):
    """Run code from the user's file; its failure is one line naming the file and the call, not a traceback."""
    try:
        return fn()
    except SlackswapError:
        raise
    except SystemExit as exc:  # sys.exit() in the user's code must not end slackswap silently
        raise ValidationError(
            f"{what} from {path!r} called sys.exit({exc.code!r}): the profile file must return, not exit"
        ) from None
    except Exception as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ValidationError(f"{what} from {path!r} failed: {type(exc).__name__}: {message}") from None


def run(args) -> int:
    check_output_paths(args.out)
    require("torch", "torch", "slackswap profile")
    from .. import api
    from ..hardware import get_hardware

    make_model, make_batch, loss_fn = load_user_file(args.file)
    hardware = get_hardware(args.hardware) if args.hardware is not None else None
    model = _call_user(args.file, "make_model()", make_model)
    batch = _call_user(args.file, "make_batch()", make_batch)
    with progress_reporter("profile", quiet=args.quiet) as report:
        report(0, None, f"{args.warmup} warm-up + {args.repeats} measured steps of {args.file}")
        workload = _call_user(args.file, "loss_fn(model, batch) during profiling", lambda: api.profile(
            model, batch, loss_fn, hardware=hardware, warmup=args.warmup, repeats=args.repeats))
    workload.save(args.out)
    if args.quiet:
        return 0
    if args.json:
        print_json({"out": args.out, "workload": workload.name, "ops": len(workload.ops),
                    "saved_tensors": len(workload.saved_tensors), "saved_bytes": workload.saved_bytes,
                    "ideal_step_time_s": workload.ideal_step_time_s, "times": workload.meta.get("times")})
        return 0
    print(f"{workload.name}: {len(workload.ops)} ops, {len(workload.saved_tensors)} saved tensors, "
          f"{format_bytes(workload.saved_bytes)} saved, step {format_seconds(workload.ideal_step_time_s)} "
          f"({workload.meta['times']}) -> {args.out}")
    return 0
