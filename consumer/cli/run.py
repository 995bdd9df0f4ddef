"""`promptbus run` (the service) and `promptbus check-config` (its configuration, checked)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from consumer.cli.environment import add_bootstrap, check_kafka, configure_logging, load_config
from consumer.core.embed import embed_limits, no_embeddings
from consumer.settings import unread_jobs_topic_note


def cmd_run(args: argparse.Namespace) -> int:
    """Run the service until SIGTERM/SIGINT."""
    from consumer.app import run_service
    from consumer.runtime import eventloop

    configure_logging(args.log_level)
    settings, tier_file = load_config(args, logging.getLogger("promptbus.settings").warning)
    check_kafka(settings)
    return eventloop.run(run_service(settings, tier_file), settings.event_loop)


def cmd_check_config(args: argparse.Namespace) -> int:
    """Validate the tier file and the environment as `run` does; print the tiers."""
    settings, tier_file = load_config(args, lambda line: print(f"warning: {line}", file=sys.stderr))
    for name, tier in tier_file.tiers.items():
        flags = []
        if tier.batching.enabled:
            flags.append(f"batching max_items={tier.batching.max_items}")
        if tier.offline.enabled:
            flags.append("offline")
        print(f"tier {name}: {tier.provider} {tier.model} limiter={tier.limiter.algorithm} {' '.join(flags)}")
        if embed_limits(tier.provider) is None:
            # valid for chat jobs; said here so an embed job's dead letter is no surprise
            print(f"note: {no_embeddings(name, tier.provider)}")
    for line in tenant_lines(tier_file):
        print(line)
    unread = unread_jobs_topic_note(tier_file, settings.jobs_topic)
    if unread is not None:
        print(f"note: {unread}")
    if tier_file.sources:
        problems = source_lines(settings, tier_file)
        if problems:
            for problem in problems:
                print(f"error: {problem}", file=sys.stderr)
            return 2
    if getattr(args, "acls", False):
        for line in acl_lines(settings, tier_file):
            print(line)
    counted = f", {len(tier_file.sources)} source(s)" if tier_file.sources else ""
    print(f"ok: {len(tier_file.tiers)} tier(s){counted}")
    return 0


def source_lines(settings: Any, tier_file: Any) -> list[str]:
    """Print a line per source (and what the registry says of it, where one is set and answers);
    return the problems found there."""
    import asyncio

    from consumer.registry.checks import check_source
    from consumer.registry.client import RegistryClient

    registry_sources = {n: s for n, s in tier_file.sources.items() if s.format != "json"}
    for name, source in tier_file.sources.items():
        mapping = source.mapping(name)
        print(
            f"source {name}: {source.topic} ({source.format}, envelope {source.envelope}) -> tier "
            f"{source.tier} -> {source.into.topic} field {source.into.field!r}; reads "
            + ", ".join(mapping.paths)
        )
    url = settings.schema_registry.url
    if not registry_sources:
        return []
    if url is None:
        print("note: no PROMPTBUS_SCHEMA_REGISTRY__URL: the registry sources' fields are not checked")
        return []

    async def check_all() -> tuple[list[str], list[str]]:
        registry = RegistryClient.from_settings(settings.schema_registry)
        problems: list[str] = []
        notes: list[str] = []
        try:
            for name, source in registry_sources.items():
                found, said = await check_source(registry, name, source, source.mapping(name).paths)
                problems += found
                notes += said
        finally:
            await registry.aclose()
        return problems, notes

    problems, notes = asyncio.run(check_all())
    for note in notes:
        print(f"note: {note}")
    return problems


def acl_lines(settings: Any, tier_file: Any) -> list[str]:
    """`check-config --acls`: the `kafka-acls.sh` commands that give promptbus's principal (its
    SASL user, else `promptbus`) what it needs, and each bound tenant's principal (named as the
    tenant: put your team's user there) what its team needs (`consumer.kafka.acls`)."""
    from consumer.kafka.acls import acl_command, service_acls, shared_outputs, tenant_acls

    user = settings.kafka.sasl_username or "promptbus"
    grants = [(user, acl) for acl in service_acls(settings, tier_file)]
    bound = [name for name, t in (tier_file.tenants or {}).items() if t.topics]
    grants += [(name, acl) for name in bound for acl in tenant_acls(settings, tier_file, name)]
    prefix = "kafka-acls.sh --bootstrap-server $KAFKA_BOOTSTRAP_SERVERS --command-config admin.properties"
    lines = [f"acl {user}: {prefix} {' '.join(acl_command(user, acl))}" for user, acl in grants]
    for name in bound:
        for topic in shared_outputs(settings, tier_file, name):
            lines.append(
                f"note: tenant '{name}' is bound, but its outcomes go to {topic}, which other tenants' "
                "outcomes go to too: its team gets no ACL to read it (give it results_topic and "
                "dead_letter_topic of its own)"
            )
    return lines


