"""The producer-side client: submit many jobs, wait for their outcomes, get them in input order.

```python
from consumer.client import Client

with Client() as client:                  # the service's settings (PROMPTBUS_*, KAFKA_BOOTSTRAP_SERVERS)
    outcomes = client.map("small", ["Great!", "Awful."],
                          prompt="Classify the sentiment.\\nTEXT:\\n${text}", batch=True)
for o in outcomes:                        # one per input, in input order
    print(o.index, o.output if o.ok else o.error.kind)
```

`Client` blocks; `AsyncClient` has the same methods as coroutines. Both read the same settings
as the service (`consumer.settings.load_settings`: topics, bootstrap servers, Kafka security);
keyword arguments override them (`Client(results_topic="x")`).

A run
-----
A call submits one job per input with the id `RUN_ID-INDEX` (a random run id unless one is
given) and reads the results and dead-letter topics until every index has an outcome:

1. Before the first job is produced, the end offsets of every partition of both topics are
   read. Reading starts there: nothing older is read, so the cost does not grow with the
   topics' history.
2. Only records whose key (the job id) is `RUN_ID-` followed by an index of this run count;
   other runs' records are skipped without being parsed.
3. The first outcome of an index wins; a second one (at_least_once redelivers after a crash)
   is dropped, so each index has exactly one outcome.

Bad input raises `ValueError` naming the index and the reason before anything is produced.
`timeout_s` counts from the call; every job is produced even when it passes first (so the
run can always be collected whole). When it passes, `MapTimeout` carries the run id and the
outcomes so far; nothing is cancelled: the service still answers every job.

Where `collect` starts reading
------------------------------
`collect(run_id, total)` returns a run's full list later. The client that started the run
remembers its start offsets and reads from them. Any other client (a new process) finds them
by time: a run id the client generates starts with its start time in UTC to the millisecond
(`20261201T081330123Z-9f3a1c2e`), and `collect` reads every partition from the first record
stamped at or after that time less `CLOCK_MARGIN_S` (Kafka's `offsets_for_times`). Every
outcome of the run is stamped later than its job was produced, so none is missed while the
service's clock is less than `CLOCK_MARGIN_S` behind the client's. A run id chosen by the
caller carries no time: give `collect` the run's start as `since` (Unix seconds;
`MapTimeout.started_at` holds it).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import secrets
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TextIO, TypeVar

import orjson
from pydantic import ValidationError

from consumer.core.errors import JobError
from consumer.core.jobs import Job, Message, validation_message
from consumer.core.templates import placeholders, render, split_batchable
from consumer.settings import Settings, load_settings

__all__ = [
    "CLOCK_MARGIN_S",
    "AsyncClient",
    "Client",
    "MapError",
    "MapTimeout",
    "Outcome",
    "OutcomeError",
    "Progress",
    "ProgressBar",
    "RunTracker",
    "chat_jobs",
    "check_jobs",
    "failure_counts",
    "new_run_id",
    "prompt_jobs",
    "read_inputs",
    "run_started_at",
    "write_outcomes",
]

log = logging.getLogger(__name__)

#: `collect` without the run's start offsets reads from this long before the run's start,
#: for a service clock behind the client's
CLOCK_MARGIN_S = 60.0
#: how long one fetch waits for records before the deadline is checked again
FETCH_WAIT_S = 0.5
#: the variable that carries each input when `map` gets no template
INPUT_VARIABLE = "input"
#: job ids are at most this long (the Job model's limit)
MAX_ID_CHARS = 256
MODES = ("online", "offline")

_RUN_TIME = re.compile(r"^(\d{8}T\d{6})(\d{3})Z-")

ProgressCallback = Callable[["Progress"], Any]


# ---------------------------------------------------------------------------- values
@dataclass(frozen=True, slots=True)
class OutcomeError:
    """Why an input failed, from its dead letter's `error`."""

    #: the closed list of error kinds (`invalid_job`, `retries_exhausted`, `output_invalid`, ...)
    kind: str
    #: what went wrong, in words (never the input's text)
    message: str
    #: whether the service considered the failure transient
    retryable: bool = False
    #: the provider's HTTP status, when a provider answered
    status_code: int | None = None
    #: the provider, when one was involved
    provider: str | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """The fate of one input: an answer, a failure, or (after a timeout) not in yet."""

    #: the input's position in the list given to `map`
    index: int
    #: its job id, `RUN_ID-INDEX`
    id: str
    #: True when the job has a result
    ok: bool
    #: the answer text, when ok
    output: str | None = None
    #: the Result record (a dict, as published), when ok
    result: dict[str, Any] | None = None
    #: the dead letter's error, when failed
    error: OutcomeError | None = None
    #: True only for an outcome not in yet when a timeout ended the wait
    pending: bool = False

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (what `promptbus map` prints per input)."""
        out: dict[str, Any] = {"index": self.index, "id": self.id, "ok": self.ok}
        if self.pending:
            out["pending"] = True
        if self.ok:
            out["output"] = self.output
            out["result"] = self.result
        elif self.error is not None:
            out["error"] = {
                "kind": self.error.kind,
                "message": self.error.message,
                "retryable": self.error.retryable,
                "status_code": self.error.status_code,
                "provider": self.error.provider,
            }
        return out


@dataclass(frozen=True, slots=True)
class Progress:
    """Where a run stands: `done` outcomes in (ok or failed) of `total`, `failed` of them."""

    done: int
    failed: int
    total: int
    elapsed_s: float

    @property
    def rate_per_s(self) -> float:
        """Outcomes per second so far."""
        return self.done / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the rate so far (None before the first outcome)."""
        rate = self.rate_per_s
        return (self.total - self.done) / rate if rate > 0 else None


