"""The Avro type of an enriched record's added field, from the JSON Schema of what it holds.

An answer a `response_format` gives is an object; in an Avro source's output schema it is a
record whose fields are the object's properties, so the enriched topic's readers get typed
fields rather than JSON text. The JSON Schema subset a model's structured answer uses maps
one to one:

    object with properties   record (a property not `required`: a union with null, default null)
    object with only additionalProperties: a schema   map of that type
    array with items         array
    string / enum of strings string
    integer / number         long / double
    boolean / null           boolean / null
    [T, "null"]              a union with null

Anything else (`anyOf`, `$ref`, an object without properties, a name Avro cannot hold) has no
Avro type here: `avro_type` returns None, and the field is then an optional string holding the
value's JSON text, as for a plain `json_object` answer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["avro_type"]

_AVRO_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SCALARS = {"string": "string", "integer": "long", "number": "double", "boolean": "boolean", "null": "null"}


def avro_type(schema: Mapping[str, Any], name: str) -> Any | None:
    """The Avro type of values `schema` describes, its records named from `name` (a valid
    Avro name, unique in the output schema); None when it has none."""
    if not _AVRO_NAME.match(name):
        return None
    kind = schema.get("type")
    if isinstance(kind, list):
        others = [k for k in kind if k != "null"]
        if len(others) != 1 or len(kind) != 2:
            return None
        inner = avro_type({**schema, "type": others[0]}, name)
        return None if inner is None or isinstance(inner, list) else ["null", inner]
    if "enum" in schema and kind in (None, "string"):
        symbols = schema["enum"]
        return "string" if isinstance(symbols, list) and all(isinstance(s, str) for s in symbols) else None
    if isinstance(kind, str) and kind in _SCALARS:
        return _SCALARS[kind]
    if kind == "array":
        items = schema.get("items")
        item_type = avro_type(items, f"{name}_item") if isinstance(items, Mapping) else None
        return None if item_type is None else {"type": "array", "items": item_type}
    if kind == "object":
        return _object(schema, name)
    return None


def _object(schema: Mapping[str, Any], name: str) -> Any | None:
    properties = schema.get("properties")
    if not properties:
        values = schema.get("additionalProperties")
        value_type = avro_type(values, f"{name}_value") if isinstance(values, Mapping) else None
        return None if value_type is None else {"type": "map", "values": value_type}
    if not isinstance(properties, Mapping):
        return None
    required = set(schema.get("required") or ())
    fields = []
    for prop, prop_schema in properties.items():
        if not isinstance(prop_schema, Mapping) or not _AVRO_NAME.match(prop):
            return None
        prop_type = avro_type(prop_schema, f"{name}_{prop}")
        if prop_type is None:
            return None
        if prop in required:
            fields.append({"name": prop, "type": prop_type})
        elif isinstance(prop_type, list):  # already a union with null
            fields.append({"name": prop, "type": prop_type, "default": None})
        else:
            fields.append({"name": prop, "type": ["null", prop_type], "default": None})
    return {"type": "record", "name": name, "fields": fields}
