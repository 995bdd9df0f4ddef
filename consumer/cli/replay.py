"""`promptbus replay --dlq`: republish dead letters' jobs to the jobs topic."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from consumer.cli.environment import add_bootstrap, configure_logging, kafka_settings, load_tier_file
from consumer.core.errors import UsageError


def cmd_replay(args: argparse.Namespace) -> int:
    from datetime import datetime

    from consumer.core.errors import ErrorKind
    from consumer.kafka.replay import ReplayFilter, left_behind_lines, replay_dead_letters
    from consumer.settings import tenant_settings

    configure_logging("WARNING", kafka_level="CRITICAL")
    if not args.dlq:
        raise UsageError("replay", "give --dlq (dead letters are what replay republishes)")
    known = {k.value for k in ErrorKind}
    kinds = frozenset(args.kind or ())
    unknown = sorted(kinds - known)
    if unknown:
        raise UsageError("--kind", f"unknown error kind {unknown[0]!r} (known: {', '.join(sorted(known))})")
    since = None
    if args.since:
        try:
            since = datetime.fromisoformat(args.since)
        except ValueError:
            raise UsageError("--since", f"not an RFC 3339 time: {args.since!r}") from None
        if since.tzinfo is None:
            raise UsageError("--since", f"give a UTC offset (e.g. Z): {args.since!r}")
    settings = kafka_settings(args)
    if args.tenant is not None:  # a tenant's own dead-letter topic; its jobs back to its topic
        settings = tenant_settings(settings, load_tier_file(args), args.tenant)
    flt = ReplayFilter(kinds=kinds, tier=args.tier, since=since)
    report = asyncio.run(replay_dead_letters(settings, flt, dry_run=args.dry_run))
    if args.dry_run:
        for r in report.replays:
            print(f"would replay {r.job_id or '(no id)'} ({r.kind}) from {r.dead_letter}")
    for line in [*report.summary(), *left_behind_lines(report, settings)]:
        print(line)
    for problem in report.problems:
        print(f"promptbus replay: not replayable: {problem}", file=sys.stderr)
    if report.incomplete:
        print(f"promptbus replay: {report.incomplete}", file=sys.stderr)
        return 1
    return 0


def add_replay_command(sub: Any) -> None:
    r = sub.add_parser("replay", help="republish dead letters' jobs to the jobs topic (--dlq)")
    r.add_argument("--dlq", action="store_true", help="replay from the dead-letter topic")
    r.add_argument("--kind", action="append", metavar="KIND", help="only this error kind (repeatable)")
    r.add_argument("--tier", help="only jobs of this tier")
    r.add_argument("--since", metavar="TIME", help="only dead letters failed at or after this RFC 3339 time")
    r.add_argument("--dry-run", action="store_true", help="print what would be replayed; produce nothing")
    r.add_argument("--tenant", help="replay this tenant's dead-letter topic (its topics from the tier file)")
    r.add_argument("--config", help="with --tenant: the tier file (YAML); default PROMPTBUS_CONFIG")
    add_bootstrap(r)
    r.set_defaults(func=cmd_replay)
