"""`promptbus submit`, `results` and `map`: jobs in, their outcomes out."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import orjson

from consumer.cli.environment import (
    add_bootstrap,
    check_kafka,
    configure_logging,
    kafka_settings,
    load_settings,
    load_tier_file,
)
from consumer.core.errors import JobInputError, UsageError
from consumer.settings import lane_topic, tenant_settings

if TYPE_CHECKING:
    from consumer.client import Outcome, ProgressBar


def _refused(where: str, value: bytes, stopped: str) -> JobInputError | None:
    """Why the service would dead-letter `value` for its own content (the words of that dead
    letter, `consumer.core.content`), None when it would not."""
    from consumer.core.content import check_job
    from consumer.core.errors import JobError

    try:
        check_job(value)
    except JobError as exc:
        return JobInputError(where, f"{exc.kind.value}: {exc}; {stopped}")
    return None


def _file_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """The non-empty lines of `path` with their numbers; ConfigError when it cannot be read."""
    try:
        with path.open("rb") as fh:
            for n, line in enumerate(fh, 1):
                line = line.strip()
                if line:
                    yield n, line
    except OSError as exc:
        raise UsageError("--file", f"cannot read {path}: {exc.strerror or exc}") from None


def _check_file(path: Path, max_job_bytes: int) -> int:
    """Every line of `path` checked as the service will read it, before any is submitted;
    the number of jobs. JobInputError naming the first bad line."""
    stopped = "nothing was submitted"
    count = 0
    for n, line in _file_lines(path):
        where = f"{path}:{n}"
        if len(line) > max_job_bytes:
            reason = f"job is {len(line)} bytes, over PROMPTBUS_MAX_JOB_BYTES ({max_job_bytes})"
            raise JobInputError(where, f"{reason}; {stopped}")
        try:
            orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise JobInputError(where, f"not JSON: {exc}; {stopped}") from None
        problem = _refused(where, line, stopped)
        if problem is not None:
            raise problem
        count += 1
    if count == 0:
        raise JobInputError("--file", f"{path} holds no jobs; nothing was submitted")
    return count


def _one_job(args: argparse.Namespace, max_job_bytes: int) -> bytes:
    """The job `--tier`, `--prompt`, `--var` ... describe, checked as the service will read it."""
    if not args.tier or args.prompt is None:
        raise UsageError("submit", "give --file FILE, or --tier and --prompt")
    variables: dict[str, str] = {}
    for pair in args.var or []:
        name, sep, value = pair.partition("=")
        if not sep:
            raise UsageError("--var", f"expected name=value, got {pair!r}")
        variables[name] = value
    job: dict[str, Any] = {"id": args.id or uuid.uuid4().hex, "tier": args.tier, "prompt": args.prompt}
    if variables:
        job["variables"] = variables
    if args.batch:
        job["batch"] = True
    if args.offline:
        job["mode"] = "offline"
    if args.tenant is not None:
        job["tenant"] = args.tenant
    value = orjson.dumps(job)
    if len(value) > max_job_bytes:
        reason = f"job is {len(value)} bytes, over PROMPTBUS_MAX_JOB_BYTES ({max_job_bytes})"
        raise JobInputError("submit", f"{reason}; nothing was submitted")
    problem = _refused("submit", value, "nothing was submitted")
    if problem is not None:
        raise problem
    return value


def _tenant_header(tenant: str | None) -> list[tuple[str, bytes]]:
    """`submit --file --tenant T`: the header that names the tenant of every job of the file
    that names none in its `tenant` field (the field wins). UsageError for no tenant name."""
    from consumer.core.tenants import TENANT_HEADER, tenant_problem

    if tenant is None:
        return []
    problem = tenant_problem(tenant)
    if problem is not None:
        raise UsageError("--tenant", problem)
    return [(TENANT_HEADER, tenant.encode())]


def _key_of(value: bytes) -> bytes | None:
    try:
        jid = orjson.loads(value).get("id")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return jid.encode() if isinstance(jid, str) else None


def cmd_submit(args: argparse.Namespace) -> int:
    from consumer.kafka.admin import ensure_topics
    from consumer.kafka.clients import submit_jobs

    configure_logging("WARNING", kafka_level="CRITICAL")
    # every job checked before Kafka is asked anything: a refused one leaves the topic untouched
    headers = _tenant_header(args.tenant) if args.file else []
    settings = load_settings(args)
    jobs: Iterable[bytes]
    if args.file:
        path = Path(args.file)
        _check_file(path, settings.max_job_bytes)
        jobs = (line for _, line in _file_lines(path))
    else:
        job = _one_job(args, settings.max_job_bytes)
        jobs = [job]
    if args.lane or args.config or os.environ.get("PROMPTBUS_CONFIG"):
        tier_file = load_tier_file(args)
        # a bound tenant's jobs go to its own topic when no lane is named
        settings = tenant_settings(settings, tier_file, args.tenant)
        topic = lane_topic(tier_file, args.lane, settings.jobs_topic)
        if args.lane is None and topic != settings.jobs_topic:
            note = f"no --lane: sent to the lowest-priority lane's topic {topic}"
            print(f"promptbus submit: {note}", file=sys.stderr)
        settings = settings.model_copy(update={"jobs_topic": topic})
    check_kafka(settings)
    if not args.file:
        print(orjson.loads(job)["id"])
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
        return await submit_jobs(settings, jobs, progress=progress, key_of=_key_of, headers=headers)

    n = asyncio.run(go())
    if args.file:
        print(f"\rsubmitted {n} jobs in {time.monotonic() - started:.1f}s", file=sys.stderr)
    return 0


def cmd_results(args: argparse.Namespace) -> int:
    from consumer.kafka.clients import read_topic

    configure_logging("WARNING", kafka_level="CRITICAL")
    settings = kafka_settings(args)
    if args.tenant is not None:  # a tenant's own results and dead-letter topics
        settings = tenant_settings(settings, load_tier_file(args), args.tenant)
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


def _check_readable(flag: str, name: str) -> None:
    """UsageError naming `flag` when the file `name` cannot be read (- is stdin)."""
    if name == "-":
        return
    try:
        with Path(name).open("rb"):
            pass
    except OSError as exc:
        raise UsageError(flag, f"cannot read {name}: {exc.strerror or exc}") from None


def _check_writable(flag: str, name: str) -> None:
    """UsageError naming `flag` when the file `name` cannot be written (checked before the
    run, so its outcomes are not lost at the end)."""
    try:
        with Path(name).open("ab"):
            pass
    except OSError as exc:
        raise UsageError(flag, f"cannot write {name}: {exc.strerror or exc}") from None


def _options(text: str | None) -> dict[str, Any] | None:
    """`--options`: a JSON object, or None when not given; ConfigError naming it otherwise."""
    if not text:
        return None
    try:
        options = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise UsageError("--options", f"not JSON: {exc}") from None
    if not isinstance(options, dict):
        raise UsageError("--options", f"must be a JSON object, got {type(options).__name__}")
    return options


def cmd_map(args: argparse.Namespace) -> int:
    """Submit one job per input and wait: exit 0 when every input succeeded, 1 when some
    failed, 2 for bad input (nothing submitted), 3 on timeout (the `--collect` command that
    resumes on stderr)."""
    from consumer.client import MapTimeout, ProgressBar, failure_counts, run_started_at

    configure_logging("WARNING", kafka_level="CRITICAL")
    _check_map_args(args)
    options = _options(args.options)
    if args.out:
        _check_writable("--out", args.out)
    bar = ProgressBar(sys.stderr)
    try:
        outcomes = _map_outcomes(args, options, bar)
    except MapTimeout as exc:
        bar.close()
        _write_outcomes(args.out, exc.outcomes)
        since = "" if run_started_at(exc.run_id) else f" --since {exc.started_at:.3f}"
        done = sum(1 for o in exc.outcomes if not o.pending)
        print(
            f"promptbus map: timed out after {exc.timeout_s:g} s with {done} of {exc.total} outcomes; "
            f"nothing was cancelled. Resume with:\n  promptbus map --collect {exc.run_id} "
            f"--total {exc.total}{since}",
            file=sys.stderr,
        )
        return 3
    except ValueError as exc:
        bar.close()
        print(f"promptbus map: {exc}", file=sys.stderr)
        return 2
    bar.close()
    _write_outcomes(args.out, outcomes)
    failed = failure_counts(outcomes)
    if failed:
        kinds = ", ".join(f"{kind}={n}" for kind, n in failed.items())
        print(f"promptbus map: {sum(failed.values())} of {len(outcomes)} failed: {kinds}", file=sys.stderr)
        return 1
    return 0


def _check_map_args(args: argparse.Namespace) -> None:
    """ConfigError naming the flag when `map`'s arguments do not make a run (nothing is
    submitted then)."""
    if args.collect:
        if args.total is None:
            raise UsageError("--total", "--collect RUN_ID needs --total N (the run's number of inputs)")
        return
    if not args.tier or not (args.inputs or args.inputs_jsonl):
        raise UsageError("map", "give --tier T and --inputs FILE or --inputs-jsonl FILE, or --collect")
    flag = "--inputs" if args.inputs else "--inputs-jsonl"
    _check_readable(flag, args.inputs or args.inputs_jsonl)
    if args.embed and (args.prompt is not None or args.batch):
        raise UsageError("--embed", "each input is the text to embed: no --prompt or --batch")


def _map_outcomes(
    args: argparse.Namespace, options: dict[str, Any] | None, bar: ProgressBar
) -> list[Outcome]:
    """The run `args` describe (or the earlier run `--collect` names), its outcomes in input
    order; raises as the client's `map` does."""
    from consumer.client import Client, RunOptions, read_inputs

    settings = load_settings(args)
    if args.config:
        settings = settings.model_copy(update={"config": args.config})
    with Client(settings) as client:
        if args.collect:
            return client.collect(
                args.collect, args.total, since=args.since, timeout_s=args.timeout_s, on_progress=bar
            )
        inputs = read_inputs(args.inputs or args.inputs_jsonl, jsonl=bool(args.inputs_jsonl))
        run = RunOptions(
            lane=args.lane, tenant=args.tenant, run_id=args.run_id, on_progress=bar, timeout_s=args.timeout_s
        )
        if args.embed:
            # map_embed names any input that is not a string
            texts = cast(list[str], inputs)
            return client.map_embed(args.tier, texts, options=options, mode=args.mode, **run)
        return client.map(
            args.tier, inputs, prompt=args.prompt, batch=args.batch, options=options, mode=args.mode, **run
        )


