"""The `promptbus` command. Subcommands parse arguments and call into the app; no logic here."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson

from consumer.core.errors import ConfigError


def _settings(args: argparse.Namespace) -> Any:
    from consumer.settings import load_settings

    overrides: dict[str, Any] = {}
    if getattr(args, "bootstrap", None):
        overrides["kafka_bootstrap_servers"] = args.bootstrap
    return load_settings(**overrides)


def _tier_file(args: argparse.Namespace) -> Any:
    from consumer.settings import load_tier_file

    path = args.config or os.environ.get("PROMPTBUS_CONFIG")
    if not path:
        raise ConfigError("--config", "no tier file given (use --config FILE or PROMPTBUS_CONFIG)")
    return load_tier_file(path)


def _configure_logging(level: str, *, kafka_level: str = "ERROR") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # aiokafka logs recoverable broker hiccups (leader moves, coordinator changes) at WARNING/ERROR
    # and retries them itself; they are noise unless debugging
    logging.getLogger("aiokafka").setLevel(logging.DEBUG if level.upper() == "DEBUG" else kafka_level)


# ---------------------------------------------------------------- run / check-config
def cmd_run(args: argparse.Namespace) -> int:
    from consumer.app import run_service, validate_keys

    _configure_logging(args.log_level)
    settings = _settings(args)
    tier_file = _tier_file(args)
    validate_keys(tier_file)
    return asyncio.run(run_service(settings, tier_file))


def cmd_check_config(args: argparse.Namespace) -> int:
    from consumer.app import validate_keys

    _settings(args)  # the environment's settings too: a bad one stops `run` the same way
    tier_file = _tier_file(args)
    problems = validate_keys(tier_file, strict=False)
    for name, tier in tier_file.tiers.items():
        flags = []
        if tier.batching.enabled:
            flags.append(f"batching max_items={tier.batching.max_items}")
        if tier.offline.enabled:
            flags.append("offline")
        print(f"tier {name}: {tier.provider} {tier.model} limiter={tier.limiter.algorithm} {' '.join(flags)}")
    for p in problems:
        print(f"warning: {p}", file=sys.stderr)
    print(f"ok: {len(tier_file.tiers)} tier(s)")
    return 0


# ---------------------------------------------------------------- submit
def _jobs_from_args(args: argparse.Namespace) -> Iterator[bytes]:
    from consumer.runtime.outcomes import MAX_VALUE_BYTES

    if args.file:
        path = Path(args.file)
        # checked as the file streams out: a bad line stops it there
        stopped = "the lines before it were submitted, none from it on"
        with path.open("rb") as fh:
            for n, line in enumerate(fh, 1):
                line = line.strip()
                if not line:
                    continue
                if len(line) > MAX_VALUE_BYTES:
                    reason = f"job is {len(line)} bytes, over the {MAX_VALUE_BYTES} a record may carry"
                    raise ConfigError(f"{path}:{n}", f"{reason}; {stopped}")
                try:
                    orjson.loads(line)
                except orjson.JSONDecodeError as exc:
                    raise ConfigError(f"{path}:{n}", f"not JSON: {exc}; {stopped}") from None
                yield line
        return
    if not args.tier or args.prompt is None:
        raise ConfigError("submit", "give --file FILE, or --tier and --prompt")
    variables: dict[str, str] = {}
    for pair in args.var or []:
        name, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError("--var", f"expected name=value, got {pair!r}")
        variables[name] = value
    job: dict[str, Any] = {"id": args.id or uuid.uuid4().hex, "tier": args.tier, "prompt": args.prompt}
    if variables:
        job["variables"] = variables
    if args.batch:
        job["batch"] = True
    if args.offline:
        job["mode"] = "offline"
    print(job["id"])
    yield orjson.dumps(job)


def _key_of(value: bytes) -> bytes | None:
    try:
        jid = orjson.loads(value).get("id")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return jid.encode() if isinstance(jid, str) else None


def cmd_submit(args: argparse.Namespace) -> int:
    from consumer.kafka.admin import ensure_topics
    from consumer.kafka.clients import submit_jobs

    _configure_logging("WARNING", kafka_level="CRITICAL")
    settings = _settings(args)
    started = time.monotonic()
    last = [0.0]

    def progress(n: int) -> None:
        now = time.monotonic()
        if args.file and sys.stderr.isatty() and (now - last[0] > 0.5):
            last[0] = now
            print(
                f"\rsubmitted {n} jobs ({n / max(now - started, 1e-6):.0f}/s)",
                end="",
                file=sys.stderr,
                flush=True,
            )

    async def go() -> int:
        await ensure_topics(settings)
        return await submit_jobs(settings, _jobs_from_args(args), progress=progress, key_of=_key_of)

    n = asyncio.run(go())
    if args.file:
        print(f"\rsubmitted {n} jobs in {time.monotonic() - started:.1f}s", file=sys.stderr)
    return 0


# ---------------------------------------------------------------- results / stats
def cmd_results(args: argparse.Namespace) -> int:
    from consumer.kafka.clients import read_topic

    _configure_logging("WARNING", kafka_level="CRITICAL")
    settings = _settings(args)
    topic = settings.dlq_topic if args.dlq else settings.results_topic

    async def go() -> None:
        async for key, value in read_topic(
            settings, topic, from_beginning=args.from_beginning or not args.follow, follow=args.follow
        ):
            if value is None:
                continue
            try:
                line = value.decode("utf-8")
            except UnicodeDecodeError:  # not promptbus's: another tool wrote to the topic
                print(f"promptbus results: skipped record {key!r}: not UTF-8", file=sys.stderr)
                continue
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    try:
        asyncio.run(go())
    except KeyboardInterrupt:
        pass
    return 0


def _budget_text(tier: dict[str, Any]) -> str:
    """The provider budgets the limiter paces by, when it learnt any."""
    parts = []
    if tier.get("budget_requests_per_s"):
        parts.append(f"{tier['budget_requests_per_s']:g} req/s")
    if tier.get("budget_tokens_per_s"):
        parts.append(f"{tier['budget_tokens_per_s']:g} tokens/s")
    return f" paced at {' and '.join(parts)}" if parts else ""


def format_stats(merged: dict[str, Any]) -> str:
    lines = [
        f"instances: {merged['instances_live']} live, {merged['instances_seen']} seen",
        f"items in: {merged['items_in']}   results: {merged['results']}   in flight: {merged['inflight']}",
        "dead letters: "
        + (", ".join(f"{k}={v}" for k, v in sorted(merged["dead_letters"].items())) or "none"),
    ]
    for name, t in sorted(merged["tiers"].items()):
        lines.append(
            f"tier {name}: requests={t.get('provider_requests', 0)} batched={t.get('batched_requests', 0)} "
            f"saved={t.get('requests_saved', 0)} reasks={t.get('reasks', 0)} splits={t.get('splits', 0)} "
            f"retries={t.get('retries', 0)} 429s={t.get('rate_limited', 0)} limit={t.get('limit', 0)} "
            f"batch_size={t.get('batch_size', 0)}" + _budget_text(t)
        )
    for name, per_size in sorted(merged.get("agreement", {}).items()):
        parts = [
            f"size {size}: {c['agreed']}/{c['compared']}"
            for size, c in sorted(per_size.items(), key=lambda kv: int(kv[0]))
        ]
        lines.append(f"tier {name} agreement (batched vs alone): " + ", ".join(parts))
    return "\n".join(lines)


def cmd_stats(args: argparse.Namespace) -> int:
    from consumer.kafka.clients import read_stats_records
    from consumer.runtime.stats import merge_snapshots, read_snapshot

    _configure_logging("WARNING", kafka_level="CRITICAL")
    settings = _settings(args)
    snapshots = []
    for key, value in asyncio.run(read_stats_records(settings)).items():
        try:
            snapshots.append(read_snapshot(value))
        except ValueError as exc:  # the topic may hold what another tool wrote
            print(f"promptbus stats: skipped record {key!r}, not a stats snapshot: {exc}", file=sys.stderr)
    merged = merge_snapshots(snapshots, now_s=time.time(), live_within_s=3 * settings.stats_interval_s + 5)
    if args.json:
        print(orjson.dumps(merged, option=orjson.OPT_INDENT_2).decode())
    else:
        print(format_stats(merged))
    return 0


# ---------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="promptbus", description="A Kafka consumer service for LLM work.")
    sub = parser.add_subparsers(dest="command", required=True)

    def kafka_opt(p: argparse.ArgumentParser) -> None:
        p.add_argument("--bootstrap", help="Kafka bootstrap servers (default: KAFKA_BOOTSTRAP_SERVERS)")

    run = sub.add_parser("run", help="run the service until SIGTERM/SIGINT (graceful drain)")
    run.add_argument("--config", help="tier file (YAML); default PROMPTBUS_CONFIG")
    run.add_argument("--log-level", default=os.environ.get("PROMPTBUS_LOG_LEVEL", "INFO"))
    kafka_opt(run)
    run.set_defaults(func=cmd_run)

    submit = sub.add_parser("submit", help="publish one job, or many from a JSONL file")
    submit.add_argument("--tier")
    submit.add_argument("--prompt")
    submit.add_argument("--var", action="append", metavar="NAME=VALUE", help="template variable (repeatable)")
    submit.add_argument("--batch", action="store_true", help="the job may share a prompt with others")
    submit.add_argument("--offline", action="store_true", help="mode offline (provider Batch API)")
    submit.add_argument("--id", help="job id (default: random)")
    submit.add_argument("--file", help="JSONL file, one job per line")
    kafka_opt(submit)
    submit.set_defaults(func=cmd_submit)

    results = sub.add_parser("results", help="print results (or dead letters) as JSON lines")
    results.add_argument("--follow", action="store_true", help="keep printing new records")
    results.add_argument("--dlq", action="store_true", help="read the dead-letter topic")
    results.add_argument(
        "--from-beginning", action="store_true", help="with --follow: start at the beginning"
    )
    kafka_opt(results)
    results.set_defaults(func=cmd_results)

    stats = sub.add_parser("stats", help="items, requests, requests saved by batching, 429s, limits")
    stats.add_argument("--json", action="store_true")
    kafka_opt(stats)
    stats.set_defaults(func=cmd_stats)

    check = sub.add_parser("check-config", help="validate a tier file")
    check.add_argument("--config", help="tier file (YAML); default PROMPTBUS_CONFIG")
    check.set_defaults(func=cmd_check_config)

    from consumer.testing import simulator

    sim = sub.add_parser("simulate", help="run the fake provider server (OpenAI + Anthropic wire formats)")
    simulator.add_arguments(sim)
    sim.set_defaults(func=simulator.run_from_args)

    from consumer import localmodel

    local = sub.add_parser(
        "local-model", help="the local llama.cpp server with SmolLM2 (serve, stop, status)"
    )
    localmodel.add_arguments(local)
    local.set_defaults(func=localmodel.run_from_args)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"promptbus: config error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        from aiokafka.errors import KafkaConnectionError

        if not isinstance(exc, KafkaConnectionError):
            raise
        # a clear line, not a traceback; exit 1 so a supervisor starts it again later
        print(f"promptbus: cannot reach Kafka: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
