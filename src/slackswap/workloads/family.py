"""ModelFamily: what the model registry (workloads/families.py) needs to know about one kind of model.

A family is a configuration type (a frozen dataclass with a ``name`` field; its other fields are
the settings a user may override, ``--layers`` and the like on the command line), its built-in
models, and a builder that turns one configuration into a Workload timed on a Hardware.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..errors import ValidationError
from ..hardware import Hardware
from ..workload import Workload

Builder = Callable[..., Workload]
"""``build(spec, hardware, *, name, meta) -> Workload``: the workload must be called ``name`` and
carry ``meta`` (build_model_workload makes both, so every family labels and describes its
workloads the same way)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelFamily:
    name: str
    """Written to each workload's ``meta['kind']``."""
    spec_type: type
    """The configuration dataclass; it has a ``name`` field and a ``to_dict()`` method."""
    models: Mapping[str, Any]
    """Built-in models: name -> configuration."""
    sources: Mapping[str, str]
    """Built-in model name -> where its configuration comes from (configs, papers, recipes)."""
    build: Builder
    assumptions: Callable[[Any], list[str]] = lambda spec: []
    """One line per modelling assumption, written to ``meta['assumptions']`` for reports."""
    custom_name: str | None = None
    """A model name that builds a configuration from the overrides alone (``custom``)."""
    required_for_custom: tuple[str, ...] = ()
    """Settings ``custom_name`` needs."""

    def __post_init__(self) -> None:
        if not (isinstance(self.spec_type, type) and dataclasses.is_dataclass(self.spec_type)
                and "name" in {f.name for f in dataclasses.fields(self.spec_type)}):
            raise ValidationError(f"model family {self.name!r}: spec_type must be a dataclass with a name field")
        for model, spec in self.models.items():
            if not isinstance(spec, self.spec_type) or spec.name != model:
                raise ValidationError(
                    f"model family {self.name!r}: built-in {model!r} must be a {self.spec_type.__name__} named {model!r}"
                )

    def settings(self) -> tuple[str, ...]:
        """The configuration fields a user may override (every field but ``name``)."""
        return tuple(f.name for f in dataclasses.fields(self.spec_type) if f.name != "name")

    def owns(self, model: str) -> bool:
        return model in self.models or model == self.custom_name
