"""The `promptbus` command: the argument tree assembled from one module per command group, and
`main`, which runs the chosen command and turns a configuration or Kafka failure into one line.

The commands live beside their options: `run` (run, check-config), `jobs` (submit, results,
map), `replay`, `stats` (with its text form), `backfill`, `simulate`, `local_model`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from consumer.cli.backfill import add_backfill_command
from consumer.cli.environment import load_settings
from consumer.cli.jobs import add_map_command, add_results_command, add_submit_command
from consumer.cli.local_model import add_local_model_command
from consumer.cli.parser import CommandParser, OneLineParser
from consumer.cli.replay import add_replay_command
from consumer.cli.run import add_check_config_command, add_run_command
from consumer.cli.simulate import add_simulate_command
from consumer.cli.stats import add_stats_command
from consumer.core.errors import ConfigError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The `promptbus` parser, every subcommand registered (heavy ones load on first use)."""
    parser = OneLineParser(prog="promptbus", description="A Kafka consumer service for LLM work.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=CommandParser)
    add_run_command(sub)
    add_submit_command(sub)
    add_results_command(sub)
    add_map_command(sub)
    add_replay_command(sub)
    add_stats_command(sub)
    add_check_config_command(sub)
    add_backfill_command(sub)
    add_simulate_command(sub)
    add_local_model_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command `argv` names (default: sys.argv); its exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        for line in exc.lines():
            print(f"promptbus: {exc.what} error: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except OSError as exc:
        if exc.filename is None:  # a file names itself; anything else (sockets) is not bad input
            raise
        print(f"promptbus: cannot use {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        from aiokafka.errors import KafkaConnectionError

        from consumer.kafka.connection import SASL_REFUSALS, sasl_refused, unreachable

        if isinstance(exc, SASL_REFUSALS):
            # refused after the connection check passed: the same line as a refusal there
            print(f"promptbus: config error: {sasl_refused(load_settings(args).kafka)}", file=sys.stderr)
            return 2
        if not isinstance(exc, KafkaConnectionError):
            raise
        # a clear line, not a traceback; exit 1 so a supervisor starts it again later
        print(f"promptbus: cannot reach Kafka: {unreachable(exc, load_settings(args))}", file=sys.stderr)
        return 1
