"""Field readers for the JSON loaders: each failure names the exact field and the fix."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from .errors import ValidationError

_REQUIRED = object()  # sentinel: the field has no default


def read_json_file(path: str | os.PathLike, what: str) -> Any:
    """Load a JSON file, turning every I/O or syntax problem into one ValidationError."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValidationError(f"{what} file {str(path)!r} does not exist: check the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValidationError(f"cannot read {what} file {str(path)!r}: {exc.__class__.__name__}: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValidationError(
            f"{what} file {str(path)!r} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
            "fix the file or export it again"
        ) from None


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write through a temporary file and rename, so a failure never leaves half a file."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class Fields:
    """Reads fields out of one JSON object, with the object's path for messages."""

    def __init__(self, obj: Any, where: str) -> None:
        if not isinstance(obj, dict):
            raise ValidationError(f"{where} must be a JSON object, got {type(obj).__name__}")
        self.obj = obj
        self.where = where
        self.used: set[str] = set()

    def _get(self, key: str, default: Any) -> Any:
        self.used.add(key)
        if key not in self.obj:
            if default is _REQUIRED:
                raise ValidationError(f"{self.where}.{key} is missing: add it")
            return default
        return self.obj[key]

    def str(self, key: str, default: Any = _REQUIRED) -> str:
        value = self._get(key, default)
        if not isinstance(value, str) or not value:
            raise ValidationError(f"{self.where}.{key} must be a non-empty string, got {value!r}")
        return value

    def opt_str(self, key: str) -> str | None:
        value = self._get(key, None)
        if value is not None and (not isinstance(value, str) or not value):
            raise ValidationError(f"{self.where}.{key} must be a non-empty string or null, got {value!r}")
        return value

    def number(self, key: str, *, positive: bool = False, default: Any = _REQUIRED,
               at_most: float | None = None) -> float:
        value = self._get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValidationError(f"{self.where}.{key} must be a number, got {value!r}")
        if not math.isfinite(value):
            raise ValidationError(f"{self.where}.{key} must be finite, got {value!r}")
        if value < 0 or (positive and value == 0):
            need = "positive" if positive else "zero or positive"
            raise ValidationError(f"{self.where}.{key} must be {need}, got {value!r}")
        if at_most is not None and value > at_most:
            raise ValidationError(f"{self.where}.{key} must be at most {at_most}, got {value!r}")
        return float(value)

    def int(self, key: str, *, positive: bool = False, default: Any = _REQUIRED, minimum: int | None = None) -> int:
        value = self._get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer() and math.isfinite(value):
                value = int(value)
            else:
                raise ValidationError(f"{self.where}.{key} must be an integer, got {value!r}")
        low = minimum if minimum is not None else (1 if positive else 0)
        if value < low:
            raise ValidationError(f"{self.where}.{key} must be at least {low}, got {value!r}")
        return value

    def str_list(self, key: str, default: Any = _REQUIRED) -> tuple[str, ...]:
        value = self._get(key, default)
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise ValidationError(f"{self.where}.{key} must be a list of non-empty strings, got {value!r}")
        return tuple(value)

    def list(self, key: str) -> list:
        value = self._get(key, _REQUIRED)
        if not isinstance(value, list):
            raise ValidationError(f"{self.where}.{key} must be a list, got {type(value).__name__}")
        return value

    def dict(self, key: str, default: Any = _REQUIRED) -> dict:
        value = self._get(key, default)
        if not isinstance(value, dict):
            raise ValidationError(f"{self.where}.{key} must be an object, got {type(value).__name__}")
        return value

    def no_extra(self) -> None:
        extra = sorted(set(self.obj) - self.used)
        if extra:
            raise ValidationError(f"{self.where} has unknown field {extra[0]!r}: remove it or check its spelling")

