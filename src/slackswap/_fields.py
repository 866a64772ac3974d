"""Field readers for the JSON loaders: each failure names the exact field and the fix."""

from __future__ import annotations

import json
import math
import os
from typing import Any

from ._outputs import write_bytes_atomic, write_text_atomic  # noqa: F401 - re-exported for the savers
from .errors import ValidationError

_REQUIRED = object()  # sentinel: the field has no default

MAX_INT = 2**53
"""Largest integer a field accepts: beyond it JSON tools lose precision and byte counts are absurd (8 PiB)."""


def show(value: Any, limit: int = 60) -> str:
    """repr() for messages: one line, bounded length, safe for integers too long to print."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_json_text(text: Any, what: str) -> Any:
    """Parse JSON text (str or bytes), turning every problem into one ValidationError."""
    if not isinstance(text, (str, bytes, bytearray)):
        raise ValidationError(f"{what} JSON must be text (str or bytes), got {type(text).__name__}: "
                              f"for a dict use from_dict, for a file load")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValidationError(
            f"{what} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); fix it or export it again"
        ) from None
    except (ValueError, RecursionError) as exc:
        # Nesting deeper than Python's recursion limit, an integer over its digit limit, bad UTF-8.
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc).split(";")[0]
        raise ValidationError(f"{what} is not valid JSON for slackswap ({reason}); fix it or export it again") from None


MAX_INPUT_BYTES = 256 * 2**20
"""Largest JSON file read: about 10x the largest workload a built-in model makes (llama-7b's 32 layers
export to 184 KB, so the 4096-layer limit gives about 24 MB); a cap keeps /dev/zero or a wrong file
from exhausting memory."""


def read_json_file(path: str | os.PathLike, what: str) -> Any:
    """Load a JSON file, turning every I/O or syntax problem into one ValidationError."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_INPUT_BYTES + 1)
        if len(data) > MAX_INPUT_BYTES:
            raise ValidationError(
                f"{what} file {str(path)!r} is larger than {MAX_INPUT_BYTES // 2**20} MiB: it is not a slackswap "
                f"{what} file (check the path)"
            )
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise ValidationError(f"{what} file {str(path)!r} does not exist: check the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{exc.__class__.__name__}: {exc}"
        raise ValidationError(
            f"cannot read {what} file {str(path)!r}: {reason}; check it is a readable UTF-8 JSON file"
        ) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValidationError(
            f"{what} file {str(path)!r} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
            "fix the file or export it again"
        ) from None
    except (ValueError, RecursionError) as exc:
        # Nesting deeper than Python's recursion limit, or an integer over its digit limit.
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc).split(";")[0]
        raise ValidationError(
            f"{what} file {str(path)!r} is not valid JSON for slackswap ({reason}); fix the file or export it again"
        ) from None


def is_text(value: Any) -> bool:
    """A non-empty string that can be written out as UTF-8 (JSON allows lone surrogates such as "\\ud800")."""
    if type(value) is str and value and value.isascii():
        return True  # the common case, without encoding it (plans check every tensor name)
    if not isinstance(value, str) or not value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_text(value: Any, where: str) -> str:
    """``value`` if it is a non-empty string that can be written as UTF-8, else a ValidationError."""
    if not is_text(value):
        raise ValidationError(f"{where} must be a non-empty string, got {show(value)}")
    return value


def check_int(value: Any, where: str, *, minimum: int = 0) -> int:
    """``value`` if it is an int (not a bool) between ``minimum`` and 2**53, else a ValidationError."""
    if type(value) is int and minimum <= value <= MAX_INT:
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"{where} must be an integer, got {show(value)}")
    if value < minimum:
        raise ValidationError(f"{where} must be at least {minimum}, got {show(value)}")
    if value > MAX_INT:
        raise ValidationError(f"{where} must be at most {MAX_INT} (2**53), got {show(value)}")
    return value


def check_number(value: Any, where: str, *, positive: bool = False, at_most: float | None = None) -> float:
    """``value`` if it is a finite int or float (not a bool), >= 0 (> 0 when ``positive``), else a ValidationError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValidationError(f"{where} must be a number, got {show(value)}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an integer beyond the float range
        finite = False
    if not finite:
        raise ValidationError(f"{where} must be finite, got {show(value)}")
    if value < 0 or (positive and value == 0):
        need = "positive" if positive else "zero or positive"
        raise ValidationError(f"{where} must be {need}, got {show(value)}")
    if at_most is not None and value > at_most:
        raise ValidationError(f"{where} must be at most {at_most}, got {show(value)}")
    return value


def check_names(value: Any, where: str) -> tuple[str, ...]:
    """``value`` if it is a tuple of non-empty strings, else a ValidationError."""
    if not isinstance(value, tuple) or not all(is_text(v) for v in value):
        raise ValidationError(f"{where} must be a tuple of non-empty strings, got {show(value)}")
    return value


def json_int(value: Any) -> Any:
    """3.0 read as 3 (JSON writers may give either); anything else as it is, for the checks."""
    return int(value) if isinstance(value, float) and math.isfinite(value) and value.is_integer() else value


def json_float(value: Any) -> Any:
    """An integer read as a float where a float is meant; anything else as it is, for the checks."""
    return float(value) if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**1023 else value


def placed(exc: ValidationError, prefix: str, where: str) -> ValidationError:
    """A constructor's message (about ``prefix``) placed in the file being read (``where``)."""
    text = str(exc)
    return ValidationError(where + text[len(prefix):] if text.startswith(prefix) else f"{where}: {text}")


def check_json(value: Any, where: str) -> None:
    """A free-form field (meta, info) must be a dict of JSON values, or it could not be saved."""
    if not isinstance(value, dict):
        raise ValidationError(f"{where} must be a dict, got {type(value).__name__}")
    try:
        json.dumps(value)
    except (TypeError, ValueError, RecursionError) as exc:
        reason = (str(exc).splitlines() or [type(exc).__name__])[0][:120]
        raise ValidationError(
            f"{where} must hold only JSON values (dict, list, str, number, bool, None): {reason}"
        ) from None


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

    def raw(self, key: str) -> Any:
        """The value of a required field as it is, for a constructor that checks it."""
        return self._get(key, _REQUIRED)

    def str(self, key: str, default: Any = _REQUIRED) -> str:
        return check_text(self._get(key, default), f"{self.where}.{key}")

    def opt_str(self, key: str) -> str | None:
        value = self._get(key, None)
        if value is not None and not is_text(value):
            raise ValidationError(f"{self.where}.{key} must be a non-empty string or null, got {show(value)}")
        return value

    def number(self, key: str, *, positive: bool = False, default: Any = _REQUIRED,
               at_most: float | None = None) -> float:
        return float(check_number(self._get(key, default), f"{self.where}.{key}", positive=positive, at_most=at_most))

    def int(self, key: str, *, positive: bool = False, default: Any = _REQUIRED, minimum: int | None = None) -> int:
        value = self._get(key, default)
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)  # JSON writers may give 3.0 for 3
        low = minimum if minimum is not None else (1 if positive else 0)
        return check_int(value, f"{self.where}.{key}", minimum=low)

    def str_list(self, key: str, default: Any = _REQUIRED) -> tuple[str, ...]:
        value = self._get(key, default)
        if not isinstance(value, list) or not all(is_text(v) for v in value):
            raise ValidationError(f"{self.where}.{key} must be a list of non-empty strings, got {show(value)}")
        return tuple(value)

    def list(self, key: str, default: Any = _REQUIRED) -> list:
        value = self._get(key, default)
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

