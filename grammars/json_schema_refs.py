"""References inside one JSON Schema document: `$ref` (JSON pointers, `$anchor`, plain-name `$id`), and
`$dynamicRef` / `$recursiveRef`, which in a document of one schema resource resolve like `$ref` (the dynamic
scope then holds only that resource); in a document embedding other resources they are refused. Also: the
draft a document is written in, read from its `$schema`."""

from __future__ import annotations

from typing import Any

from .json_schema_merge import Schema, json_pointer_get
from .json_schema_report import SchemaError
from .json_schema_text import escape_pointer

# Drafts by the year or number their meta-schema URI names; without `$schema`, the latest (as `jsonschema` does).
DRAFT_MARKERS = (("draft-03", 4), ("draft-04", 4), ("draft-06", 6), ("draft-07", 7), ("2019-09", 2019),
                 ("2020-12", 2020))
LATEST_DRAFT = 2020


def draft_of(root: Schema) -> int:
    uri = root.get("$schema") if isinstance(root, dict) else None
    if isinstance(uri, str):
        for marker, draft in DRAFT_MARKERS:
            if marker in uri:
                return draft
    return LATEST_DRAFT


class References:
    """The targets of one document's references, with anchor tables built on first use."""

    def __init__(self, root: Schema) -> None:
        self.root = root
        self._anchors: dict[str, str] | None = None
        self._dynamic_anchors: dict[str, list[str]] | None = None
        self._embedded: bool | None = None

    def resolve(self, ref: Any, ptr: str) -> tuple[str, Schema]:
        """(pointer, subschema) that `ref` names."""
        if not isinstance(ref, str):
            raise SchemaError(f"{ptr or '/'}: $ref must be a string")
        base, _, fragment = ref.partition("#")
        root_id = self.root.get("$id", self.root.get("id", "")) if isinstance(self.root, dict) else ""
        if base and base != str(root_id).partition("#")[0]:
            raise SchemaError(f"{ptr or '/'}: $ref {ref!r} points outside this document")
        if fragment and not fragment.startswith("/"):
            anchors = self.anchor_table()
            if fragment not in anchors:
                raise SchemaError(f"{ptr or '/'}: $ref {ref!r}: no $anchor or id named {fragment!r}")
            fragment = anchors[fragment]
        try:
            return fragment, json_pointer_get(self.root, fragment)
        except (KeyError, IndexError, ValueError) as exc:
            raise SchemaError(f"{ptr or '/'}: $ref {ref!r} does not resolve") from exc

    def resolve_dynamic(self, keyword: str, ref: Any, ptr: str) -> tuple[str, Schema]:
        """`$dynamicRef` / `$recursiveRef` in a one-resource document: the `$dynamicAnchor` of that name (the
        outermost in scope is the only one), else what `$ref` would name; `$recursiveRef` is always `#`."""
        if self.embeds_resources():
            raise SchemaError(f"{ptr or '/'}: {keyword} in a document that embeds other schema resources "
                              f"(nested $id) is not supported")
        if keyword == "$recursiveRef":
            return self.resolve("#", ptr)
        if isinstance(ref, str) and ref.startswith("#") and not ref.startswith("#/"):
            places = self.dynamic_anchor_table().get(ref[1:], [])
            if len(places) > 1:
                raise SchemaError(f"{ptr or '/'}: $dynamicRef {ref!r}: several $dynamicAnchors of that name")
            if places:
                return places[0], json_pointer_get(self.root, places[0])
        return self.resolve(ref, ptr)

    def anchor_table(self) -> dict[str, str]:
        if self._anchors is None:
            self._anchors = {}
            for node, at in _walk(self.root):
                for key in ("$anchor", "$id", "id", "$dynamicAnchor"):
                    value = node.get(key)
                    if isinstance(value, str) and value:
                        self._anchors.setdefault(value.lstrip("#"), at)
        return self._anchors

    def dynamic_anchor_table(self) -> dict[str, list[str]]:
        if self._dynamic_anchors is None:
            self._dynamic_anchors = {}
            for node, at in _walk(self.root):
                value = node.get("$dynamicAnchor")
                if isinstance(value, str):
                    self._dynamic_anchors.setdefault(value, []).append(at)
        return self._dynamic_anchors

    def embeds_resources(self) -> bool:
        """Whether a subschema below the root has its own `$id` (not a plain-name fragment)."""
        if self._embedded is None:
            self._embedded = any(
                at and isinstance(node.get("$id"), str) and not node["$id"].startswith("#")
                for node, at in _walk(self.root))
        return self._embedded


def _walk(root: Any) -> list[tuple[dict[str, Any], str]]:
    """Every object in the document with its JSON pointer (enum and const values included: harmless)."""
    out: list[tuple[dict[str, Any], str]] = []
    stack: list[tuple[Any, str]] = [(root, "")]
    while stack:
        node, at = stack.pop()
        if isinstance(node, dict):
            out.append((node, at))
            stack.extend((v, f"{at}/{escape_pointer(k)}") for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, f"{at}/{i}") for i, v in enumerate(node))
    return out
