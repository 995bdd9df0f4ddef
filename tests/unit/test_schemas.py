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


def test_check_mode_detects_drift_and_write_mode_fixes_it(tmp_path: Path) -> None:
    assert schemas.main(["--out", str(tmp_path), "--check"]) == 1
    assert schemas.main(["--out", str(tmp_path)]) == 0
    assert schemas.main(["--out", str(tmp_path), "--check"]) == 0
    (tmp_path / "job.schema.json").write_text("{}", encoding="utf-8")
    assert schemas.main(["--out", str(tmp_path), "--check"]) == 1
