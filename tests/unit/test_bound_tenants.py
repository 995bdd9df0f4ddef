"""Bound tenants, pure and close to it: who a job read from a topic belongs to, where each
tenant's outcomes go, admission's `tenant_mismatch`, and what check-config refuses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from consumer.app import validate_config
from consumer.cli import main
from consumer.core.errors import ConfigError
from consumer.core.tenants import DEFAULT_TENANT, TenantTopics
from consumer.settings import parse_tier_file

TIER = {"provider": "openai_compat", "base_url": "http://127.0.0.1:8080/v1", "model": "m"}
LANES = {"a": {"topic": "jobs.a"}, "b": {"topic": "jobs.b"}, "shared": {"topic": "jobs"}}

TOPICS = TenantTopics(
    "results",
    "dlq",
    bound={"team-a": ("jobs.a",), "team-b": ("jobs.b", "jobs.b2")},
    outputs={"team-a": ("results.a", "dlq.a"), "team-b": (None, "dlq.b"), "carol": ("results.c", None)},
)


@pytest.mark.parametrize(
    ("topic", "claimed", "tenant", "mismatch"),
    [
        ("jobs.a", None, "team-a", False),  # a bound topic's job names no tenant: its tenant's
        ("jobs.a", "team-a", "team-a", False),
        ("jobs.a", "team-b", "team-a", True),  # claims another: its topic's tenant's dead letter
        ("jobs.a", "carol", "team-a", True),
        ("jobs.b2", None, "team-b", False),
        ("jobs", "team-a", DEFAULT_TENANT, True),  # a bound tenant claimed elsewhere
        ("jobs", "carol", "carol", False),  # unbound tenants keep today's rule
        ("jobs", None, DEFAULT_TENANT, False),
    ],
)
def test_a_jobs_tenant_is_its_topics_when_the_topic_is_bound(
    topic: str, claimed: str | None, tenant: str, mismatch: bool
) -> None:
    got, why = TOPICS.claim(topic, claimed)
    assert got == tenant and (why is not None) == mismatch
    if why is not None:
        assert claimed is not None and claimed in why and topic in why


def test_each_tenants_outcomes_go_to_its_own_topics_else_the_services() -> None:
    assert (TOPICS.results_of("team-a"), TOPICS.dead_letters_of("team-a")) == ("results.a", "dlq.a")
    assert (TOPICS.results_of("team-b"), TOPICS.dead_letters_of("team-b")) == ("results", "dlq.b")
    assert (TOPICS.results_of("carol"), TOPICS.dead_letters_of("carol")) == ("results.c", "dlq")
    assert (TOPICS.results_of("zed"), TOPICS.dead_letters_of("zed")) == ("results", "dlq")
    assert TOPICS.dead_letters_of(None) == "dlq"
    assert TOPICS.own_results_topics == ("results", "results.a", "results.c")
    assert TOPICS.own_dead_letter_topics == ("dlq", "dlq.a", "dlq.b")
    assert set(TOPICS.output_topics) == {"results", "results.a", "results.c", "dlq", "dlq.a", "dlq.b"}


def test_without_bindings_nothing_changes() -> None:
    plain = parse_tier_file({"tiers": {"small": TIER}, "tenants": {"a": {"weight": 2}}})
    topics = plain.tenant_topics("results", "dlq")
    assert topics.claim("jobs", "a") == ("a", None) and topics.claim("jobs", None) == (DEFAULT_TENANT, None)
    assert topics.output_topics == ("results", "dlq")


@pytest.mark.parametrize(
    ("tenants", "key", "words"),
    [
        (
            {"a": {"topics": ["jobs.a"]}, "b": {"topics": ["jobs.b", "jobs.a"]}},
            "tenants.b.topics.1",
            "tenant 'a' too",
        ),
        ({"default": {"topics": ["jobs.a"]}}, "tenants.default.topics", "every unbound tenant"),
        ({"default": {"results_topic": "r"}}, "tenants.default.results_topic", "every unbound tenant"),
        ({"a": {"topics": []}}, "tenants.a.topics", "at least 1"),
        ({"a": {"results_topic": ""}}, "tenants.a.results_topic", "at least 1"),
    ],
)
def test_the_tier_file_refuses_a_topic_bound_twice_and_default_bound(
    tenants: dict[str, Any], key: str, words: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_tier_file({"tiers": {"small": TIER}, "lanes": LANES, "tenants": tenants})
    assert caught.value.key == key and words in caught.value.reason


def test_a_bound_topic_no_lane_or_source_reads_is_refused() -> None:
    def tier_file(topic: str, lanes: dict[str, Any] | None = LANES) -> Any:
        data = {"tiers": {"small": TIER}, "tenants": {"a": {"topics": [topic]}}}
        return parse_tier_file({**data, "lanes": lanes} if lanes else data)

    unread = tier_file("jobs.z")
    with pytest.raises(ConfigError) as caught:
        validate_config(unread, jobs_topic="jobs")
    assert caught.value.key == "tenants.a.topics.0"
    assert "'jobs.z' is read by no lane or source" in caught.value.reason
    # without lanes the service reads PROMPTBUS_JOBS_TOPIC: binding it is fine, another is not
    no_lanes = tier_file("promptbus.jobs", None)
    validate_config(no_lanes, jobs_topic="promptbus.jobs")
    with pytest.raises(ConfigError):
        validate_config(no_lanes, jobs_topic="other.jobs")
    validate_config(tier_file("jobs.a"), jobs_topic="jobs")


def test_a_source_on_a_bound_topic_naming_another_tenant_is_refused() -> None:
    source = {"topic": "orders", "tier": "small", "prompt": "${x}", "into": {"topic": "orders.out"}}
    data = {
        "tiers": {"small": TIER},
        "sources": {"orders": {**source, "tenant": "b"}},
        "tenants": {"a": {"topics": ["orders"]}},
    }
    with pytest.raises(ConfigError) as caught:
        validate_config(parse_tier_file(data), jobs_topic="jobs")
    assert caught.value.key == "sources.orders.tenant" and "bound to tenant 'a'" in caught.value.reason
    data["sources"]["orders"]["tenant"] = "a"
    validate_config(parse_tier_file(data), jobs_topic="jobs")


def test_check_config_says_the_key_of_an_unread_bound_topic(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "tiers.yaml"
    config.write_text(yaml.safe_dump({"tiers": {"small": TIER}, "tenants": {"a": {"topics": ["jobs.a"]}}}))
    monkeypatch.setenv("PROMPTBUS_JOBS_TOPIC", "promptbus.jobs")
    code = main(["check-config", "--config", str(config)])
    err = capsys.readouterr().err
    assert code != 0 and "tenants.a.topics.0" in err and "read by no lane or source" in err


def test_the_acl_lines_operations_md_shows_are_what_check_config_acls_prints() -> None:
    """docs/operations.md#acls: its example lines, for the tier file of tenants.md#bound-tenants
    with exactly_once, are lines `check-config --acls` prints (and the list the ACL test uses)."""
    import re

    from consumer.cli.run import acl_lines
    from consumer.settings import Settings
    from consumer.testing.paths import REPO_ROOT

    tenants_md = (REPO_ROOT / "docs" / "tenants.md").read_text()
    section = tenants_md[tenants_md.index("## Bound tenants") :]
    tier_yaml = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert tier_yaml is not None
    tier_file = parse_tier_file(yaml.safe_load(tier_yaml.group(1)))
    settings = Settings(processing_guarantee="exactly_once")  # type: ignore[call-arg]
    printed = acl_lines(settings, tier_file)
    operations_md = (REPO_ROOT / "docs" / "operations.md").read_text()
    shown = [line for line in operations_md.splitlines() if line.startswith("acl ")]
    assert len(shown) >= 7
    prefix = "--bootstrap-server $KAFKA_BOOTSTRAP_SERVERS --command-config admin.properties"
    for line in shown:
        assert line.replace("...", prefix) in printed, line


def test_a_tenants_clients_use_its_own_topics(tmp_path: Path) -> None:
    """`results`/`replay --tenant`, `submit --tenant` and the client's `tenant=` read the
    tenant's outputs and send to its bound topic (a lane named wins)."""
    from consumer.client import AsyncClient
    from consumer.settings import Settings, tenant_settings

    data = {
        "tiers": {"small": TIER},
        "lanes": LANES,
        "tenants": {
            "team-a": {"topics": ["jobs.a"], "results_topic": "results.a", "dead_letter_topic": "dlq.a"}
        },
    }
    base = Settings(jobs_topic="jobs", results_topic="results", dlq_topic="dlq")  # type: ignore[call-arg]
    scoped = tenant_settings(base, parse_tier_file(data), "team-a")
    assert (scoped.jobs_topic, scoped.results_topic, scoped.dlq_topic) == ("jobs.a", "results.a", "dlq.a")
    unbound = tenant_settings(base, parse_tier_file(data), "carol")
    assert (unbound.jobs_topic, unbound.results_topic, unbound.dlq_topic) == ("jobs", "results", "dlq")
    assert tenant_settings(base, None, "team-a") is base
    config = tmp_path / "tiers.yaml"
    config.write_text(yaml.safe_dump(data))
    client = AsyncClient(base.model_copy(update={"config": str(config)}))
    assert client.tenant_settings("team-a").results_topic == "results.a"
    assert client.lane_settings(None, client.tenant_settings("team-a")).jobs_topic == "jobs.a"
    assert client.lane_settings("b", client.tenant_settings("team-a")).jobs_topic == "jobs.b"
    assert client.tenant_settings(None).results_topic == "results"