def _write_outcomes(out: str | None, outcomes: list[Outcome]) -> None:
    """The outcomes as JSON lines, to the file `--out` names or to stdout."""
    from consumer.client import write_outcomes

    if out:
        with Path(out).open("wb") as fh:
            write_outcomes(outcomes, fh)
    else:
        write_outcomes(outcomes, sys.stdout.buffer)
        sys.stdout.flush()


def add_submit_command(sub: Any) -> None:
    """`submit`."""
    submit = sub.add_parser("submit", help="publish one job, or many from a JSONL file")
    submit.add_argument("--tier")
    submit.add_argument("--prompt")
    submit.add_argument("--var", action="append", metavar="NAME=VALUE", help="template variable (repeatable)")
    submit.add_argument("--batch", action="store_true", help="the job may share a prompt with others")
    submit.add_argument("--offline", action="store_true", help="mode offline (provider Batch API)")
    submit.add_argument("--id", help="job id (default: random)")
    submit.add_argument("--file", help="JSONL file, one job per line")
    submit.add_argument("--lane", help="publish to this lane's topic (the tier file's lanes)")
    submit.add_argument(
        "--tenant",
        help="the job's tenant (with --file: the promptbus-tenant header of each job, which a job's "
        "own tenant field overrides)",
    )
    submit.add_argument("--config", help="with --lane: the tier file (YAML); default PROMPTBUS_CONFIG")
    add_bootstrap(submit)
    submit.set_defaults(func=cmd_submit)


