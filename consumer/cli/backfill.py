"""`promptbus backfill SOURCE --from TIME [--to TIME]`: one source's topic enriched over a
bounded range of its records, beside the live service.

It runs the service with that one source only, in a consumer group of its own
(`GROUP.backfill.SOURCE`), so the live source goes on in its group. The range is the offsets
at `--from` up to those at `--to` (else the end offsets when the backfill first started),
fixed at its first start: it is kept under a reserved key of the memo topic
(`PROMPTBUS_ENRICHMENTS_TOPIC`), so a backfill killed and started again goes on from its own
committed offsets up to the same end. Records past the end are committed without a write.
It prints its progress to stderr and a summary line when every partition reached its end,
then exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from datetime import datetime
from typing import Any

import orjson

from consumer.cli.environment import add_bootstrap, check_kafka, configure_logging, load_config
from consumer.core.errors import UsageError

#: how often the progress line is written
PROGRESS_S = 1.0


def parse_time(text: str, flag: str) -> int:
    """An RFC 3339 time (or a date) as Unix milliseconds; UsageError naming the flag."""
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(flag, f"{text!r} is not an RFC 3339 time (e.g. 2026-12-01T00:00:00Z)") from None
    if value.tzinfo is None:
        raise UsageError(flag, f"{text!r} names no time zone (add Z or +00:00)")
    return int(value.timestamp() * 1000)


def range_key(source: str) -> bytes:
    """The memo topic's key of a backfill's range (no source memo key starts with a NUL)."""
    return b"\x00backfill\x00" + source.encode()


async def backfill(settings: Any, tier_file: Any, name: str, from_ms: int, to_ms: int | None) -> int:
    from consumer.app import run_service
    from consumer.kafka.admin import ensure_topics
    from consumer.kafka.clients import job_producer, read_latest
    from consumer.kafka.ranges import commit_offsets, committed_offsets, offsets_at

    source = tier_file.sources[name]
    group = f"{settings.group_id}.backfill.{name}"
    run_settings = settings.model_copy(update={"group_id": group})
    await ensure_topics(settings, enriched_topics=[source.into.topic])
    kept = (await read_latest(settings, settings.enrichments_topic)).get(range_key(name))
    starts = await offsets_at(settings, source.topic, from_ms)
    state = orjson.loads(kept) if kept else None
    if state is not None and state.get("from_ms") == from_ms and state.get("to_ms") == to_ms:
        ends = {int(p): int(o) for p, o in state["ends"].items()}
    else:
        ends = await offsets_at(settings, source.topic, to_ms)
        kept_ends = {str(p): o for p, o in ends.items()}
        value = orjson.dumps({"from_ms": from_ms, "to_ms": to_ms, "ends": kept_ends})
        producer = job_producer(settings)
        await producer.start()
        try:
            await producer.send_and_wait(settings.enrichments_topic, value, key=range_key(name))
        finally:
            await producer.stop()
    committed = await committed_offsets(settings, group, source.topic)
    if not committed:
        await commit_offsets(settings, group, source.topic, {p: min(starts[p], ends[p]) for p in ends})
        committed = await committed_offsets(settings, group, source.topic)
    total = sum(max(0, ends[p] - starts[p]) for p in ends)
    print(f"backfill {name}: {source.topic}, {total} records from {len(ends)} partitions", file=sys.stderr)

    def done_count(now: dict[int, int]) -> int:
        return sum(max(0, min(now.get(p, starts[p]), ends[p]) - starts[p]) for p in ends)

    if all(committed.get(p, starts[p]) >= ends[p] for p in ends):
        print(f"backfill {name}: nothing left: {done_count(committed)} of {total} records done")
        return 0
    stop = asyncio.Event()
    stats: dict[str, Any] = {}

    async def watch() -> None:
        t0 = time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(PROGRESS_S)
            now = await committed_offsets(settings, group, source.topic)
            done = done_count(now)
            share = done / total if total else 1.0
            bar = "#" * int(share * 30)
            print(
                f"\rbackfill {name}: [{bar:<30}] {done}/{total} ({share:.0%}) {time.monotonic() - t0:.0f} s",
                end="", file=sys.stderr, flush=True,
            )
            if all(now.get(p, starts[p]) >= ends[p] for p in ends):
                stop.set()

    watcher = asyncio.create_task(watch())
    started = time.monotonic()
    code = await run_service(
        run_settings,
        tier_file.model_copy(update={"sources": {name: source}, "lanes": None}),
        stop=stop,
        source_range=ends,
        on_started=lambda service: stats.update(source=service.stats.source(name)),
    )
    watcher.cancel()
    print(file=sys.stderr)
    if code != 0:
        return code
    final = await committed_offsets(settings, group, source.topic)
    counted = stats["source"].as_dict() if "source" in stats else {}
    dead = sum((counted.get("dead_letters") or {}).values())
    print(
        f"backfill {name}: {done_count(final)} of {total} records in {time.monotonic() - started:.1f} s: "
        f"enriched={counted.get('enriched', 0)} skipped_unchanged={counted.get('skipped_unchanged', 0)} "
        f"tombstones={counted.get('tombstones', 0)} dead_letters={dead}"
    )
    return 0 if all(final.get(p, starts[p]) >= ends[p] for p in ends) else 1


def cmd_backfill(args: argparse.Namespace) -> int:
    from consumer.runtime import eventloop

    configure_logging(args.log_level, kafka_level="CRITICAL")
    settings, tier_file = load_config(args, logging.getLogger("promptbus.settings").warning)
    sources = tier_file.sources or {}
    if args.source not in sources:
        known = ", ".join(sorted(sources)) or "none: the tier file has no sources"
        raise UsageError("SOURCE", f"unknown source {args.source!r} (sources: {known})")
    from_ms = parse_time(args.from_time, "--from")
    to_ms = parse_time(args.to_time, "--to") if args.to_time else None
    if to_ms is not None and to_ms <= from_ms:
        raise UsageError("--to", "must be after --from")
    check_kafka(settings)
    return eventloop.run(backfill(settings, tier_file, args.source, from_ms, to_ms), settings.event_loop)


def add_backfill_command(sub: Any) -> None:
    """`backfill`."""
    b = sub.add_parser("backfill", help="enrich a bounded range of a source's topic (resumable)")
    b.add_argument("source", metavar="SOURCE", help="the source's name in the tier file")
    b.add_argument("--from", dest="from_time", required=True, help="RFC 3339 time: the range's first records")
    b.add_argument("--to", dest="to_time", help="RFC 3339 time: the range ends before it (default: now)")
    b.add_argument("--config", help="tier file (YAML); default PROMPTBUS_CONFIG")
    b.add_argument("--log-level", default=os.environ.get("PROMPTBUS_LOG_LEVEL", "WARNING"))
    add_bootstrap(b)
    b.set_defaults(func=cmd_backfill)
