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
    print(f"{'model':<11} {'layers':>6} {'hidden':>6} {'heads':>5} {'ffn':>6} {'vocab':>6} {'seq':>5} {'batch':>5}  attention  mlp     norm       dropout")
    for name, s in MODELS.items():
        print(f"{name:<11} {s.layers:>6} {s.hidden:>6} {s.heads:>5} {s.ffn:>6} {s.vocab:>6} {s.seq_len:>5} {s.micro_batch:>5}  "
              f"{s.attention:<9}  {s.mlp:<6}  {s.norm:<9}  {'on' if s.dropout else 'off'}")
    print("custom models: --model custom with --layers --hidden --heads --ffn --vocab --seq-len --micro-batch")
    return 0
