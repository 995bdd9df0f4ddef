"""Generate the reference tables of docs/configuration.md from the schemas.

    python -m consumer.docs_tables            # rewrite the tables between the marker comments
    python -m consumer.docs_tables --check    # exit 1 when a table differs (drift)

Each table sits between `<!-- BEGIN GENERATED: NAME -->` and `<!-- END GENERATED -->`; the
text between is rewritten, everything else is left as it is. The tier-file table comes from
the tier-file JSON Schema (`consumer.schemas`, the text of `schemas/tier_file.schema.json`),
the environment table from the settings model; the descriptions are the fields' own.
`tests/unit/test_docs.py` fails on drift. A tool of the repository, like `consumer.schemas`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pydantic import AliasChoices

from consumer import schemas
from consumer.settings import Settings

__all__ = [
    "DEFAULT_PATH",
    "TABLES",
    "deployment_table",
    "environment_table",
    "lane_table",
    "main",
    "quota_table",
    "render",
    "tenant_table",
    "tier_file_table",
]

#: docs/configuration.md at the repository root.
DEFAULT_PATH = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"

_BLOCK = re.compile(r"(<!-- BEGIN GENERATED: (?P<name>[\w-]+) -->\n).*?(<!-- END GENERATED -->)", re.DOTALL)
_BOUNDS = {
    "minimum": ">= {}",
    "exclusiveMinimum": "> {}",
    "maximum": "<= {}",
    "exclusiveMaximum": "< {}",
    "minLength": "min length {}",
    "minProperties": "at least {} entries",
}


def _code(value: Any) -> str:
    """A default as a tier file spells it: strings bare, everything else as JSON."""
    return f"`{value}`" if isinstance(value, str) else f"`{json.dumps(value)}`"


def _type(prop: dict[str, Any]) -> str:
    """One property's type as the table shows it: `a` / `b` for enums, bounds after the type."""
    if "anyOf" in prop:
        kinds = [_type(p) for p in prop["anyOf"] if p.get("type") != "null"]
        nullable = any(p.get("type") == "null" for p in prop["anyOf"])
        return " or ".join(kinds) + (" or null" if nullable else "")
    if "enum" in prop:
        return " / ".join(f"`{v}`" for v in prop["enum"])
    if "$ref" in prop:
        return "object"
    kind = "secret string" if prop.get("format") == "password" else str(prop.get("type", "any"))
    bounds = [fmt.format(prop[key]) for key, fmt in _BOUNDS.items() if key in prop]
    return ", ".join([kind, *bounds])


def _default(prop: dict[str, Any]) -> str:
    if "default" not in prop:
        return "required" if prop.get("type") != "object" else "`{}`"
    value = prop["default"]
    if value is None:
        return "null"
    return "(below)" if isinstance(value, dict) else _code(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


_Row = tuple[tuple[str, ...], dict[str, Any]]


def _rows(schema: dict[str, Any], defs: dict[str, Any], path: tuple[str, ...]) -> Iterator[_Row]:
    """(dotted path, property) for every property, nested objects after their own row."""
    for name, prop in schema.get("properties", {}).items():
        yield (*path, name), prop
        refs = [p["$ref"] for p in [prop, *prop.get("anyOf", [])] if "$ref" in p]
        if refs:
            yield from _rows(defs[refs[0].rsplit("/", 1)[-1]], defs, (*path, name))


def _table(header: str, rows: list[str]) -> str:
    return "\n".join([header, "| --- | --- | --- | --- |", *rows]) + "\n"


def _tier_file_rows(model: str) -> str:
    """Every key of one tier-file model (`$defs[model]`), its type, default and description."""
    schema = json.loads(schemas.generate()["tier_file.schema.json"])
    defs = schema["$defs"]
    lines = [
        f"| `{'.'.join(path)}` | {_cell(_type(prop))} | {_cell(_default(prop))} "
        f"| {_cell(prop.get('description', ''))} |"
        for path, prop in _rows(defs[model], defs, ())
    ]
    return _table("| key | type | default | what |", lines)


def tier_file_table() -> str:
    """Every key of a tier (`tiers.NAME.KEY`), its type, default and description."""
    return _tier_file_rows("TierConfig")


def lane_table() -> str:
    """Every key of a lane (`lanes.NAME.KEY`), its type, default and description."""
    return _tier_file_rows("LaneConfig")


def deployment_table() -> str:
    """Every key of a tier's deployment (`tiers.NAME.deployments[i].KEY`)."""
    return _tier_file_rows("DeploymentConfig")


def tenant_table() -> str:
    """Every key of a tenant (`tenants.NAME.KEY`), its type, default and description."""
    return _tier_file_rows("TenantConfig")


def quota_table() -> str:
    """Every key of a fleet quota (`quotas.NAME.KEY`), its type, default and description."""
    return _tier_file_rows("QuotaConfig")


def _env_names(path: tuple[str, ...]) -> str:
    """The variable(s) behind a settings path; a field with alias choices has several."""
    field = Settings.model_fields.get(path[0])
    alias = field.validation_alias if field is not None else None
    if isinstance(alias, AliasChoices) and len(path) == 1:
        return " or ".join(f"`{choice}`" for choice in alias.choices)
    return "`PROMPTBUS_" + "__".join(part.upper() for part in path) + "`"


def environment_table() -> str:
    """Every environment variable of the settings, its type, default and description."""
    schema = Settings.model_json_schema(mode="validation")
    defs = schema.get("$defs", {})
    by_alias = {
        str(f.validation_alias.choices[0]): n
        for n, f in Settings.model_fields.items()
        if isinstance(f.validation_alias, AliasChoices)
    }
    lines = []
    for path, prop in _rows(schema, defs, ()):
        if "$ref" in prop:
            continue  # a nested group: its variables follow, each with its own row
        path = (by_alias.get(path[0], path[0]), *path[1:])
        default = "unset" if prop.get("default", ...) is None else _default(prop)
        lines.append(
            f"| {_env_names(path)} | {_cell(_type(prop))} | {_cell(default)} "
            f"| {_cell(prop.get('description', ''))} |"
        )
    return _table("| variable | type | default | what |", lines)


#: marker name -> the function that writes its table.
TABLES: dict[str, Callable[[], str]] = {
    "tier-file": tier_file_table,
    "lanes": lane_table,
    "tenants": tenant_table,
    "quotas": quota_table,
    "deployments": deployment_table,
    "environment": environment_table,
}


def render(text: str) -> str:
    """`text` with every generated block rewritten; ValueError for a marker of no table, or
    a table whose marker is missing."""
    seen: set[str] = set()

    def fill(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in TABLES:
            raise ValueError(f"unknown generated table {name!r} (known: {', '.join(TABLES)})")
        seen.add(name)
        return match.group(1) + TABLES[name]() + match.group(3)

    out = _BLOCK.sub(fill, text)
    missing = set(TABLES) - seen
    if missing:
        raise ValueError(f"no marker for table(s): {', '.join(sorted(missing))}")
    return out


def main(argv: list[str] | None = None) -> int:
    """Rewrite the tables (or, with --check, compare them); returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m consumer.docs_tables", description=__doc__)
    parser.add_argument("--path", type=Path, default=DEFAULT_PATH, help="default: docs/configuration.md")
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 on drift")
    args = parser.parse_args(argv)
    current = args.path.read_text(encoding="utf-8")
    expected = render(current)
    if expected == current:
        return 0
    if args.check:
        print(f"{args.path}: tables out of date; run: python -m consumer.docs_tables", file=sys.stderr)
        return 1
    args.path.write_text(expected, encoding="utf-8")
    print(f"wrote {args.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
