"""The docs: generated tables match the models, and every relative link points at a file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from consumer import docs_tables
from consumer.testing.paths import REPO_ROOT

PAGES = [
    REPO_ROOT / "README.md",
    *sorted((REPO_ROOT / "docs").glob("*.md")),
    REPO_ROOT / "bench" / "README.md",
]
# [text](target) and ![alt](target); the target up to a space, ')' or '#'
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s#]+)(?:#[^)]*)?\)")


def test_configuration_tables_match_the_schemas() -> None:
    text = docs_tables.DEFAULT_PATH.read_text(encoding="utf-8")
    assert docs_tables.render(text) == text, (
        "docs/configuration.md tables drifted from the models; run: make schemas"
    )


def test_check_mode_detects_drift_and_write_mode_fixes_it(tmp_path: Path) -> None:
    page = tmp_path / "configuration.md"
    page.write_text(docs_tables.DEFAULT_PATH.read_text(encoding="utf-8"), encoding="utf-8")
    assert docs_tables.main(["--path", str(page), "--check"]) == 0
    page.write_text(page.read_text(encoding="utf-8").replace("| `model` |", "| `modell` |"), encoding="utf-8")
    assert docs_tables.main(["--path", str(page), "--check"]) == 1
    assert docs_tables.main(["--path", str(page)]) == 0
    assert docs_tables.main(["--path", str(page), "--check"]) == 0


def test_render_refuses_unknown_and_missing_markers() -> None:
    with pytest.raises(ValueError, match="unknown generated table 'nope'"):
        docs_tables.render("<!-- BEGIN GENERATED: nope -->\nx\n<!-- END GENERATED -->\n")
    with pytest.raises(ValueError, match="no marker for table"):
        docs_tables.render("no markers here\n")


def test_every_tier_key_and_variable_is_documented() -> None:
    tier_table = docs_tables.tier_file_table()
    for key in ("batching.max_items", "retry.circuit_probe_max_s", "pricing.batch_discount", "dedupe"):
        assert f"| `{key}` |" in tier_table
    env_table = docs_tables.environment_table()
    for var in ("PROMPTBUS_MAX_INFLIGHT", "KAFKA_BOOTSTRAP_SERVERS", "PROMPTBUS_KAFKA__SASL_PASSWORD"):
        assert f"`{var}`" in env_table
    assert all(row.count(" | ") >= 3 and not row.endswith("|  |") for row in tier_table.splitlines())


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO_ROOT).as_posix())
def test_relative_links_point_at_files(page: Path) -> None:
    broken = []
    for target in _LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        if not (page.parent / target).exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(REPO_ROOT)}: links to missing files: {broken}"