def failure_counts(outcomes: Sequence[Outcome]) -> dict[str, int]:
    """Failed outcomes per error kind, most common first."""
    counts = Counter(o.error.kind for o in outcomes if o.error is not None)
    return dict(counts.most_common())


class MapError(Exception):
    """`raise_on_error=True` and some inputs failed; `outcomes` holds every outcome."""

    def __init__(self, run_id: str, outcomes: list[Outcome]) -> None:
        self.run_id = run_id
        self.outcomes = outcomes
        kinds = ", ".join(f"{k}={n}" for k, n in failure_counts(outcomes).items())
        failed = sum(1 for o in outcomes if o.error is not None)
        super().__init__(f"run {run_id}: {failed} of {len(outcomes)} inputs failed ({kinds})")


class MapTimeout(TimeoutError):
    """The wait ended before every outcome was in. Nothing was cancelled: the service still
    answers every job, and `collect(run_id, total)` returns the full list later.

    `outcomes` has one entry per input, `pending` for those not in yet; `started_at` is the
    run's start (Unix seconds), the `since` a new process needs for a run id chosen by the
    caller.
    """

    def __init__(self, run_id: str, outcomes: list[Outcome], *, timeout_s: float, started_at: float) -> None:
        self.run_id = run_id
        self.outcomes = outcomes
        self.total = len(outcomes)
        self.timeout_s = timeout_s
        self.started_at = started_at
        done = sum(1 for o in outcomes if not o.pending)
        super().__init__(
            f"run {run_id}: {done} of {self.total} outcomes in after {timeout_s:g} s "
            f"(nothing was cancelled; collect({run_id!r}, {self.total}) gets the rest)"
        )


# ---------------------------------------------------------------------------- run ids
def new_run_id(now_s: float, token: str) -> str:
    """A run id carrying its start time: `YYYYMMDDTHHMMSSmmmZ-TOKEN` (UTC, milliseconds)."""
    at = datetime.fromtimestamp(now_s, UTC)
    return f"{at:%Y%m%dT%H%M%S}{at.microsecond // 1000:03d}Z-{token}"


def run_started_at(run_id: str) -> float | None:
    """The start time (Unix seconds) a generated run id carries; None for other run ids."""
    m = _RUN_TIME.match(run_id)
    if m is None:
        return None
    try:
        at = datetime.strptime(m.group(1), "%Y%m%dT%H%M%S").replace(tzinfo=UTC)
    except ValueError:
        return None
    return at.timestamp() + int(m.group(2)) / 1000


def _check_run_id(run_id: str, total: int) -> None:
    if not isinstance(run_id, str) or not run_id:
        raise ValueError("run_id: must be a non-empty string")
    longest = len(run_id) + 1 + len(str(total - 1))
    if longest > MAX_ID_CHARS:
        raise ValueError(f"run_id: job ids RUN_ID-INDEX would be {longest} characters, over {MAX_ID_CHARS}")


