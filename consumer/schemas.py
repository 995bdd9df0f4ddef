"""Generate `schemas/*.json` from the message and tier-file models, and the Helm chart's
`values.schema.json` from the chart's values, the tier file and the environment settings.

    python -m consumer.schemas            # write them (relative to the repo root)
    python -m consumer.schemas --check    # exit 1 when one differs (drift)

Job and the tier file are described as they are read (validation); Result and DeadLetter
as they are written (serialization). The chart's schema holds the tier file's under `tiers`
and the settings' under `settings`, so `helm install` refuses a tier-file mistake in the
words a JSON Schema validator uses, naming the key. `tests/unit/test_schemas.py` fails on
drift. A tool of the repository, outside `consumer.core`: it parses arguments and writes files.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, BaseModel

from consumer.core.jobs import DeadLetter, Job, Result
from consumer.settings import ChartValues, Settings, TierFile

__all__ = ["CHART_SCHEMA", "DEFAULT_DIR", "chart_values_schema", "generate", "main"]

#: schemas/ at the repository root (consumer/schemas.py -> ../schemas).
DEFAULT_DIR = Path(__file__).resolve().parents[1] / "schemas"
#: the chart's values schema, beside its values.yaml
CHART_SCHEMA = Path(__file__).resolve().parents[1] / "deploy" / "helm" / "promptbus" / "values.schema.json"
_DIALECT = "https://json-schema.org/draft/2020-12/schema"

_MODELS: dict[str, tuple[type[BaseModel], str, str]] = {
    "job.schema.json": (Job, "validation", "A job read from the jobs topic (promptbus.jobs)."),
    "result.schema.json": (Result, "serialization", "A result written to the results topic."),
    "dead_letter.schema.json": (DeadLetter, "serialization", "A dead letter written to the DLQ topic."),
    "tier_file.schema.json": (TierFile, "validation", "The YAML tier file (--config / PROMPTBUS_CONFIG)."),
}


def generate() -> dict[str, str]:
    """File name -> JSON text (2-space indent, trailing newline) of every schema."""
    out: dict[str, str] = {}
    for name, (model, mode, description) in _MODELS.items():
        schema: dict[str, Any] = {"$schema": _DIALECT}
        schema.update(model.model_json_schema(mode=mode))  # type: ignore[arg-type]
        schema.setdefault("description", description)
        out[name] = _json(schema)
    return out


#: settings the chart sets itself, so values never hold them: the tier file's path (its
#: ConfigMap), the metrics port (`metrics.port`, the probes' port), the instance id (a
#: StatefulSet pod's name: one value for every pod would fence them all), the CA file (`kafkaCA`,
#: mounted) and the passwords (`secretEnv`: a Secret, never a value)
_CHART_OWNED = {"config", "metrics_port", "instance_id"}
_CHART_OWNED_NESTED = {"KafkaSecurity": {"sasl_password", "ssl_cafile"}, "SchemaRegistry": {"password"}}
#: settings the chart's templates read, so the merged values must keep them
_CHART_READS = [
    "kafka_bootstrap_servers",
    "group_id",
    "jobs_topic",
    "max_inflight",
    "shutdown_timeout_s",
    "revoke_timeout_s",
]


def _settings_schema() -> dict[str, Any]:
    """`Settings` as the chart's `settings` value: keys by field name (the variables' names,
    lower case, without PROMPTBUS_; nested ones are mappings), an unknown one refused."""
    schema = Settings.model_json_schema(mode="validation")
    properties = {}
    for name, field in Settings.model_fields.items():
        alias = field.validation_alias
        key = alias.choices[0] if isinstance(alias, AliasChoices) else name
        if name not in _CHART_OWNED:
            properties[name] = schema["properties"][key]
    defs = schema.pop("$defs")
    for def_name, owned in _CHART_OWNED_NESTED.items():
        for field_name in owned:
            del defs[def_name]["properties"][field_name]
    for nested in defs.values():
        nested["additionalProperties"] = False
    settings = {
        "description": "environment settings by field name (kafka.security_protocol is "
        "PROMPTBUS_KAFKA__SECURITY_PROTOCOL)",
        "type": "object",
        "additionalProperties": False,
        "properties": properties,
        "required": _CHART_READS,
    }
    return {"settings": settings, "$defs": defs}


def chart_values_schema() -> dict[str, Any]:
    """The chart's values.schema.json: `ChartValues`, with `tiers` the tier file's schema (an
    empty mapping too: the chart's example tier file) and `settings` the environment's."""
    schema: dict[str, Any] = {"$schema": _DIALECT}
    schema.update(ChartValues.model_json_schema(mode="validation"))
    tier_file = TierFile.model_json_schema(mode="validation")
    settings = _settings_schema()
    defs = schema.setdefault("$defs", {})
    for extra in (tier_file.pop("$defs"), settings.pop("$defs"), {"TierFile": tier_file}):
        clash = set(extra) & set(defs)
        assert not clash, f"two models named {clash} in the chart's values schema"
        defs.update(extra)
    props = schema["properties"]
    props["tiers"] = {
        "description": "the tier file (the YAML of promptbus run --config); {}: the chart's example",
        "type": "object",
        "if": {"minProperties": 1},
        "then": {"$ref": "#/$defs/TierFile"},
    }
    props["settings"] = settings["settings"]
    schema["description"] = "The values of the promptbus Helm chart (deploy/helm/promptbus)."
    return schema


def _json(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write the schemas (or, with --check, compare them); returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m consumer.schemas", description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_DIR, help="directory (default: schemas/)")
    parser.add_argument(
        "--chart-schema",
        type=Path,
        default=CHART_SCHEMA,
        help="the chart's values.schema.json (default: the chart's own)",
    )
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 on drift")
    args = parser.parse_args(argv)
    wanted = {args.out / name: text for name, text in generate().items()}
    wanted[args.chart_schema] = _json(chart_values_schema())
    stale = []
    for path, text in wanted.items():
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        stale.append(path)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    if args.check and stale:
        fix = "python -m consumer.schemas"
        print(f"schemas out of date: {', '.join(p.name for p in stale)}; run: {fix}", file=sys.stderr)
        return 1
    for path in stale:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
