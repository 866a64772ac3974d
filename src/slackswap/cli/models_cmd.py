"""`slackswap models`: list the built-in models and their default configuration."""

from __future__ import annotations

from .common import print_json


def register(subparsers) -> None:
    parser = subparsers.add_parser("models", help="list built-in models")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)


def run(args) -> int:
    from ..workloads.families import FAMILIES
    from ..workloads.models import MODELS

    if args.json:
        print_json({name: spec.to_dict() for family in FAMILIES.values() for name, spec in family.models.items()})
        return 0
    from ..report.console import render_table

    render_table(
        ("model", "layers", "hidden", "heads", "kv heads", "ffn", "vocab", "seq (tokens)", "micro-batch", "attention",
         "mlp", "norm", "dropout", "layout"),
        [(name, s.layers, s.hidden, s.heads, s.num_kv_heads, s.ffn, s.vocab, s.seq_len, s.micro_batch, s.attention,
          s.mlp, s.norm, "on" if s.dropout else "off", _layout(s)) for name, s in MODELS.items()],
    )
    for family in FAMILIES.values():
        if family.name != "transformer":
            for name, spec in family.models.items():
                settings = ", ".join(f"{key}={getattr(spec, key)}" for key in family.settings())
                print(f"{name} ({family.name} family): {settings}")
    print("custom models: --model custom with --layers --hidden --heads --ffn --vocab --seq-len --micro-batch")
    print("parallel layouts (one rank's workload): --tp N [--sp] --cp N --pp N --pp-stage N --kv-heads N")
    return 0


def _layout(spec) -> str:
    parts = [f"{flag}={value}" for flag, value in (("tp", spec.tensor_parallel), ("cp", spec.context_parallel),
                                                   ("pp", spec.pipeline_parallel)) if value > 1]
    if spec.sequence_parallel:
        parts.append("sp")
    return " ".join(parts) or "1 GPU"
