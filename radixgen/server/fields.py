"""Typed reads of a JSON request body: each read checks type and range and raises a 400 naming the field.

`Fields(body, "sampling_params")` reads `sampling_params.temperature` and so on; booleans never pass as
numbers, and NaN or infinite numbers never pass at all.
"""

from __future__ import annotations

import math
from typing import Any

import orjson

from radixgen.server.errors import bad_request

_MISSING = object()


def parse_json_object(raw: bytes, what: str = "body") -> dict:
    """The request body as a dict, or a 400 saying why it is not one."""
    if not raw:
        raise bad_request(what, "the request body is empty; expected a JSON object")
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(what, f"invalid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise bad_request(what, f"expected a JSON object, got {_kind(value)}")
    return value


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null",
            int: "an integer", float: "a number"}.get(type(value), type(value).__name__)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class Fields:
    """Reads fields of one JSON object (`where` is its path, for messages) and remembers which were read."""

    def __init__(self, data: dict, where: str = "") -> None:
        self.data = data
        self.where = where
        self.read: set[str] = set()

    def path(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def raw(self, name: str, default: Any = None) -> Any:
        self.read.add(name)
        value = self.data.get(name, default)
        return default if value is None else value

    def has(self, name: str) -> bool:
        return self.data.get(name) is not None

    def boolean(self, name: str, default: bool = False) -> bool:
        value = self.raw(name, default)
        if not isinstance(value, bool):
            raise bad_request(self.path(name), f"must be a boolean, got {_kind(value)}")
        return value

    def integer(self, name: str, default: Any = None, low: int | None = None, high: int | None = None) -> Any:
        value = self.raw(name, default)
        if value is None:
            return None
        if not is_int(value):
            raise bad_request(self.path(name), f"must be an integer, got {_kind(value)}")
        if low is not None and value < low:
            raise bad_request(self.path(name), f"must be >= {low}, got {value}")
        if high is not None and value > high:
            raise bad_request(self.path(name), f"must be <= {high}, got {value}")
        return value

    def number(self, name: str, default: Any = None, low: float | None = None, high: float | None = None,
               low_open: bool = False) -> Any:
        value = self.raw(name, default)
        if value is None:
            return None
        if not is_number(value):
            raise bad_request(self.path(name), f"must be a finite number, got {_kind(value)}")
        too_low = low is not None and (value <= low if low_open else value < low)
        if too_low or (high is not None and value > high):
            left = "(" if low_open else "["
            raise bad_request(self.path(name), f"must be in {left}{low}, {high}], got {value}")
        return float(value)

    def string(self, name: str, default: Any = None, nonempty: bool = False) -> Any:
        value = self.raw(name, default)
        if value is None:
            return None
        if not isinstance(value, str):
            raise bad_request(self.path(name), f"must be a string, got {_kind(value)}")
        if nonempty and not value:
            raise bad_request(self.path(name), "must not be empty")
        return value

    def obj(self, name: str) -> dict | None:
        value = self.raw(name)
        if value is not None and not isinstance(value, dict):
            raise bad_request(self.path(name), f"must be an object, got {_kind(value)}")
        return value

    def reject_unknown(self, allowed: frozenset[str] | set[str]) -> None:
        """A 400 for the first field not in `allowed` (a typo must not be silently ignored)."""
        for name in self.data:
            if name not in allowed:
                raise bad_request(self.path(name), f"unknown field; known fields: {sorted(allowed)}")


def token_id_list(value: Any, path: str, vocab_size: int) -> list[int]:
    """A non-empty list of token ids in [0, vocab_size)."""
    if not isinstance(value, list) or not value:
        raise bad_request(path, f"must be a non-empty array of token ids, got {_kind(value)}")
    for i, t in enumerate(value):
        if not is_int(t) or not 0 <= t < vocab_size:
            raise bad_request(f"{path}[{i}]", f"must be a token id in [0, {vocab_size}), got {t!r}")
    return value