def add_results_command(sub: Any) -> None:
    """`results`."""
    results = sub.add_parser("results", help="print results (or dead letters) as JSON lines")
    results.add_argument("--follow", action="store_true", help="keep printing new records")
    results.add_argument("--dlq", action="store_true", help="read the dead-letter topic")
    results.add_argument(
        "--from-beginning", action="store_true", help="with --follow: start at the beginning"
    )
    results.add_argument(
        "--tenant", help="read this tenant's results (or dead-letter) topic, from the tier file"
    )
    results.add_argument("--config", help="with --tenant: the tier file (YAML); default PROMPTBUS_CONFIG")
    add_bootstrap(results)
    results.set_defaults(func=cmd_results)


def add_map_command(sub: Any) -> None:
    """`map`."""
    m = sub.add_parser("map", help="submit one job per input and wait: outcomes in input order")
    m.add_argument("--tier", help="the tier every job goes to")
    m.add_argument("--prompt", help="template whose one ${name} takes each input (default: input = prompt)")
    src = m.add_mutually_exclusive_group()
    src.add_argument("--inputs", metavar="FILE", help="one input per line, plain text (- for stdin)")
    src.add_argument("--inputs-jsonl", metavar="FILE", help="one JSON string or object of variables per line")
    m.add_argument("--batch", action="store_true", help="the jobs may share a prompt (batchable template)")
    m.add_argument(
        "--embed", action="store_true", help="embed jobs: each input is a text to embed (result: `embedding`)"
    )
    m.add_argument("--options", metavar="JSON", help="provider options, e.g. '{\"max_tokens\": 8}'")
    m.add_argument("--mode", default="online", help="online (default) or offline (provider Batch API)")
    m.add_argument("--lane", help="publish to this lane's topic (the tier file's lanes)")
    m.add_argument("--tenant", help="the tenant of every job of the run")
    m.add_argument("--config", help="with --lane: the tier file (YAML); default PROMPTBUS_CONFIG")
    m.add_argument("--run-id", help="run id (default: random, with the start time); job ids: RUN_ID-INDEX")
    m.add_argument("--timeout-s", type=float, help="stop waiting after S seconds (exit 3; nothing cancelled)")
    m.add_argument("--out", metavar="FILE", help="write the outcomes here instead of stdout")
    m.add_argument("--collect", metavar="RUN_ID", help="collect the outcomes of an earlier run")
    m.add_argument("--total", type=int, help="with --collect: the run's number of inputs")
    m.add_argument("--since", type=float, help="with --collect: the run's start (Unix s) for a chosen run id")
    add_bootstrap(m)
    m.set_defaults(func=cmd_map)