# ---------------------------------------------------------------------------- building jobs
def _check_common(tier: str, mode: str, count: int, what: str) -> None:
    if not isinstance(tier, str) or not tier:
        raise ValueError("tier: must be a non-empty string")
    if mode not in MODES:
        raise ValueError(f"mode: unknown mode {mode!r} (known: {', '.join(MODES)})")
    if count == 0:
        raise ValueError(f"{what}: empty list, nothing to map")


def _probe_options(tier: str, options: Mapping[str, Any] | None, mode: str) -> dict[str, Any]:
    """The options every job of a call shares, checked once as the service checks them."""
    opts = dict(options or {})
    try:
        Job.model_validate({"id": "probe", "tier": tier, "prompt": "", "options": opts, "mode": mode})
    except ValidationError as exc:
        raise ValueError(validation_message(exc)) from None
    return opts


def _not_batchable(prompt: str) -> ValueError:
    # the core's rule (consumer.core.templates.split_batchable), worded for the caller
    count = len(placeholders(prompt))
    where = ", not at its very end" if count == 1 else ""
    return ValueError(
        "batch=True: the prompt is not batchable: it needs exactly one ${name} with nothing after it "
        f"(it has {count} placeholder{'s' if count != 1 else ''}{where})"
    )


def prompt_jobs(
    tier: str, inputs: Sequence[str | Mapping[str, str]], prompt: str | None, batch: bool,
    options: Mapping[str, Any] | None, mode: str,
) -> list[dict[str, Any]]:
    """One job dict (without id) per input; ValueError naming the index and the reason.

    With `prompt`, a string input fills the template's one `${name}`, a dict input gives its
    variables. Without it, each input (a string) is the whole prompt, sent as the value of a
    one-placeholder template so text such as `${x}` in it is never read as a placeholder.
    """
    if isinstance(inputs, str | bytes) or not isinstance(inputs, Sequence):
        raise ValueError("inputs: must be a list of strings or dicts")
    _check_common(tier, mode, len(inputs), "inputs")
    opts = _probe_options(tier, options, mode)
    template = prompt if prompt is not None else "${" + INPUT_VARIABLE + "}"
    if not isinstance(template, str):
        raise ValueError("prompt: must be a string")
    if batch and split_batchable(template) is None:
        raise _not_batchable(template)
    names = sorted(set(placeholders(template)))
    base: dict[str, Any] = {"tier": tier, "prompt": template}
    if batch:
        base["batch"] = True
    if opts:
        base["options"] = opts
    if mode != "online":
        base["mode"] = mode
    jobs: list[dict[str, Any]] = []
    for i, item in enumerate(inputs):
        if isinstance(item, str):
            if len(names) != 1:
                where = "the input is the whole prompt" if prompt is None else f"the prompt has {len(names)}"
                raise ValueError(
                    f"input {i}: a string fills a template's one ${{name}}; {where} "
                    f"({', '.join(names) or 'none'}): give dicts of variables"
                )
            variables = {names[0]: item}
        elif isinstance(item, Mapping):
            if prompt is None:
                raise ValueError(f"input {i}: a dict of variables needs prompt= (a template to fill)")
            variables = dict(item)
            for name, value in variables.items():
                if not isinstance(value, str):
                    raise ValueError(f"input {i}: variable {name!r} is {type(value).__name__}, not a string")
            try:
                render(template, variables)
            except JobError as exc:
                raise ValueError(f"input {i}: {exc}") from None
        else:
            raise ValueError(
                f"input {i}: expected a string or a dict of variables, got {type(item).__name__}"
            )
        jobs.append({**base, "variables": variables})
    return jobs


def chat_jobs(
    tier: str, conversations: Sequence[Sequence[Mapping[str, Any]]],
    options: Mapping[str, Any] | None, mode: str,
) -> list[dict[str, Any]]:
    """One chat job dict (without id) per conversation; ValueError naming the index and the reason."""
    if isinstance(conversations, str | bytes) or not isinstance(conversations, Sequence):
        raise ValueError("conversations: must be a list of message lists")
    _check_common(tier, mode, len(conversations), "conversations")
    opts = _probe_options(tier, options, mode)
    jobs: list[dict[str, Any]] = []
    for i, conv in enumerate(conversations):
        if isinstance(conv, str | bytes | Mapping) or not isinstance(conv, Sequence) or not conv:
            raise ValueError(f"conversation {i}: expected a non-empty list of {{role, content}} messages")
        messages = []
        for n, msg in enumerate(conv):
            try:
                messages.append(Message.model_validate(msg).model_dump())
            except ValidationError as exc:
                raise ValueError(
                    f"conversation {i}, message {n}: {validation_message(exc, what='message')}"
                ) from None
        job: dict[str, Any] = {"tier": tier, "messages": messages}
        if opts:
            job["options"] = opts
        if mode != "online":
            job["mode"] = mode
        jobs.append(job)
    return jobs


