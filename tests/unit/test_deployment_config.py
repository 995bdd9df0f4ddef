"""A tier's `deployments` in the tier file: the refusals name the dotted key, each deployment
takes the tier's own keys it leaves out (the docs' examples are checked with every other
example: tests/unit/test_doc_examples.py), and `promptbus stats` prints a line per deployment
from merged snapshots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from consumer.app import validate_config
from consumer.cli.stats import format_stats
from consumer.core.errors import ConfigError
from consumer.core.snapshots import merge_snapshots
from consumer.runtime.stats import ServiceStats
from consumer.settings import parse_tier_file

ROOT = Path(__file__).resolve().parents[2]
TIER = {"provider": "openai_compat", "base_url": "http://127.0.0.1:9/v1", "model": "m"}


@pytest.mark.parametrize(
    ("data", "key", "reason"),
    [
        (
            {"tiers": {"a": {**TIER, "deployments": [{"name": "x"}, {"name": "x"}]}}},
            "tiers.a.deployments.1.name",
            "deployment name 'x' is used twice in the tier",
        ),
        (
            {
                "tiers": {
                    "a": {
                        "provider": "openai_compat",
                        "model": "m",
                        "deployments": [{"name": "x", "base_url": "http://127.0.0.1:9/v1"}, {"name": "y"}],
                    }
                }
            },
            "tiers.a.deployments.1.base_url",
            "neither the deployment nor the tier sets one",
        ),
        (
            {"tiers": {"a": {**TIER, "deployments": [{"name": "x", "quota": "k"}]}}},
            "tiers.a.deployments.0.quota",
            "unknown quota 'k' (the tier file has no quotas)",
        ),
        (
            {"tiers": {"a": {**TIER, "deployments": [{"base_url": "http://h/v1"}]}}},
            "tiers.a.deployments.0.name",
            "Field required",
        ),
        ({"tiers": {"a": {**TIER, "deployments": []}}}, "tiers.a.deployments", "at least 1"),
        (
            {"tiers": {"a": {**TIER, "deployments": [{"name": "x", "weight": 0}]}}},
            "tiers.a.deployments.0.weight",
            "greater than 0",
        ),
        (
            {"tiers": {"a": {**TIER, "deployments": [{"name": "x", "region": "eu"}]}}},
            "tiers.a.deployments.0.region",
            "not permitted",
        ),
    ],
)
def test_a_bad_deployment_is_refused_naming_its_key(data: dict[str, Any], key: str, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_tier_file(data)
    assert caught.value.key == key
    assert reason in str(caught.value)


def test_check_config_refuses_a_deployments_unset_key_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    tier_file = parse_tier_file(
        {
            "tiers": {
                "a": {**TIER, "deployments": [{"name": "x"}, {"name": "y", "api_key_env": "NO_SUCH_KEY_VAR"}]}
            }
        }
    )
    with pytest.raises(ConfigError) as caught:
        validate_config(tier_file)
    assert caught.value.key == "tiers.a.deployments.1.api_key_env"
    assert "NO_SUCH_KEY_VAR is not set" in str(caught.value)


def test_a_deployment_takes_the_tiers_own_keys_it_leaves_out() -> None:
    tier_file = parse_tier_file(
        {
            "quotas": {"q": {"requests_per_minute": 60}, "r": {"requests_per_minute": 30}},
            "tiers": {
                "a": {
                    **TIER,
                    "quota": "q",
                    "limiter": {"algorithm": "fixed", "initial": 3, "min": 1, "max": 3},
                    "deployments": [
                        {"name": "x"},
                        {
                            "name": "y",
                            "base_url": "http://127.0.0.2:9/v1",
                            "model": "m2",
                            "weight": 2,
                            "limiter": {"algorithm": "fixed", "initial": 7, "min": 1, "max": 7},
                            "quota": "r",
                        },
                    ],
                }
            },
        }
    )
    (x, x_where, x_weight, x_cfg), (y, y_where, y_weight, y_cfg) = tier_file.tiers["a"].deployment_configs(
        "a"
    )
    assert (x, x_where, x_weight) == ("x", "a.deployments.0", 1.0)
    assert (x_cfg.base_url, x_cfg.model, x_cfg.limiter.max, x_cfg.quota) == (TIER["base_url"], "m", 3, "q")
    assert (y, y_where, y_weight) == ("y", "a.deployments.1", 2.0)
    assert (y_cfg.base_url, y_cfg.model, y_cfg.limiter.max, y_cfg.quota) == (
        "http://127.0.0.2:9/v1",
        "m2",
        7,
        "r",
    )
    assert x_cfg.provider == y_cfg.provider == "openai_compat" and x_cfg.deployments is None


def test_a_tier_without_deployments_is_its_own_one() -> None:
    tier = parse_tier_file({"tiers": {"a": TIER}}).tiers["a"]
    assert tier.deployment_configs("a") == [(None, "a", 1.0, tier)]


def test_stats_print_a_line_per_deployment_from_the_merged_snapshots() -> None:
    snapshots = []
    for instance, requests in (("i1", 5), ("i2", 7)):
        stats = ServiceStats(instance=instance, group="g")
        tier = stats.tier("small")
        for label, n in (("east", requests), ("west", 1)):
            own = tier.deployment(label)
            own.provider_requests, own.rate_limited, own.limit, own.input_tokens = n, 1, 4, 10 * n
        own.circuit_open, own.circuit_opened = 1, 1
        snapshots.append(stats.snapshot())
    merged = merge_snapshots(snapshots, now_s=snapshots[-1]["updated_at"], live_within_s=60)
    lines = [line for line in format_stats(merged).splitlines() if " deployment " in line]
    assert lines == [
        "tier small deployment east: requests=12 429s=2 errors=0 limit=8 inflight=0 tokens=120 in, 0 out; "
        "circuit closed",
        "tier small deployment west: requests=2 429s=2 errors=0 limit=8 inflight=0 tokens=20 in, 0 out; "
        "circuit OPEN (opened 2x)",
    ]
