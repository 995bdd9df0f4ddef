"""The `promptbus` command. Subcommands parse arguments and call into the app; no logic here."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson

from consumer.core.cost import BatchSaving
from consumer.core.errors import ConfigError


def _settings(args: argparse.Namespace) -> Any:
    from consumer.settings import load_settings

    overrides: dict[str, Any] = {}
    if getattr(args, "bootstrap", None):
        overrides["kafka_bootstrap_servers"] = args.bootstrap
    return load_settings(**overrides)


def _check_kafka(settings: Any) -> None:
    """One connection to a bootstrap server first: a refused SASL login or no broker at all
    becomes one clear line (main) instead of aiokafka's retries and a generic failure."""
    from consumer.kafka.connection import check_connection

    asyncio.run(check_connection(settings))


def _kafka_settings(args: argparse.Namespace) -> Any:
    """Settings of a command that talks to Kafka, its connection checked."""
    settings = _settings(args)
    _check_kafka(settings)
    return settings


def _tier_file(args: argparse.Namespace) -> Any:
    from consumer.settings import load_tier_file

    path = args.config or os.environ.get("PROMPTBUS_CONFIG")
    if not path:
        raise ConfigError("--config", "no tier file given (use --config FILE or PROMPTBUS_CONFIG)")
    return load_tier_file(path)


