"""docs/messages.md: the Result example carries every field a real result does, and parses."""

from __future__ import annotations

import re

import orjson

from consumer.core.jobs import Result
from consumer.testing.paths import REPO_ROOT


def _example(section: str) -> dict[str, object]:
    """The first JSON block under `## {section}` in docs/messages.md."""
    text = (REPO_ROOT / "docs" / "messages.md").read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```json\n(.*?)```", body, re.S)
    assert match is not None, f"no JSON example under ## {section}"
    parsed = orjson.loads(match.group(1))
    assert isinstance(parsed, dict)
    return parsed


def test_the_result_example_has_every_field_a_result_carries() -> None:
    example = _example("Result")
    result = Result.model_validate(example)
    carried = orjson.loads(result.model_dump_json())  # what the service writes: every field
    assert sorted(example) == sorted(carried), "fields missing from (or unknown to) the example"
    assert example["lane"] == "default"
