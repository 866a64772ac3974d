"""`slackswap models`: list the built-in models and their default configuration."""

from __future__ import annotations

from .common import print_json


def register(subparsers) -> None:
    parser = subparsers.add_parser("models", help="list built-in models")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)


def run(args) -> int:
    from ..workloads.models import MODELS

    if args.json:
        print_json({name: spec.to_dict() for name, spec in MODELS.items()})
        return 0
    from ..report.console import render_table

    render_table(
        ("model", "layers", "hidden", "heads", "ffn", "vocab", "seq (tokens)", "micro-batch", "attention", "mlp", "norm", "dropout"),
        [(name, s.layers, s.hidden, s.heads, s.ffn, s.vocab, s.seq_len, s.micro_batch, s.attention, s.mlp, s.norm,
          "on" if s.dropout else "off") for name, s in MODELS.items()],
    )
    print("custom models: --model custom with --layers --hidden --heads --ffn --vocab --seq-len --micro-batch")
    return 0