def tenant_lines(tier_file: Any) -> list[str]:
    """check-config's lines of the tier file's tenants, and a note per tier whose spend a USD
    budget cannot see (no `pricing`: its requests count as costing nothing)."""
    lines = []
    for name, tenant in (tier_file.tenants or {}).items():
        budget = tenant.budget
        caps = []
        if budget is not None and budget.usd_per_day is not None:
            caps.append(f"${budget.usd_per_day:g}/day")
        if budget is not None and budget.tokens_per_day is not None:
            caps.append(f"{budget.tokens_per_day} tokens/day")
        spent = f" budget {' and '.join(caps)}, then {tenant.on_exhausted}" if caps else ""
        lines.append(f"tenant {name}: weight {tenant.weight:g}{spent}")
    lines += budget_notes(tier_file)
    for tier in tier_file.unpriced_usd_budget():
        lines.append(
            f"note: tier '{tier}' has no pricing: its requests count as $0 against the tenants' USD budgets"
        )
    return lines


def budget_notes(tier_file: Any) -> list[str]:
    """A note per tenant whose daily budget is smaller than one request's estimate on a tier
    (its output estimate alone, at the tier's `options.max_tokens`): every job it sends there
    is refused before anything is spent."""
    from consumer.runtime.budgets import DEFAULT_OUTPUT_ESTIMATE_TOKENS

    notes = []
    for name, tenant in (tier_file.tenants or {}).items():
        budget = tenant.budget
        if budget is None:
            continue
        for tier_name, tier in tier_file.tiers.items():
            max_tokens = tier.options.get("max_tokens")
            output = max_tokens if isinstance(max_tokens, int) else DEFAULT_OUTPUT_ESTIMATE_TOKENS
            why = "its max_tokens" if isinstance(max_tokens, int) else "the tier names no max_tokens"
            usd = output * tier.pricing.output_per_mtok / 1e6 if tier.pricing is not None else 0.0
            if budget.tokens_per_day is not None and budget.tokens_per_day < output:
                over = f"{budget.tokens_per_day} tokens/day is less"
                least = f"{output} output tokens ({why}) plus its prompt"
            elif budget.usd_per_day is not None and budget.usd_per_day < usd:
                over = f"${budget.usd_per_day:g}/day is less"
                least = f"${usd:.4f} for {output} output tokens ({why}) plus its prompt"
            else:
                continue
            notes.append(
                f"note: tenant '{name}': {over} than one request on tier '{tier_name}' is estimated "
                f"at, {least}: its jobs there are refused and nothing is spent (docs/tenants.md#budgets)"
            )
    return notes


def add_run_command(sub: Any) -> None:
    """`run`."""
    run = sub.add_parser("run", help="run the service until SIGTERM/SIGINT (graceful drain)")
    run.add_argument("--config", help="tier file (YAML); default PROMPTBUS_CONFIG")
    run.add_argument("--log-level", default=os.environ.get("PROMPTBUS_LOG_LEVEL", "INFO"))
    add_bootstrap(run)
    run.set_defaults(func=cmd_run)


def add_check_config_command(sub: Any) -> None:
    """`check-config`."""
    check = sub.add_parser("check-config", help="validate a tier file")
    check.add_argument("--config", help="tier file (YAML); default PROMPTBUS_CONFIG")
    check.add_argument(
        "--acls",
        action="store_true",
        help="print the kafka-acls.sh commands promptbus's principal and each bound tenant's need",
    )
    check.set_defaults(func=cmd_check_config)
