"""Fleet quotas in the tier file and in what `promptbus stats` prints: the refusals name the
dotted key, the docs' examples load and pass check-config's checks, a snapshot carries this
instance's share, and the stats text in docs/metrics.md is what the code prints."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from consumer.app import validate_config
from consumer.cli.stats import format_quotas
from consumer.core.errors import ConfigError
from consumer.core.snapshots import merge_snapshots
from consumer.settings import parse_tier_file

ROOT = Path(__file__).resolve().parents[2]
TIER = {"provider": "openai_compat", "base_url": "http://127.0.0.1:9/v1", "model": "m"}


@pytest.mark.parametrize(
    ("data", "key", "reason"),
    [
        (
            {"tiers": {"a": {**TIER, "quota": "k"}}},
            "tiers.a.quota",
            "unknown quota 'k' (the tier file has no quotas)",
        ),
        (
            {"tiers": {"a": {**TIER, "quota": "k"}}, "quotas": {"j": {"requests_per_minute": 5}}},
            "tiers.a.quota",
            "unknown quota 'k' (quotas: j)",
        ),
        (
            {"tiers": {"a": TIER}, "quotas": {"k": {"requests_per_minute": 0}}},
            "quotas.k.requests_per_minute",
            "greater than 0",
        ),
        (
            {"tiers": {"a": TIER}, "quotas": {"k": {"output_tokens_per_minute": -1}}},
            "quotas.k.output_tokens_per_minute",
            "greater than 0",
        ),
        (
            {"tiers": {"a": TIER}, "quotas": {"k": {"tokens_per_minute": 2.5}}},
            "quotas.k.tokens_per_minute",
            "valid integer",
        ),
        ({"tiers": {"a": TIER}, "quotas": {"k": {}}}, "quotas.k", "at least one of requests_per_minute"),
        ({"tiers": {"a": TIER}, "quotas": {}}, "quotas", "at least 1"),
        (
            {"tiers": {"a": TIER}, "quotas": {"k": {"requests_per_min": 5}}},
            "quotas.k.requests_per_min",
            "not permitted",
        ),
        (
            {
                "tiers": {
                    "a": {
                        **TIER,
                        "provider": "openai",
                        "offline": {"enabled": True, "max_enqueued_tokens": 0},
                    }
                }
            },
            "tiers.a.offline.max_enqueued_tokens",
            "greater than 0",
        ),
    ],
)
def test_a_bad_quota_is_refused_naming_its_key(data: dict[str, Any], key: str, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_tier_file(data)
    assert caught.value.key == key
    assert reason in str(caught.value)


def _yaml_blocks(page: str, after: str) -> list[str]:
    """The ```yaml blocks of `page` in the section whose heading is `after`."""
    text = (ROOT / page).read_text(encoding="utf-8")
    section = text.split(after, 1)[1].split("\n#", 1)[0]
    return re.findall(r"```yaml\n(.*?)```", section, re.DOTALL)


@pytest.mark.parametrize(
    ("page", "heading"),
    [("docs/configuration.md", "### Fleet quotas"), ("docs/operations.md", "## Fleet quotas")],
)
def test_the_docs_examples_load_and_pass_check_config(
    page: str, heading: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks = _yaml_blocks(page, heading)
    assert blocks, f"{page} has an example under {heading}"
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    for block in blocks:
        tier_file = parse_tier_file(yaml.safe_load(block))
        validate_config(tier_file)
        assert tier_file.quotas and all(t.quota in tier_file.quotas for t in tier_file.tiers.values())


def _snapshot(instance: str, fraction: float, demand: int, reserved: float) -> dict[str, Any]:
    figures = {"requests": 1200, "tokens": 360000}
    return {
        "instance": instance,
        "group": "g",
        "updated_at": 1000.0,
        "quotas": {
            "gpt-mini": {
                "figures_per_minute": figures,
                "fraction": fraction,
                "share_per_minute": {k: round(v * fraction, 2) for k, v in figures.items()},
                "demand": demand,
                "reserved_tokens": reserved,
                "instances_live": 3,
            }
        },
    }


def test_stats_print_each_quota_and_its_split_as_docs_metrics_md_shows() -> None:
    snapshots = [
        _snapshot("host-a-4123-9f2e1c", 0.521, 214, 700.0),
        _snapshot("host-b-3988-a01b7d", 0.469, 198, 610.0),
        _snapshot("host-c-4410-c3d9e8", 0.01, 0, 0.0),
        {**_snapshot("host-d-1-dead", 0.5, 99, 10.0), "updated_at": 1.0},  # not live: not in the split
    ]
    merged = merge_snapshots(snapshots, now_s=1001.0, live_within_s=10.0)
    printed = format_quotas(merged)
    documented = [
        line.strip()
        for line in (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8").splitlines()
        if line.startswith("    quota gpt-mini")
    ]
    assert printed == documented
