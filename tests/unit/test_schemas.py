"""schemas/ is generated from the models; drift fails here."""

from __future__ import annotations

import json
from pathlib import Path

from consumer import schemas
from consumer.testing.paths import REPO_ROOT

SCHEMAS = REPO_ROOT / "schemas"


def test_schemas_match_models() -> None:
    expected = schemas.generate()
    assert set(expected) == {
        "job.schema.json",
        "result.schema.json",
        "dead_letter.schema.json",
        "tier_file.schema.json",
    }
    for name, text in expected.items():
        path = SCHEMAS / name
        assert path.exists(), f"missing {path}; run: python -m consumer.schemas"
        assert path.read_text(encoding="utf-8") == text, (
            f"{name} drifted from the models; run: python -m consumer.schemas"
        )


def test_job_schema_content() -> None:
    schema = json.loads((SCHEMAS / "job.schema.json").read_text(encoding="utf-8"))
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == {"id", "tier"}
    assert schema["properties"]["id"]["maxLength"] == 256
    assert len(schema["oneOf"]) == 3  # prompt, messages, an embed job's input


def test_the_chart_values_schema_matches_the_models() -> None:
    """The chart's values.schema.json holds the tier file's schema (and the settings'), as
    generated: Helm checks a tier file in values with the same rules as check-config."""
    text = json.dumps(schemas.chart_values_schema(), indent=2, ensure_ascii=False) + "\n"
    assert schemas.CHART_SCHEMA.read_text(encoding="utf-8") == text, (
        "deploy/helm/promptbus/values.schema.json drifted from the models; run: python -m consumer.schemas"
    )
    chart = json.loads(text)
    tier_file = json.loads((SCHEMAS / "tier_file.schema.json").read_text(encoding="utf-8"))
    assert chart["properties"]["tiers"]["then"] == {"$ref": "#/$defs/TierFile"}
    for name, definition in tier_file["$defs"].items():
        assert chart["$defs"][name] == definition
    assert chart["$defs"]["TierFile"]["additionalProperties"] is False
    assert chart["additionalProperties"] is False
    assert chart["properties"]["settings"]["additionalProperties"] is False
    assert "sasl_password" not in chart["$defs"]["KafkaSecurity"]["properties"], "passwords never in values"


def test_check_mode_detects_drift_and_write_mode_fixes_it(tmp_path: Path) -> None:
    args = ["--out", str(tmp_path), "--chart-schema", str(tmp_path / "chart" / "values.schema.json")]
    assert schemas.main([*args, "--check"]) == 1
    assert schemas.main(args) == 0
    assert schemas.main([*args, "--check"]) == 0
    (tmp_path / "job.schema.json").write_text("{}", encoding="utf-8")
    assert schemas.main([*args, "--check"]) == 1
    assert schemas.main(args) == 0
    (tmp_path / "chart" / "values.schema.json").write_text("{}", encoding="utf-8")
    assert schemas.main([*args, "--check"]) == 1
