"""`promptbus run` (the service) and `promptbus check-config` (its configuration, checked)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from consumer.cli.environment import add_bootstrap, check_kafka, configure_logging, load_config
from consumer.core.embed import embed_limits, no_embeddings


def cmd_run(args: argparse.Namespace) -> int:
    """Run the service until SIGTERM/SIGINT."""
    from consumer.app import run_service
    from consumer.runtime import eventloop

    configure_logging(args.log_level)
    settings, tier_file = load_config(args)
    check_kafka(settings)
    return eventloop.run(run_service(settings, tier_file), settings.event_loop)


def cmd_check_config(args: argparse.Namespace) -> int:
    """Validate the tier file and the environment as `run` does; print the tiers."""
    _, tier_file = load_config(args)
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
    print(f"ok: {len(tier_file.tiers)} tier(s)")
    return 0


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
    for tier in tier_file.unpriced_usd_budget():
        lines.append(
            f"note: tier '{tier}' has no pricing: its requests count as $0 against the tenants' USD budgets"
        )
    return lines


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
    check.set_defaults(func=cmd_check_config)