def _configure_logging(level: str, *, kafka_level: str = "ERROR") -> None:
    from consumer.kafka.logs import install_kafka_log_handler

    root_level = getattr(logging, level.upper(), logging.INFO)
    logging.basicConfig(level=root_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # aiokafka logs recoverable broker hiccups (leader moves, coordinator changes) at WARNING/ERROR
    # and retries them itself, and an ERROR per failed reconnect while a broker is away: its
    # handler folds an outage into one WARNING and one INFO and keeps hiccups for DEBUG.
    # kafka_level: the least level of aiokafka's own records shown (CRITICAL: none, no summary)
    passthrough = logging.DEBUG if root_level <= logging.DEBUG else getattr(logging, kafka_level.upper())
    install_kafka_log_handler(passthrough_level=passthrough, announce=passthrough <= logging.ERROR)


# ---------------------------------------------------------------- run / check-config
def cmd_run(args: argparse.Namespace) -> int:
    from consumer.app import run_service, validate_keys

    _configure_logging(args.log_level)
    settings = _settings(args)
    tier_file = _tier_file(args)
    validate_keys(tier_file)
    _check_kafka(settings)
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
    settings = _kafka_settings(args)
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
    settings = _kafka_settings(args)
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


def _circuit_text(tier: dict[str, Any]) -> str:
    """Whether the tier's provider answers: the circuit's state, outages so far, held requests."""
    opened, held = tier.get("circuit_opened", 0), tier.get("held_requests", 0)
    history = f" (opened {opened}x, {held} requests held)" if opened else ""
    if tier.get("circuit_open"):
        return f"OPEN for {tier.get('outage_s', 0):g} s: provider unreachable, jobs held" + history
    return "closed" + history


def _cost_text(t: dict[str, Any]) -> str:
    """A tier's tokens, cost, dedupe and what batching saved (measured, or an estimate)."""
    text = (
        f"in={int(t.get('input_tokens', 0))} out={int(t.get('output_tokens', 0))} "
        f"cached_in={int(t.get('cached_input_tokens', 0))} cache_write={int(t.get('cache_write_tokens', 0))} "
        f"cost=${float(t.get('cost_usd', 0.0)):.4f} deduped={int(t.get('deduped', 0))}"
    )
    saving = BatchSaving.from_counts(
        verify_batched_tokens=int(t.get("verify_batched_tokens", 0)),
        verify_alone_tokens=int(t.get("verify_alone_tokens", 0)),
        batched_tokens=int(t.get("batched_tokens", 0)),
        alone_tokens_estimate=int(t.get("alone_tokens_estimate", 0)),
    )
    fraction = saving.saved_fraction
    if fraction is not None:
        how = "measured on verified jobs" if saving.measured else "estimate from prompt lengths"
        text += (
            f"; batching saved {fraction:.0%} of tokens ({saving.batched} batched vs "
            f"{saving.alone} alone, {how})"
        )
    return text


def format_stats(merged: dict[str, Any]) -> str:
    from consumer.runtime.stats import routing_lines

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
        if t.get("batch_size_reason"):
            # the adaptive rule's own words: the size in use and the evidence for it
            lines.append(f"tier {name} batch {t['batch_size_reason']}")
        lines.append(f"tier {name} circuit: " + _circuit_text(t))
        lines.append(f"tier {name} tokens: " + _cost_text(t))
        lines.extend(routing_lines(name, t))
    for name, per_size in sorted(merged.get("agreement", {}).items()):
        parts = [
            f"size {size}: {c['agreed']}/{c['compared']}"
            for size, c in sorted(per_size.items(), key=lambda kv: int(kv[0]))
        ]
        lines.append(f"tier {name} agreement (batched vs alone): " + ", ".join(parts))
    return "\n".join(lines)


def cmd_stats(args: argparse.Namespace) -> int:
    from consumer.kafka.clients import read_latest
    from consumer.runtime.stats import merge_snapshots, read_snapshot

    _configure_logging("WARNING", kafka_level="CRITICAL")
    settings = _kafka_settings(args)
    snapshots = []
    for key, value in asyncio.run(read_latest(settings, settings.stats_topic)).items():
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


# ---------------------------------------------------------------- map
def cmd_map(args: argparse.Namespace) -> int:
    from consumer.client import (
        Client,
        MapTimeout,
        ProgressBar,
        failure_counts,
        read_inputs,
        run_started_at,
        write_outcomes,
    )

    _configure_logging("WARNING", kafka_level="CRITICAL")
    if args.collect:
        if args.total is None:
            raise ConfigError("--total", "--collect RUN_ID needs --total N (the run's number of inputs)")
    elif not args.tier or not (args.inputs or args.inputs_jsonl):
        raise ConfigError("map", "give --tier T and --inputs FILE or --inputs-jsonl FILE, or --collect")
    bar = ProgressBar(sys.stderr)

    def write(outcomes: Any) -> None:
        if args.out:
            with Path(args.out).open("wb") as fh:
                write_outcomes(outcomes, fh)
        else:
            write_outcomes(outcomes, sys.stdout.buffer)
            sys.stdout.flush()

    try:
        with Client(_settings(args)) as client:
            if args.collect:
                outcomes = client.collect(
                    args.collect, args.total, since=args.since, timeout_s=args.timeout_s, on_progress=bar
                )
            else:
                path = args.inputs or args.inputs_jsonl
                outcomes = client.map(
                    args.tier,
                    read_inputs(path, jsonl=bool(args.inputs_jsonl)),
                    prompt=args.prompt,
                    batch=args.batch,
                    options=orjson.loads(args.options) if args.options else None,
                    mode=args.mode,
                    run_id=args.run_id,
                    on_progress=bar,
                    timeout_s=args.timeout_s,
                )
    except MapTimeout as exc:
        bar.close()
        write(exc.outcomes)
        since = "" if run_started_at(exc.run_id) else f" --since {exc.started_at:.3f}"
        done = sum(1 for o in exc.outcomes if not o.pending)
        print(
            f"promptbus map: timed out after {exc.timeout_s:g} s with {done} of {exc.total} outcomes; "
            f"nothing was cancelled. Resume with:\n  promptbus map --collect {exc.run_id} "
            f"--total {exc.total}{since}",
            file=sys.stderr,
        )
        return 3
    except (ValueError, orjson.JSONDecodeError) as exc:
        bar.close()
        print(f"promptbus map: {exc}", file=sys.stderr)
        return 2
    bar.close()
    write(outcomes)
    failed = failure_counts(outcomes)
    if failed:
        kinds = ", ".join(f"{kind}={n}" for kind, n in failed.items())
        print(f"promptbus map: {sum(failed.values())} of {len(outcomes)} failed: {kinds}", file=sys.stderr)
        return 1
    return 0


def _add_map_command(sub: Any) -> None:
    m = sub.add_parser("map", help="submit one job per input and wait: outcomes in input order")
    m.add_argument("--tier", help="the tier every job goes to")
    m.add_argument("--prompt", help="template whose one ${name} takes each input (default: input = prompt)")
    src = m.add_mutually_exclusive_group()
    src.add_argument("--inputs", metavar="FILE", help="one input per line, plain text (- for stdin)")
    src.add_argument("--inputs-jsonl", metavar="FILE", help="one JSON string or object of variables per line")
    m.add_argument("--batch", action="store_true", help="the jobs may share a prompt (batchable template)")
    m.add_argument("--options", metavar="JSON", help="provider options, e.g. '{\"max_tokens\": 8}'")
    m.add_argument("--mode", default="online", help="online (default) or offline (provider Batch API)")
    m.add_argument("--run-id", help="run id (default: random, with the start time); job ids: RUN_ID-INDEX")
    m.add_argument("--timeout-s", type=float, help="stop waiting after S seconds (exit 3; nothing cancelled)")
    m.add_argument("--out", metavar="FILE", help="write the outcomes here instead of stdout")
    m.add_argument("--collect", metavar="RUN_ID", help="collect the outcomes of an earlier run")
    m.add_argument("--total", type=int, help="with --collect: the run's number of inputs")
    m.add_argument("--since", type=float, help="with --collect: the run's start (Unix s) for a chosen run id")
    m.add_argument("--bootstrap", help="Kafka bootstrap servers (default: KAFKA_BOOTSTRAP_SERVERS)")
    m.set_defaults(func=cmd_map)


# ---------------------------------------------------------------- replay
def cmd_replay(args: argparse.Namespace) -> int:
    from datetime import datetime

    from consumer.core.errors import ErrorKind
    from consumer.kafka.replay import ReplayFilter, replay_dead_letters

    _configure_logging("WARNING", kafka_level="CRITICAL")
    if not args.dlq:
        raise ConfigError("replay", "give --dlq (dead letters are what replay republishes)")
    known = {k.value for k in ErrorKind}
    kinds = frozenset(args.kind or ())
    unknown = sorted(kinds - known)
    if unknown:
        raise ConfigError("--kind", f"unknown error kind {unknown[0]!r} (known: {', '.join(sorted(known))})")
    since = None
    if args.since:
        try:
            since = datetime.fromisoformat(args.since)
        except ValueError:
            raise ConfigError("--since", f"not an RFC 3339 time: {args.since!r}") from None
        if since.tzinfo is None:
            raise ConfigError("--since", f"give a UTC offset (e.g. Z): {args.since!r}")
    settings = _kafka_settings(args)
    flt = ReplayFilter(kinds=kinds, tier=args.tier, since=since)
    report = asyncio.run(replay_dead_letters(settings, flt, dry_run=args.dry_run))
    if args.dry_run:
        for r in report.replays:
            print(f"would replay {r.job_id or '(no id)'} ({r.kind}) from {r.dead_letter}")
    for line in report.summary():
        print(line)
    for problem in report.problems:
        print(f"promptbus replay: not replayable: {problem}", file=sys.stderr)
    if report.incomplete:
        print(f"promptbus replay: {report.incomplete}", file=sys.stderr)
        return 1
    return 0


def _add_replay_command(sub: Any) -> None:
    r = sub.add_parser("replay", help="republish dead letters' jobs to the jobs topic (--dlq)")
    r.add_argument("--dlq", action="store_true", help="replay from the dead-letter topic")
    r.add_argument("--kind", action="append", metavar="KIND", help="only this error kind (repeatable)")
    r.add_argument("--tier", help="only jobs of this tier")
    r.add_argument("--since", metavar="TIME", help="only dead letters failed at or after this RFC 3339 time")
    r.add_argument("--dry-run", action="store_true", help="print what would be replayed; produce nothing")
    r.add_argument("--bootstrap", help="Kafka bootstrap servers (default: KAFKA_BOOTSTRAP_SERVERS)")
    r.set_defaults(func=cmd_replay)


# ---------------------------------------------------------------- parser
class CommandParser(argparse.ArgumentParser):
    """A subcommand's parser whose options, with `load`, are added on first use.

    `load(parser)` runs once, before the parser first parses or formats its help, so a
    subcommand's module is imported only when that subcommand runs or is asked for help.
    """

    def __init__(
        self, *args: Any, load: Callable[[argparse.ArgumentParser], None] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._load = load

    def _ensure_loaded(self) -> None:
        load, self._load = self._load, None
        if load is not None:
            load(self)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        """Load the options, then parse as ArgumentParser does."""
        self._ensure_loaded()
        return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        """Load the options, then format the usage line."""
        self._ensure_loaded()
        return super().format_usage()

    def format_help(self) -> str:
        """Load the options, then format the help."""
        self._ensure_loaded()
        return super().format_help()


def module_command(module: str) -> Callable[[argparse.ArgumentParser], None]:
    """A `CommandParser` loader: import `module`, add its `add_arguments(parser)` options and
    make its `run_from_args(args)` the subcommand's function."""

    def load(parser: argparse.ArgumentParser) -> None:
        owner = importlib.import_module(module)
        owner.add_arguments(parser)
        parser.set_defaults(func=owner.run_from_args)

    return load


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="promptbus", description="A Kafka consumer service for LLM work.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=CommandParser)

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

    _add_map_command(sub)
    _add_replay_command(sub)

    stats = sub.add_parser("stats", help="items, requests, requests saved by batching, 429s, limits")
    stats.add_argument("--json", action="store_true")
    kafka_opt(stats)
    stats.set_defaults(func=cmd_stats)

    check = sub.add_parser("check-config", help="validate a tier file")
    check.add_argument("--config", help="tier file (YAML); default PROMPTBUS_CONFIG")
    check.set_defaults(func=cmd_check_config)

    # their modules pull in a web stack (starlette, uvicorn) or the local model's tooling: each is
    # imported only when its own subcommand is parsed or asked for help
    sub.add_parser(
        "simulate",
        help="run the fake provider server (OpenAI + Anthropic wire formats)",
        load=module_command("consumer.testing.simulator"),
    )
    sub.add_parser(
        "local-model",
        help="the local llama.cpp server with SmolLM2 (serve, stop, status)",
        load=module_command("consumer.localmodel"),
    )
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

        from consumer.kafka.connection import SASL_REFUSALS, sasl_refused

        if isinstance(exc, SASL_REFUSALS):
            # refused after the connection check passed: the same line as a refusal there
            print(f"promptbus: config error: {sasl_refused(_settings(args).kafka)}", file=sys.stderr)
            return 2
        if not isinstance(exc, KafkaConnectionError):
            raise
        # a clear line, not a traceback; exit 1 so a supervisor starts it again later
        print(f"promptbus: cannot reach Kafka: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
