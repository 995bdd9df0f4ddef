"""`check-config`'s look at a source through the registry: the fields its placeholders read must
be fields of its subject's latest schema, and an Avro output schema must be compatible with the
output subject's. What cannot be looked at (no registry, no subject yet) is said, not refused."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from consumer.core.errors import PromptbusError, RegistryUnavailable
from consumer.registry.client import RegisteredSchema, SchemaNotFound, SchemaRegistry

__all__ = ["check_source", "schema_paths"]


def schema_paths(schema: RegisteredSchema) -> set[str] | None:
    """Every dotted field path a schema's records have (None: it says nothing that can be walked)."""
    if schema.schema_type == "PROTOBUF":
        from consumer.registry.protobuf import ProtoSchema

        return _message_paths(ProtoSchema(schema.text).descriptor((0,)), "")
    tree = orjson.loads(schema.text)
    if schema.schema_type == "AVRO":
        return _avro_paths(tree, "", {})
    return _json_schema_paths(tree, "")


def _avro_paths(node: Any, prefix: str, named: dict[str, Any]) -> set[str]:
    if isinstance(node, list):  # a union: the paths of each branch
        return set().union(*(_avro_paths(branch, prefix, named) for branch in node))
    if isinstance(node, str):
        return _avro_paths(named[node], prefix, named) if node in named else set()
    if not isinstance(node, dict):
        return set()
    if node.get("type") == "record":
        named[node.get("name", "")] = node
        if node.get("namespace"):
            named[f"{node['namespace']}.{node.get('name', '')}"] = node
        out: set[str] = set()
        for field in node.get("fields", []):
            path = f"{prefix}{field['name']}"
            out.add(path)
            out |= _avro_paths(field["type"], path + ".", named)
        return out
    if node.get("type") in ("array", "map"):
        return set()
    inner = node.get("type")
    return _avro_paths(inner, prefix, named) if isinstance(inner, (dict, list)) else set()


def _json_schema_paths(node: Any, prefix: str) -> set[str]:
    if not isinstance(node, dict):
        return set()
    out: set[str] = set()
    for name, sub in (node.get("properties") or {}).items():
        path = f"{prefix}{name}"
        out.add(path)
        out |= _json_schema_paths(sub, path + ".")
    return out


def _message_paths(descriptor: Any, prefix: str, depth: int = 0) -> set[str]:
    out: set[str] = set()
    for field in descriptor.fields:
        path = f"{prefix}{field.name}"
        out.add(path)
        if field.message_type is not None and depth < 8:
            out |= _message_paths(field.message_type, path + ".", depth + 1)
    return out


def _open_ended(schema: RegisteredSchema, path: str) -> bool:
    """A JSON Schema object without properties takes any field below it."""
    return schema.schema_type == "JSON" and "." in path


async def check_source(
    registry: SchemaRegistry, name: str, config: Any, read_paths: Iterable[str]
) -> tuple[list[str], list[str]]:
    """(problems, notes) of source `name` (`consumer.settings.sources.SourceConfig`) against
    the registry: each path the job reads must be in the latest schema of the source topic's
    subject (inside `after` for a Debezium envelope); the Avro output schema (the input's plus
    the field) must be one the output subject takes."""
    subject = f"{config.topic}-value"
    problems: list[str] = []
    try:
        latest = await registry.latest(subject)
    except SchemaNotFound:
        return [], [f"source {name}: subject {subject} has no schema yet: its fields are not checked"]
    except RegistryUnavailable as exc:
        return [], [f"source {name}: not checked against the registry: {exc}"]
    try:
        paths = schema_paths(latest)
    except (PromptbusError, ValueError, KeyError) as exc:
        return [f"sources.{name}: the latest schema of {subject} cannot be read: {exc}"], []
    if paths is not None:
        prefix = "after." if config.envelope == "debezium" else ""
        for path in read_paths:
            if prefix + path not in paths and not _open_ended(latest, path):
                problems.append(
                    f"sources.{name}: the job reads {path!r}, which is not a field of the latest "
                    f"schema of subject {subject} (id {latest.schema_id})"
                )
    notes = [f"source {name}: its fields are in subject {subject} (schema id {latest.schema_id})"]
    if config.format == "avro" and config.into.format == "same":
        from consumer.registry.codecs import avro_output_schema

        text = avro_output_schema(latest.text, config.output_fields(), config.output_schemas())
        out_subject = f"{config.into.topic}-value"
        try:
            if not await registry.compatible(out_subject, "AVRO", text):
                problems.append(
                    f"sources.{name}.into: the output schema (the input's plus {config.into.field!r}) is not "
                    f"compatible with the latest schema of subject {out_subject}"
                )
        except (RegistryUnavailable, PromptbusError) as exc:
            notes.append(f"source {name}: output compatibility not checked: {exc}")
    return problems, notes
