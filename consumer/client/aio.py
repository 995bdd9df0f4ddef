"""`AsyncClient`: submit a run's jobs and follow its outcomes (asyncio); see `consumer.client`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import Any, Unpack

from consumer.client.jobs import (
    chat_jobs,
    check_jobs,
    check_run_id,
    embed_jobs,
    encode_jobs,
    new_run_id,
    prompt_jobs,
    run_started_at,
    with_tenant,
)
from consumer.client.outcomes import MapError, MapTimeout, Outcome, ProgressCallback, RunOptions
from consumer.client.reader import OutcomeReader
from consumer.client.tracker import RunTracker
from consumer.core.errors import ConfigError
from consumer.settings import Settings, lane_topic, load_settings, load_tier_file, tenant_settings

log = logging.getLogger(__name__)

#: `collect` without the run's start offsets reads from this long before the run's start,
#: for a service clock behind the client's
CLOCK_MARGIN_S = 60.0


class AsyncClient:
    """Submit jobs to promptbus and wait for their outcomes (asyncio). See `consumer.client`.

    `AsyncClient(settings=None, **overrides)`: the service's settings from the environment,
    or `settings`, with `overrides` (Settings field names, e.g. `kafka_bootstrap_servers`,
    `jobs_topic`, `config`) on top. `async with AsyncClient() as client:` closes it at the end.
    A `lane=` of `map` is looked up in the tier file (`config`, PROMPTBUS_CONFIG): its jobs go
    to that lane's topic.
    """

    def __init__(self, settings: Settings | None = None, **overrides: Any) -> None:
        if settings is None:
            self.settings = load_settings(**overrides)
        else:
            self.settings = settings.model_copy(update=overrides) if overrides else settings
        self._topics_ready: set[str] = set()
        #: start offsets and start time (Unix s) of the runs this client started, for `collect`
        self._starts: dict[str, tuple[dict[Any, int], float]] = {}

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Forget the runs' start offsets (each call opens and closes its own Kafka clients)."""
        self._starts.clear()

    def tenant_settings(self, tenant: str | None) -> Settings:
        """The settings of `tenant`'s runs (`consumer.settings.tenant_settings`): its results
        and dead-letter topics, its bound job topic, from the tier file (PROMPTBUS_CONFIG or
        config=); the client's own settings without a tenant or a tier file."""
        if tenant is None or self.settings.config is None:
            return self.settings
        return tenant_settings(self.settings, load_tier_file(self.settings.config), tenant)

    def lane_settings(self, lane: str | None, base: Settings | None = None) -> Settings:
        """The settings (`base`'s, else the client's) whose jobs topic is `lane`'s (the tier
        file's `lanes`); ValueError for a lane the tier file does not name, or a lane without a
        tier file. No lane: the jobs topic, or the lowest-priority lane's when the tier file's
        lanes do not read it."""
        base = base if base is not None else self.settings
        if lane is None and self.settings.config is None:
            return base
        if self.settings.config is None:
            raise ValueError(
                f"lane {lane!r}: the lanes' topics are in the tier file: set PROMPTBUS_CONFIG or config="
            )
        try:
            topic = lane_topic(load_tier_file(self.settings.config), lane, base.jobs_topic)
        except ConfigError as exc:
            raise ValueError(f"lane: {exc.reason}") from None
        return base.model_copy(update={"jobs_topic": topic})

    async def _ensure_topics(self, settings: Settings | None = None) -> None:
        settings = settings or self.settings
        if settings.jobs_topic not in self._topics_ready:
            from consumer.kafka.admin import ensure_topics

            await ensure_topics(settings)
            self._topics_ready.add(settings.jobs_topic)

    async def map(
        self,
        tier: str,
        inputs: Sequence[str | Mapping[str, str]],
        *,
        prompt: str | None = None,
        batch: bool = False,
        options: Mapping[str, Any] | None = None,
        mode: str = "online",
        **run: Unpack[RunOptions],
    ) -> list[Outcome]:
        """One job per input on `tier`; their outcomes in input order.

        `prompt`: a template whose one `${name}` each string input fills, or whose variables
        each dict input gives; without it each input is the whole prompt. `batch`: the jobs
        may share a prompt (the template must be batchable). `run`: `lane`, `tenant`, `run_id`,
        `on_progress`, `raise_on_error`, `timeout_s` (`RunOptions`). Raises ValueError for bad
        input (nothing produced), MapError with `raise_on_error` when any input failed,
        MapTimeout when `timeout_s` passes first.
        """
        return await self._run(prompt_jobs(tier, inputs, prompt, batch, options, mode), **run)

    async def map_chat(
        self,
        tier: str,
        conversations: Sequence[Sequence[Mapping[str, Any]]],
        *,
        options: Mapping[str, Any] | None = None,
        mode: str = "online",
        **run: Unpack[RunOptions],
    ) -> list[Outcome]:
        """One chat job per conversation (`[{"role": ..., "content": ...}, ...]`); as `map`."""
        return await self._run(chat_jobs(tier, conversations, options, mode), **run)

    async def map_embed(
        self,
        tier: str,
        texts: Sequence[str],
        *,
        options: Mapping[str, Any] | None = None,
        mode: str = "online",
        **run: Unpack[RunOptions],
    ) -> list[Outcome]:
        """One embed job per text (`options`: e.g. `dimensions`); as `map`. Each answered
        outcome's `result["embedding"]` is its text's vector (its `output` is None)."""
        return await self._run(embed_jobs(tier, texts, options, mode), **run)

    async def map_jobs(self, jobs: Sequence[Mapping[str, Any]], **run: Unpack[RunOptions]) -> list[Outcome]:
        """Whole job dicts (each with its own tier, prompt + variables or messages, batch,
        options, mode, deadline, metadata, tenant); job `i` gets the id `RUN_ID-i` (an `id` in
        the dict is dropped); `tenant=` is the tenant of those that name none. Outcomes in the
        jobs' order; `run` and raises as `map`."""
        return await self._run(check_jobs(jobs), **run)

    async def collect(
        self,
        run_id: str,
        total: int,
        *,
        since: float | None = None,
        timeout_s: float | None = None,
        on_progress: ProgressCallback | None = None,
        raise_on_error: bool = False,
        tenant: str | None = None,
    ) -> list[Outcome]:
        """The outcomes of run `run_id` (indexes 0..total-1), e.g. after a MapTimeout, also
        from another process: see "Where `collect` starts reading" in `consumer.client`.
        `since` (Unix seconds) is needed for a run id chosen by the caller that this client
        did not start; `tenant`: the run's, whose results topic holds its outcomes."""
        if not isinstance(total, int) or total < 1:
            raise ValueError("total: must be a positive number of inputs")
        check_run_id(run_id, total)
        started_at = time.time()
        started = time.monotonic()
        known = self._starts.get(run_id)
        start = known[0] if known else None
        at = known[1] if known else since if since is not None else run_started_at(run_id)
        if start is None and at is None:
            raise ValueError(
                f"run_id {run_id!r} carries no start time and this client did not start it: pass since="
            )
        reader = OutcomeReader(self.tenant_settings(tenant))
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
        *,
        lane: str | None = None,
        tenant: str | None = None,
        run_id: str | None = None,
        on_progress: ProgressCallback | None = None,
        raise_on_error: bool = False,
        timeout_s: float | None = None,
    ) -> list[Outcome]:
        from consumer.kafka.clients import submit_jobs

        if tenant is not None:
            with_tenant(jobs, tenant)
        # a tenant's jobs go to its bound topic (unless a lane is named), its outcomes are read
        # from its own results and dead-letter topics
        scoped = self.tenant_settings(tenant)
        submit_to = self.lane_settings(lane, scoped)
        started_at = time.time()
        started = time.monotonic()
        run_id = run_id if run_id is not None else new_run_id(started_at, secrets.token_hex(4))
        values = encode_jobs(run_id, jobs, self.settings.max_job_bytes)
        keys = iter([f"{run_id}-{i}".encode() for i in range(len(values))])
        tracker = RunTracker(run_id, len(values))
        # the same as `promptbus submit`: the jobs topic exists before jobs are produced
        await self._ensure_topics(submit_to)
        reader = OutcomeReader(scoped)
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
                await submit_jobs(submit_to, values, key_of=lambda _value: next(keys))
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
