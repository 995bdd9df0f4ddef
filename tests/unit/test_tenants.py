"""Tenants, pure and close to it: names, accounts, the tier file's `tenants` and what
check-config says of them, the keys that keep tenants apart, and what stats and /metrics show."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry
from pydantic import ValidationError

from consumer.cli.run import tenant_lines
from consumer.cli.stats import format_stats, format_tenants
from consumer.client.jobs import with_tenant
from consumer.core.dedupe import dedupe_key
from consumer.core.embed import embed_dedupe_key, embed_pack_key
from consumer.core.errors import ConfigError
from consumer.core.jobs import Job
from consumer.core.snapshots import merge_snapshots
from consumer.core.tenants import DEFAULT_TENANT, OTHER_TENANT, TenantPolicies, TenantPolicy, tenant_problem
from consumer.core.window import LaneWindows, PackKey, WindowLimits
from consumer.runtime.evidence import evidence_key
from consumer.runtime.latency import TENANT_QUEUE_WAIT
from consumer.runtime.metrics import StatsCollector
from consumer.runtime.stats import ServiceStats
from consumer.settings import parse_tier_file

ROOT = Path(__file__).resolve().parents[2]
TIER = {"provider": "openai_compat", "base_url": "http://127.0.0.1:8080/v1", "model": "m"}
PRICING = {"input_per_mtok": 1, "output_per_mtok": 2}


@pytest.mark.parametrize("name", ["a", "team-a.prod_1", "x" * 64, "default", "A.B-C_d"])
def test_tenant_names(name: str) -> None:
    assert tenant_problem(name) is None


@pytest.mark.parametrize("value", ["", "x" * 65, "two words", "é", "a/b", "team-a\n", 7, None])
def test_what_is_not_a_tenant_name_is_said_without_echoing_it(value: Any) -> None:
    problem = tenant_problem(value)
    assert problem is not None and (not isinstance(value, str) or value == "" or value not in problem)


@pytest.mark.parametrize("value", ["team-a", "team-a\n", "\nteam-a", "x" * 64 + "\n", "", "a b"])
def test_a_tenant_name_is_one_whatever_carries_it(value: str) -> None:
    """The header check and the Job's `tenant` field accept exactly the same names."""
    job = {"id": "j", "tier": "t", "prompt": "p", "tenant": value}
    try:
        Job.model_validate(job)
        field_accepts = True
    except ValidationError:
        field_accepts = False
    assert (tenant_problem(value) is None) == field_accepts


def test_accounts_are_named_tenants_default_and_other() -> None:
    policies = TenantPolicies(
        {"search": TenantPolicy("search", weight=4.0), "default": TenantPolicy("default", usd_per_day=5.0)}
    )
    assert policies.accounts == ("search", DEFAULT_TENANT, OTHER_TENANT)
    assert [policies.account(t) for t in ("search", "default", "stranger", "other")] == [
        "search", "default", "other", "other",
    ]
    # an unnamed tenant has default's policy (weight and budget), counted as 'other'
    assert policies.policy("stranger") == TenantPolicy("other", usd_per_day=5.0)
    assert policies.weight("search") == 4.0 and policies.weight("stranger") == 1.0
    assert [p.name for p in policies.budgeted] == ["default", "other"]
    assert TenantPolicies().budgeted == ()


@pytest.mark.parametrize(
    ("tenants", "key"),
    [
        ({"a": {"weight": 0}}, "tenants.a.weight"),
        ({"a": {"weight": -1}}, "tenants.a.weight"),
        ({"a": {"budget": {"usd_per_day": 0}}}, "tenants.a.budget.usd_per_day"),
        ({"a": {"budget": {"tokens_per_day": -5}}}, "tenants.a.budget.tokens_per_day"),
        ({"a": {"on_exhausted": "drop"}}, "tenants.a.on_exhausted"),
        ({"a": {"wieght": 2}}, "tenants.a.wieght"),
        ({"other": {}}, "tenants.other"),
        ({"no spaces": {}}, "tenants"),
    ],
)
def test_check_config_refuses_a_bad_tenant_naming_the_key(tenants: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_tier_file({"tiers": {"small": TIER}, "tenants": tenants})
    assert caught.value.key == key


def test_check_config_lists_tenants_and_notes_a_usd_budget_beside_a_tier_without_pricing() -> None:
    tier_file = parse_tier_file(
        {
            "tiers": {"priced": {**TIER, "pricing": PRICING}, "free": TIER},
            "tenants": {
                "search": {"weight": 4},
                "reports": {
                    "budget": {"usd_per_day": 20, "tokens_per_day": 5000},
                    "on_exhausted": "dead_letter",
                },
            },
        }
    )
    assert tenant_lines(tier_file) == [
        "tenant search: weight 4",
        "tenant reports: weight 1 budget $20/day and 5000 tokens/day, then dead_letter",
        "note: tier 'free' has no pricing: its requests count as $0 against the tenants' USD budgets",
    ]
    tokens_only = parse_tier_file(
        {"tiers": {"free": TIER}, "tenants": {"t": {"budget": {"tokens_per_day": 9}}}}
    )
    assert tokens_only.unpriced_usd_budget() == []  # a token budget sees every tier


def _yaml_blocks(page: Path, after: str) -> list[Any]:
    text = page.read_text(encoding="utf-8")
    text = text[text.index(after) :]
    return [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, re.DOTALL)[:1]]