def check_jobs(jobs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Whole job dicts (tier, prompt/messages, variables, batch, options, mode, deadline,
    metadata) checked as the service reads them; an `id` in them is dropped (the run gives
    ids). ValueError naming the index and the reason."""
    if isinstance(jobs, str | bytes) or not isinstance(jobs, Sequence):
        raise ValueError("jobs: must be a list of job dicts")
    if not jobs:
        raise ValueError("jobs: empty list, nothing to map")
    checked: list[dict[str, Any]] = []
    for i, raw in enumerate(jobs):
        if not isinstance(raw, Mapping):
            raise ValueError(f"job {i}: expected a dict, got {type(raw).__name__}")
        job = {k: v for k, v in raw.items() if k != "id"}
        try:
            parsed = Job.model_validate({"id": "probe", **job})
        except ValidationError as exc:
            raise ValueError(f"job {i}: {validation_message(exc)}") from None
        if parsed.prompt is not None:
            try:
                render(parsed.prompt, parsed.variables or {})
            except JobError as exc:
                raise ValueError(f"job {i}: {exc}") from None
            if parsed.batch and split_batchable(parsed.prompt) is None:
                raise ValueError(f"job {i}: {_not_batchable(parsed.prompt)}")
        elif parsed.batch:
            raise ValueError(f"job {i}: batch=True: a chat job (messages) cannot share a prompt")
        checked.append(job)
    return checked


def _encode_jobs(run_id: str, jobs: Sequence[dict[str, Any]], max_bytes: int) -> list[bytes]:
    """Each job with its id `RUN_ID-INDEX`, as the record value; ValueError for one too large."""
    _check_run_id(run_id, len(jobs))
    values = []
    for i, job in enumerate(jobs):
        value = orjson.dumps({"id": f"{run_id}-{i}", **job})
        if len(value) > max_bytes:
            raise ValueError(
                f"input {i}: the job is {len(value)} bytes, over the {max_bytes} the service reads"
            )
        values.append(value)
    return values


# ---------------------------------------------------------------------------- outcomes (pure)
class RunTracker:
    """The outcomes of one run as records arrive: one per index, the first one wins.

    Pure bookkeeping (no I/O): `add_result` / `add_dead_letter` take a record's key and value
    and say whether it was a new outcome of this run.
    """

    def __init__(self, run_id: str, total: int) -> None:
        self.run_id = run_id
        self.total = total
        self._prefix = run_id + "-"
        self._bprefix = self._prefix.encode()
        self._slots: list[Outcome | None] = [None] * total
        self.done = 0
        self.failed = 0
        #: records of this run seen again (redeliveries), and records that could not be read
        self.duplicates = 0
        self.unreadable = 0

    @property
    def complete(self) -> bool:
        """Every index has its outcome."""
        return self.done == self.total

    def _index_of(self, jid: str | bytes) -> int | None:
        """The index a job id names in this run, or None (another run, a longer run id that
        shares the prefix, an index out of range or not written as `str(index)`)."""
        tail = jid[len(self._prefix) :]
        if not (tail.isascii() and tail.isdigit()) or (len(tail) > 1 and tail[:1] in ("0", b"0")):
            return None
        index = int(tail)
        return index if index < self.total else None

    def _index(self, key: bytes | None, value: bytes) -> tuple[int, dict[str, Any]] | None:
        if key is not None:
            # the key is the job id: another run's record, or a redelivery, is never parsed
            if not key.startswith(self._bprefix):
                return None
            index = self._index_of(key)
            if index is None:
                return None
            if self._slots[index] is not None:
                self.duplicates += 1
                return None
            record = self._record(value)
            if record is None or record.get("id") != key.decode():
                self.unreadable += 1
                return None
            return index, record
        # no key (an id the service could not put in the key): the id in the value decides
        record = self._record(value)
        jid = record.get("id") if record is not None else None
        if not isinstance(jid, str) or not jid.startswith(self._prefix):
            return None
        index = self._index_of(jid)
        if index is None or record is None:
            return None
        if self._slots[index] is not None:
            self.duplicates += 1
            return None
        return index, record

    @staticmethod
    def _record(value: bytes) -> dict[str, Any] | None:
        try:
            record = orjson.loads(value)
        except orjson.JSONDecodeError:
            return None
        return record if isinstance(record, dict) else None

    def add_result(self, key: bytes | None, value: bytes | None) -> bool:
        """A results-topic record; True when it is this run's first outcome of its index."""
        found = self._index(key, value) if value is not None else None
        if found is None:
            return False
        index, record = found
        output = record.get("output")
        if not isinstance(output, str):
            self.unreadable += 1
            return False
        self._slots[index] = Outcome(index, record["id"], True, output=output, result=record)
        self.done += 1
        return True

    def add_dead_letter(self, key: bytes | None, value: bytes | None) -> bool:
        """A dead-letter-topic record; True when it is this run's first outcome of its index."""
        found = self._index(key, value) if value is not None else None
        if found is None:
            return False
        index, record = found
        err = record.get("error")
        if not isinstance(err, dict) or not isinstance(err.get("kind"), str):
            self.unreadable += 1
            return False
        status = err.get("status_code")
        provider = err.get("provider")
        error = OutcomeError(
            kind=err["kind"],
            message=str(err.get("message", "")),
            retryable=bool(err.get("retryable", False)),
            status_code=status if isinstance(status, int) else None,
            provider=provider if isinstance(provider, str) else None,
        )
        self._slots[index] = Outcome(index, record["id"], False, error=error)
        self.done += 1
        self.failed += 1
        return True

    def progress(self, elapsed_s: float) -> Progress:
        """The counts now."""
        return Progress(self.done, self.failed, self.total, elapsed_s)

    def outcomes(self) -> list[Outcome]:
        """One outcome per index, in index order; `pending` where none is in yet."""
        return [
            o if o is not None else Outcome(i, f"{self._prefix}{i}", False, pending=True)
            for i, o in enumerate(self._slots)
        ]


# ---------------------------------------------------------------------------- Kafka edge
class _OutcomeReader:
    """One consumer assigned every partition of the results and dead-letter topics (no group)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._consumer: Any = None
        self.partitions: list[Any] = []

    async def open(self, ensure_topics: Callable[[], Awaitable[None]]) -> None:
        """Start the consumer and assign both topics' partitions, creating the topics first
        (`ensure_topics`) when either is missing."""
        from aiokafka import AIOKafkaConsumer

        from consumer.kafka.clients import topic_partitions
        from consumer.kafka.connection import MAX_MESSAGE_BYTES, client_kwargs
        from consumer.kafka.records import TopicPartition

        s = self.settings
        topics = (s.results_topic, s.dlq_topic)
        self._consumer = AIOKafkaConsumer(
            isolation_level="read_committed",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=MAX_MESSAGE_BYTES,
            **client_kwargs(s),
        )
        # the consumer's bootstrap and the partition lookups overlap: a new process's collect
        # pays one round trip for them, not three
        _, *found = await asyncio.gather(self._consumer.start(), *(topic_partitions(s, t) for t in topics))
        if not all(found):
            await ensure_topics()
            found = list(await asyncio.gather(*(topic_partitions(s, t) for t in topics)))
        pairs = zip(topics, found, strict=True)
        self.partitions = [TopicPartition(topic, p) for topic, parts in pairs for p in parts]
        self._consumer.assign(self.partitions)

    async def close(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None

    async def end_offsets(self) -> dict[Any, int]:
        """Where every partition ends now."""
        ends: dict[Any, int] = await self._consumer.end_offsets(self.partitions)
        return ends

    async def offsets_at(self, at_ms: int) -> dict[Any, int]:
        """The first offset stamped at or after `at_ms` per partition (the end where none is)."""
        found = await self._consumer.offsets_for_times({tp: at_ms for tp in self.partitions})
        ends = await self.end_offsets()
        return {tp: (found[tp].offset if found.get(tp) is not None else ends[tp]) for tp in self.partitions}

    async def follow(
        self,
        tracker: RunTracker,
        start: Mapping[Any, int],
        *,
        started: float,
        deadline: float | None,
        on_progress: ProgressCallback | None,
    ) -> None:
        """Read from `start` until the run is complete or `deadline` (monotonic) passes."""
        consumer = self._consumer
        for tp in self.partitions:
            consumer.seek(tp, start.get(tp, 0))
        results_topic = self.settings.results_topic
        while not tracker.complete:
            wait_s = FETCH_WAIT_S
            if deadline is not None:
                wait_s = min(wait_s, deadline - time.monotonic())
                if wait_s <= 0:
                    return
            batches = await consumer.getmany(timeout_ms=max(1, int(wait_s * 1000)))
            new = 0
            for tp, records in batches.items():
                add = tracker.add_result if tp.topic == results_topic else tracker.add_dead_letter
                for r in records:
                    new += add(r.key, r.value)
            if new and on_progress is not None:
                on_progress(tracker.progress(time.monotonic() - started))


class AsyncClient:
    """Submit jobs to promptbus and wait for their outcomes (asyncio). See the module docstring.

    `AsyncClient(settings=None, **overrides)`: the service's settings from the environment,
    or `settings`, with `overrides` (Settings field names, e.g. `kafka_bootstrap_servers`,
    `jobs_topic`) on top. `async with AsyncClient() as client:` closes it at the end.
    """

    def __init__(self, settings: Settings | None = None, **overrides: Any) -> None:
        if settings is None:
            self.settings = load_settings(**overrides)
        else:
            self.settings = settings.model_copy(update=overrides) if overrides else settings
        self._topics_ready = False
        #: start offsets and start time (Unix s) of the runs this client started, for `collect`
        self._starts: dict[str, tuple[dict[Any, int], float]] = {}

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Forget the runs' start offsets (each call opens and closes its own Kafka clients)."""
        self._starts.clear()

    async def _ensure_topics(self) -> None:
        if not self._topics_ready:
            from consumer.kafka.admin import ensure_topics

            await ensure_topics(self.settings)
            self._topics_ready = True

    async def map(
        self,
        tier: str,
        inputs: Sequence[str | Mapping[str, str]],
        *,
        prompt: str | None = None,
        batch: bool = False,
        options: Mapping[str, Any] | None = None,
        mode: str = "online",
        run_id: str | None = None,
        on_progress: ProgressCallback | None = None,
        raise_on_error: bool = False,
        timeout_s: float | None = None,
    ) -> list[Outcome]:
        """One job per input on `tier`; their outcomes in input order.

        `prompt`: a template whose one `${name}` each string input fills, or whose variables
        each dict input gives; without it each input is the whole prompt. `batch`: the jobs
        may share a prompt (the template must be batchable). Raises ValueError for bad input
        (nothing produced), MapError with `raise_on_error` when any input failed, MapTimeout
        when `timeout_s` passes first.
        """
        jobs = prompt_jobs(tier, inputs, prompt, batch, options, mode)
        return await self._run(jobs, run_id, on_progress, raise_on_error, timeout_s)

    async def map_chat(
        self,
        tier: str,
        conversations: Sequence[Sequence[Mapping[str, Any]]],
        *,
        options: Mapping[str, Any] | None = None,
        mode: str = "online",
        run_id: str | None = None,
        on_progress: ProgressCallback | None = None,
        raise_on_error: bool = False,
        timeout_s: float | None = None,
    ) -> list[Outcome]:
        """One chat job per conversation (`[{"role": ..., "content": ...}, ...]`); as `map`."""
        jobs = chat_jobs(tier, conversations, options, mode)
        return await self._run(jobs, run_id, on_progress, raise_on_error, timeout_s)

    async def map_jobs(
        self,
        jobs: Sequence[Mapping[str, Any]],
        *,
        run_id: str | None = None,
        on_progress: ProgressCallback | None = None,
        raise_on_error: bool = False,
        timeout_s: float | None = None,
    ) -> list[Outcome]:
        """Whole job dicts (each with its own tier, prompt + variables or messages, batch,
        options, mode, deadline, metadata); job `i` gets the id `RUN_ID-i` (an `id` in the
        dict is dropped). Outcomes in the jobs' order; raises as `map`."""
        return await self._run(check_jobs(jobs), run_id, on_progress, raise_on_error, timeout_s)

    async def collect(
        self,
        run_id: str,
        total: int,
        *,
        since: float | None = None,
        timeout_s: float | None = None,
        on_progress: ProgressCallback | None = None,
        raise_on_error: bool = False,
    ) -> list[Outcome]:
        """The outcomes of run `run_id` (indexes 0..total-1), e.g. after a MapTimeout, also
        from another process: see "Where `collect` starts reading" in the module docstring.
        `since` (Unix seconds) is needed for a run id chosen by the caller that this client
        did not start."""
        if not isinstance(total, int) or total < 1:
            raise ValueError("total: must be a positive number of inputs")
        _check_run_id(run_id, total)
        started_at = time.time()
        started = time.monotonic()
        known = self._starts.get(run_id)
        start = known[0] if known else None
        at = known[1] if known else since if since is not None else run_started_at(run_id)
        if start is None and at is None:
            raise ValueError(
                f"run_id {run_id!r} carries no start time and this client did not start it: pass since="
            )
        reader = _OutcomeReader(self.settings)
        try:
            await reader.open(self._ensure_topics)
            if start is None:
                assert at is not None
                start = await reader.offsets_at(int((at - CLOCK_MARGIN_S) * 1000))
            tracker = RunTracker(run_id, total)
            deadline = None if timeout_s is None else started + timeout_s
            await reader.follow(tracker, start, started=started, deadline=deadline, on_progress=on_progress)
        finally:
            await reader.close()
        return self._finish(tracker, started, on_progress, raise_on_error, timeout_s, at or started_at)

    async def _run(
        self,
        jobs: list[dict[str, Any]],
        run_id: str | None,
        on_progress: ProgressCallback | None,
        raise_on_error: bool,
        timeout_s: float | None,
    ) -> list[Outcome]:
        from consumer.kafka.clients import submit_jobs

        started_at = time.time()
        started = time.monotonic()
        run_id = run_id if run_id is not None else new_run_id(started_at, secrets.token_hex(4))
        values = _encode_jobs(run_id, jobs, self.settings.max_job_bytes)
        keys = iter([f"{run_id}-{i}".encode() for i in range(len(values))])
        tracker = RunTracker(run_id, len(values))
        # the same as `promptbus submit`: the jobs topic exists before jobs are produced
        await self._ensure_topics()
        reader = _OutcomeReader(self.settings)
        try:
            await reader.open(self._ensure_topics)
            # Step 1: where the output topics end before the first job exists
            start = await reader.end_offsets()
            self._starts[run_id] = (start, started_at)
            # Step 2: read while producing (a large run's first outcomes come back early);
            # production always finishes, so a run that times out can be collected whole
            deadline = None if timeout_s is None else started + timeout_s
            follow = asyncio.create_task(
                reader.follow(tracker, start, started=started, deadline=deadline, on_progress=on_progress)
            )
            try:
                # submit_jobs asks for each value's key once, in order
                await submit_jobs(self.settings, values, key_of=lambda _value: next(keys))
                await follow
            finally:
                if not follow.done():
                    follow.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await follow
        finally:
            await reader.close()
        log.debug("run %s: %d outcomes, %d duplicates skipped", run_id, tracker.done, tracker.duplicates)
        return self._finish(tracker, started, on_progress, raise_on_error, timeout_s, started_at)

    @staticmethod
    def _finish(
        tracker: RunTracker,
        started: float,
        on_progress: ProgressCallback | None,
        raise_on_error: bool,
        timeout_s: float | None,
        started_at: float,
    ) -> list[Outcome]:
        if on_progress is not None:
            on_progress(tracker.progress(time.monotonic() - started))
        outcomes = tracker.outcomes()
        if not tracker.complete:
            raise MapTimeout(tracker.run_id, outcomes, timeout_s=timeout_s or 0.0, started_at=started_at)
        if raise_on_error and tracker.failed:
            raise MapError(tracker.run_id, outcomes)
        return outcomes


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _blocking(
    method: Callable[Concatenate[AsyncClient, _P], Awaitable[_R]],
) -> Callable[Concatenate[Client, _P], _R]:
    """The blocking twin of an `AsyncClient` method: the same parameters and result."""

    @functools.wraps(method)
    def run(self: Client, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        result: _R = self._call(method(self._client, *args, **kwargs))
        return result

    return run


class Client:
    """The blocking client: `AsyncClient`'s methods, each run to completion in this thread.

    `with Client() as client: client.map(...)`. It runs its own event loop, so it cannot be
    used inside a running one (use `AsyncClient` there).
    """

    def __init__(self, settings: Settings | None = None, **overrides: Any) -> None:
        self._client = AsyncClient(settings, **overrides)
        self._runner: asyncio.Runner | None = None

    @property
    def settings(self) -> Settings:
        """The settings in use."""
        return self._client.settings

    def _call(self, coro: Any) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            coro.close()
            raise RuntimeError("Client blocks; inside a running event loop use AsyncClient")
        if self._runner is None:
            self._runner = asyncio.Runner()
        return self._runner.run(coro)

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the client and its event loop."""
        if self._runner is not None:
            self._runner.run(self._client.close())
            self._runner.close()
            self._runner = None

    map = _blocking(AsyncClient.map)
    map_chat = _blocking(AsyncClient.map_chat)
    map_jobs = _blocking(AsyncClient.map_jobs)
    collect = _blocking(AsyncClient.collect)


# ---------------------------------------------------------------------------- the shell's side
def read_inputs(path: str, *, jsonl: bool) -> list[str | dict[str, str]]:
    """Inputs from a file (`-`: stdin). Plain: one input per line, every line (the newline
    removed). JSONL: one JSON value per non-blank line, a string or an object of variables.
    ValueError naming the line."""
    if path == "-":
        lines = sys.stdin.read().splitlines()
    else:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    if not jsonl:
        return list(lines)
    inputs: list[str | dict[str, str]] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"{path}:{n}: not JSON: {exc}") from None
        if not isinstance(value, str | dict):
            raise ValueError(f"{path}:{n}: expected a JSON string or object, got {type(value).__name__}")
        inputs.append(value)
    return inputs


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(seconds + 0.5)
    if seconds < 60:
        return f"{seconds}s"
    minutes, s = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{s:02d}s"
    hours, m = divmod(minutes, 60)
    return f"{hours}h{m:02d}m"


class ProgressBar:
    """An `on_progress` callback that draws done/total, failed, rate and ETA on a stream.

    On a terminal, one line redrawn at most every `redraw_s`; elsewhere (a log, a pipe) a
    plain line every `every_s`. The call that ends the run (done == total, or the final one
    after a timeout) always prints; `close()` ends a terminal line.
    """

    WIDTH = 24

    def __init__(
        self,
        stream: TextIO,
        *,
        tty: bool | None = None,
        every_s: float = 5.0,
        redraw_s: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self.every_s = every_s if not self.tty else redraw_s
        self.clock = clock
        self._last: float | None = None
        self._drawn = False
        self._unshown: Progress | None = None

    @staticmethod
    def line(p: Progress) -> str:
        """The progress text: `512/1000 done, 3 failed, 420/s, ETA 1s`."""
        return f"{p.done}/{p.total} done, {p.failed} failed, {p.rate_per_s:.0f}/s, ETA {_duration(p.eta_s)}"

    def __call__(self, p: Progress) -> None:
        now = self.clock()
        final = p.done >= p.total
        if not final and self._last is not None and now - self._last < self.every_s:
            self._unshown = p
            return
        self._last = now
        self._unshown = None
        if self.tty:
            filled = self.WIDTH * p.done // max(p.total, 1)
            bar = "#" * filled + "-" * (self.WIDTH - filled)
            self.stream.write(f"\r[{bar}] {self.line(p)}\x1b[K")
            self._drawn = True
        else:
            self.stream.write(f"map: {self.line(p)}\n")
        self.stream.flush()

    def close(self) -> None:
        """Show the latest progress if it was held back, and end the terminal line."""
        if self._unshown is not None:
            p, self._unshown, self._last = self._unshown, None, None
            self(p)
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False


def _iter_lines(outcomes: Sequence[Outcome]) -> Iterator[bytes]:
    for o in outcomes:
        yield orjson.dumps(o.to_dict()) + b"\n"


def write_outcomes(outcomes: Sequence[Outcome], out: Any) -> None:
    """One JSON line per outcome, in input order, to a binary stream."""
    for chunk in _iter_lines(outcomes):
        out.write(chunk)
