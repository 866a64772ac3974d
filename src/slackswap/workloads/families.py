"""The model-family registry: a new family is one module defining a ModelFamily and one line here.

``build_model_workload`` (workloads/models.py) finds a model name's family here, so the API
(``slackswap.plan('name')``) and the CLI (``--model name``) build every family the same way.
"""

from __future__ import annotations

from typing import Any

from ..errors import UnknownNameError, ValidationError
from .family import ModelFamily
from .transformer_family import TRANSFORMER

FAMILIES: dict[str, ModelFamily] = {
    "transformer": TRANSFORMER,
}


def model_names() -> list[str]:
    """Every built-in model name, family by family in registry order."""
    return [name for family in FAMILIES.values() for name in family.models]


def family_of(model: str) -> ModelFamily:
    """The family that builds ``model`` (a built-in name or a family's custom name)."""
    owners = [family for family in FAMILIES.values() if isinstance(model, str) and family.owns(model)]
    if len(owners) > 1:
        raise ValidationError(
            f"model {model!r} is claimed by the families {', '.join(f.name for f in owners)}: rename one of them"
        )
    if not owners:
        customs = [f.custom_name for f in FAMILIES.values() if f.custom_name]
        raise UnknownNameError(
            f"unknown model {model!r}: choose one of {', '.join(model_names())}"
            + (f", or {' / '.join(customs)} with every size flag" if customs else "")
        )
    return owners[0]


def family_of_spec(spec: Any) -> ModelFamily:
    """The family whose configuration type ``spec`` is."""
    for family in FAMILIES.values():
        if isinstance(spec, family.spec_type):
            return family
    raise ValidationError(
        f"no model family builds a {type(spec).__name__}: register its family in slackswap.workloads.families"
    )
