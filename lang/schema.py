"""`gen(json_schema=...)` accepts a dict, a JSON string, or a class; this turns any of them into schema text.

Classes: a pydantic model (its own `model_json_schema()`), a dataclass or a TypedDict (their type hints mapped
here: str/int/float/bool/None, list[...], dict[str, ...], Optional/Union, Literal, Enum, nested classes).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

_SCALARS: dict[Any, dict[str, Any]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    type(None): {"type": "null"},
    Any: {},
}


def schema_text(schema: Any) -> str:
    """Normalise a schema given as dict, JSON text or class to compact JSON text."""
    if isinstance(schema, str):
        try:
            json.loads(schema)
        except json.JSONDecodeError as exc:
            raise ValueError(f"json_schema is not valid JSON: {exc}") from None
        return schema
    if isinstance(schema, dict):
        return json.dumps(schema)
    if isinstance(schema, type):
        return json.dumps(class_schema(schema))
    raise TypeError(
        "json_schema must be a dict, a JSON string, or a dataclass / TypedDict / pydantic model class, "
        f"got {type(schema).__name__}"
    )


def class_schema(cls: type) -> dict[str, Any]:
    if hasattr(cls, "model_json_schema"):  # pydantic v2
        return cls.model_json_schema()
    if dataclasses.is_dataclass(cls) or _is_typeddict(cls):
        return _object_schema(cls)
    raise TypeError(f"{cls.__name__} is not a dataclass, TypedDict or pydantic model")


def _is_typeddict(cls: type) -> bool:
    return isinstance(cls, type) and issubclass(cls, dict) and hasattr(cls, "__required_keys__")


def _object_schema(cls: type) -> dict[str, Any]:
    hints = get_type_hints(cls)
    if dataclasses.is_dataclass(cls):
        names = [f.name for f in dataclasses.fields(cls)]
        required = [
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
    else:
        names = list(hints)
        required_keys: frozenset[str] = cls.__required_keys__  # type: ignore[attr-defined]  # TypedDict only
        required = [n for n in names if n in required_keys]
    return {
        "type": "object",
        "properties": {name: type_schema(hints[name]) for name in names},
        "required": required,
        "additionalProperties": False,
    }


def type_schema(tp: Any) -> dict[str, Any]:
    """JSON Schema of one Python type hint."""
    if tp in _SCALARS:
        return dict(_SCALARS[tp])
    origin = get_origin(tp)
    args = get_args(tp)
    if origin in (list, tuple, set, frozenset, typing.Sequence):
        if origin is tuple and args and args[-1] is not Ellipsis:
            return {"type": "array", "prefixItems": [type_schema(a) for a in args], "minItems": len(args),
                    "maxItems": len(args)}
        return {"type": "array", "items": type_schema(args[0]) if args else {}}
    if origin is dict:
        return {"type": "object", "additionalProperties": type_schema(args[1]) if args else {}}
    if origin is Literal:
        return {"enum": list(args)}
    if origin is Union or (hasattr(types, "UnionType") and origin is types.UnionType):
        return {"anyOf": [type_schema(a) for a in args]}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"enum": [member.value for member in tp]}
    if isinstance(tp, type):
        return class_schema(tp)
    raise TypeError(f"cannot express type {tp!r} as a JSON Schema")