@pytest.mark.parametrize(
    ("page", "after"),
    [("docs/tenants.md", "## The tier file's `tenants`"), ("docs/configuration.md", "### Tenants")],
)
def test_the_tenant_examples_of_the_docs_are_valid_tier_files(page: str, after: str) -> None:
    (block,) = _yaml_blocks(ROOT / page, after)
    data = block if "tiers" in block else {"tiers": {"small": TIER}, **block}
    policies = parse_tier_file(data).tenant_policies()
    assert len(policies.accounts) >= 3


def test_the_tenant_keeps_packs_dedupe_shares_and_embed_windows_apart() -> None:
    alpha = PackKey("t", "p", "v", "{}", "online", "alpha")
    assert alpha != alpha._replace(tenant="beta")
    assert PackKey("t", "p", "v", "{}", "online").tenant == "default"
    messages = [("user", "same text")]
    assert dedupe_key("t", "m", {"temperature": 0}, messages, "alpha") != dedupe_key(
        "t", "m", {"temperature": 0}, messages, "beta"
    )
    assert embed_dedupe_key("t", "m", {}, "x", "alpha") != embed_dedupe_key("t", "m", {}, "x", "beta")
    assert embed_pack_key("t", {}, "online", "alpha") != embed_pack_key("t", {}, "online", "beta")


def test_the_default_tenants_batching_evidence_keeps_its_key() -> None:
    config = parse_tier_file({"tiers": {"small": TIER}}).tiers["small"]
    key = PackKey("small", "p", "v", "{}", "online")
    # the record key of the five fields it always had: what earlier runs published
    before = evidence_key("small", config, key)
    assert before == evidence_key("small", config, key._replace(tenant="default"))
    assert before != evidence_key("small", config, key._replace(tenant="alpha"))


def test_windows_due_together_flush_in_fair_order_between_tenants() -> None:
    windows: LaneWindows[str] = LaneWindows(lambda tenant: 2.0 if tenant == "big" else 1.0)
    limits = WindowLimits(max_items=10, max_input_chars=1000, window_ms=10, max_wait_ms=100)
    for tenant, n in (("big", 6), ("small", 3)):
        for i in range(n):
            key = PackKey("t", f"prefix {i}", "v", "{}", "online", tenant)
            windows.add(key, f"{tenant}-{i}", lane=None, input_chars=1, partition=0, limits=limits, now_s=0.0)
    flushes = windows.due(1.0, can_still_join=lambda _k: True)
    order = [f.key.tenant for f in flushes]
    assert order == ["big", "small", "big", "big", "small", "big", "big", "small", "big"]


def test_a_run_gets_its_tenant_unless_a_job_names_its_own() -> None:
    jobs = [{"tier": "t", "prompt": "x"}, {"tier": "t", "prompt": "y", "tenant": "mine"}]
    with_tenant(jobs, "reports")
    assert [j["tenant"] for j in jobs] == ["reports", "mine"]
    with pytest.raises(ValueError, match="tenant: must be 1-64 characters"):
        with_tenant(jobs, "not a name")


def _snapshot(instance: str, **tenants: dict[str, float]) -> dict[str, Any]:
    stats = ServiceStats(instance=instance, group="g")
    for name, fields in tenants.items():
        for field, value in fields.items():
            setattr(stats.tenant(name), field, value)
    return stats.snapshot()


def test_tenant_counters_add_up_and_the_budget_is_the_largest_live_spend() -> None:
    now_s = time.time()
    a = _snapshot("a", reports={"results": 3, "cost_usd": 1.5, "budget_usd": 20, "spent_usd": 4.0, "held": 2})
    b = _snapshot("b", reports={"results": 4, "cost_usd": 2.0, "budget_usd": 20, "spent_usd": 4.5, "held": 1})
    merged = merge_snapshots([a, b], now_s=now_s, live_within_s=60)
    reports = merged["tenants"]["reports"]
    assert (reports["results"], reports["cost_usd"], reports["held"]) == (7, 3.5, 3)
    assert (reports["budget_usd"], reports["spent_usd"]) == (20, 4.5)
    assert format_tenants(merged) == [
        "tenant reports: results=7 dead_letters=0 tokens in=0 out=0 cost=$3.5000 held=3 "
        "budget left today: $15.5000 of $20",
    ]
    assert "tenant reports:" in format_stats({**merged, "group": "g"})
    assert format_tenants(merged, "nobody") == []


def test_tenant_metrics_have_one_label_value_per_account_and_budgets_only_where_set() -> None:
    stats = ServiceStats(instance="a")
    stats.tenant("reports").results = 5
    stats.tenant("reports").input_tokens = 100
    stats.tenant("reports").budget_usd = 20.0
    stats.tenant("reports").spent_usd = 19.0
    stats.tenant("other").dead_letters = 2
    stats.latency.observe(TENANT_QUEUE_WAIT, ("reports",), 0.3)
    registry = CollectorRegistry()
    registry.register(StatsCollector(stats))
    text = generate_latest(registry).decode()
    assert 'promptbus_tenant_jobs_total{outcome="result",tenant="reports"} 5.0' in text
    assert 'promptbus_tenant_jobs_total{outcome="dead_letter",tenant="other"} 2.0' in text
    assert 'promptbus_tenant_tokens_total{kind="input",tenant="reports"} 100.0' in text
    assert 'promptbus_tenant_budget_remaining_usd{tenant="reports"} 1.0' in text
    assert 'promptbus_tenant_budget_usd{tenant="other"}' not in text  # no budget: no series
    assert 'promptbus_tenant_queue_wait_seconds_bucket{le="0.5",tenant="reports"} 1.0' in text
