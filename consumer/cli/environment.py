"""What every `promptbus` command reads before it works: settings, the tier file, logging, Kafka."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from collections.abc import Callable
from typing import Any

from consumer.core.errors import UsageError


def add_bootstrap(parser: argparse.ArgumentParser) -> None:
    """The `--bootstrap` option of a command that talks to Kafka."""
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers (default: KAFKA_BOOTSTRAP_SERVERS)")


def load_settings(args: argparse.Namespace) -> Any:
    """The environment's settings, with `--bootstrap` when the command has it."""
    from consumer.settings import load_settings as load

    overrides: dict[str, Any] = {}
    if getattr(args, "bootstrap", None):
        overrides["kafka_bootstrap_servers"] = args.bootstrap
    return load(**overrides)


def check_kafka(settings: Any) -> None:
    """One connection to a bootstrap server first: a refused SASL login or no broker at all
    becomes one clear line (main) instead of aiokafka's retries and a generic failure."""
    from consumer.kafka.connection import check_connection

    asyncio.run(check_connection(settings))


def kafka_settings(args: argparse.Namespace) -> Any:
    """Settings of a command that talks to Kafka, its connection checked."""
    settings = load_settings(args)
    check_kafka(settings)
    return settings


def load_tier_file(args: argparse.Namespace) -> Any:
    """The tier file of `--config`, else of PROMPTBUS_CONFIG."""
    from consumer.settings import load_tier_file as load

    path = args.config or os.environ.get("PROMPTBUS_CONFIG")
    if not path:
        raise UsageError("--config", "no tier file given (use --config FILE or PROMPTBUS_CONFIG)")
    return load(path)


def load_config(args: argparse.Namespace, warn: Callable[[str], None]) -> tuple[Any, Any]:
    """The settings and the tier file of `run`, validated whole (environment, tier file and
    what building the tiers would refuse) before anything touches Kafka or a provider: one
    check, so `check-config` refuses exactly what `run` refuses, in the same words. `warn`
    is told of every PROMPTBUS_ variable that is no setting."""
    from consumer.app import validate_config
    from consumer.settings.environment import unknown_variables

    for line in unknown_variables():
        warn(line)
    settings = load_settings(args)
    tier_file = load_tier_file(args)
    source = args.config or os.environ.get("PROMPTBUS_CONFIG")
    validate_config(tier_file, source=source, jobs_topic=settings.jobs_topic)
    return settings, tier_file


def configure_logging(level: str, *, kafka_level: str = "ERROR") -> None:
    """Root logging at `level`; aiokafka's own records from `kafka_level` up."""
    from consumer.kafka.client_logs import install_kafka_log_handler

    root_level = getattr(logging, level.upper(), logging.INFO)
    logging.basicConfig(level=root_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # aiokafka logs recoverable broker hiccups (leader moves, coordinator changes) at WARNING/ERROR
    # and retries them itself, and an ERROR per failed reconnect while a broker is away: its
    # handler folds an outage into one WARNING and one INFO and keeps hiccups for DEBUG.
    # kafka_level: the least level of aiokafka's own records shown (CRITICAL: none, no summary)
    passthrough = logging.DEBUG if root_level <= logging.DEBUG else getattr(logging, kafka_level.upper())
    install_kafka_log_handler(passthrough_level=passthrough, announce=passthrough <= logging.ERROR)
