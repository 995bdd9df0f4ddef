"""Fault storm, poison input, deadlines and quota: every job ends exactly once, with the right kind."""

from __future__ import annotations

import asyncio
import base64
import sys
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
from opentelemetry.trace import NoOpTracer, NoOpTracerProvider

from consumer.core.completion import Completion, CompletionRequest
from consumer.providers.fake import FakeProvider, text_completion
from consumer.testing.harness import (
    InProcessService,
    job,
    produce,
    service_env,
    settings_from_env,
    tier_file_dict,
    wait_for_outcomes,
)
from consumer.testing.simulator import SimulatorConfig, SimulatorServer, answer_for, extract_input

STORM = SimulatorConfig(
    seed=7,
    latency_ms=3,
    error_rate=0.05,
    overload_rate=0.03,
    rpm=40,
    tpm=3000,
    # the limiter paces by the announced request and token budgets, so these may end without
    # a 429; a key shared with another client keeps 429s + Retry-After in the storm
    shared_429_rate=0.03,
    rate_window_s=1.0,
    hang_rate=0.01,
    hang_s=30,
    drop_rate=0.02,
    malformed_rate=0.1,
    truncated_rate=0.1,
    missing_rate=0.1,
    extra_rate=0.1,
)


async def test_fault_storm_every_job_ends_exactly_once_with_its_own_answer(
    make_bus: Callable[..., Any],
) -> None:
    bus = make_bus(partitions=4)
    tiers = tier_file_dict(
        "",
        max_items=8,
        timeout_s=1.0,
        retry={"max_attempts": 8, "backoff_initial_s": 0.05, "backoff_max_s": 0.5},
    )
    async with SimulatorServer(STORM) as base_url:
        tiers["tiers"]["small"]["base_url"] = base_url + "/v1"
        service = bus.service(tiers)
        async with service:
            jobs = [job(i, batch=(i % 4 != 0)) for i in range(300)]
            await bus.produce(jobs)
            outcomes = await bus.wait_for_outcomes({j["id"] for j in jobs}, timeout_s=180)
        stats = service.stats_snapshot()

    ids = {j["id"] for j in jobs}
    assert outcomes.ids() == ids
    assert outcomes.duplicates() == {}
    for j in jobs:
        if j["id"] in outcomes.results:
            assert outcomes.results[j["id"]][0]["output"] == answer_for(j["variables"]["text"]), j["id"]
        else:
            (dead,) = outcomes.dead[j["id"]]
            # only transient faults were injected: a job can only fail by running out of attempts
            assert dead["error"]["kind"] == "retries_exhausted", dead
            assert dead["job"]["id"] == j["id"]
    tier = stats["tiers"]["small"]
    assert tier["rate_limited"] > 0, "the storm must have produced 429s"
    # what the limiter learnt of the announced budgets (40 requests and 3,000 tokens a second)
    assert 0 < tier["budget_requests_per_s"] <= 40 * 1.1
    assert tier["budget_tokens_per_s"] == pytest.approx(3000, rel=0.05)
    assert tier["splits"] + tier["reasks"] > 0, "bad batched answers must have been split or re-asked"
    assert len(outcomes.results) >= 0.9 * len(jobs)


REMOTE_REF = "http://127.0.0.1:9/label.json"


def _schema_options(schema: dict[str, Any]) -> dict[str, Any]:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}}


def _nested_schema(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


async def test_poison_input_goes_to_dead_letters_with_original_bytes(make_bus: Callable[..., Any]) -> None:
    bus = make_bus(partitions=2)
    huge = orjson.dumps(job(99, batch=False, text="x" * (2 * 1024 * 1024)))
    poison: dict[str, bytes] = {
        "not-utf8": b"\xff\xfe\xfa not utf-8",
        "not-json": b"{this is not json",
        "wrong-types": orjson.dumps({"id": "wrong-types", "tier": "small", "prompt": 42}),
        "unknown-tier": orjson.dumps({"id": "unknown-tier", "tier": "nope", "prompt": "hello"}),
        "template": orjson.dumps(
            {"id": "template", "tier": "small", "prompt": "hi ${a}", "variables": {"b": "1"}}
        ),
        "huge": huge,
        # valid, but its tier has no offline mode: rejected at intake like the rest
        "offline-not-allowed": orjson.dumps(job(98, batch=False, mode="offline")),
        # its response_format names a schema that is no JSON Schema: its outputs could not be checked
        "bad-schema": orjson.dumps(
            job(97, batch=True, options={"response_format": {"type": "json_object", "schema": {"type": 7}}})
        ),
        # a $ref out of the schema: never fetched (nothing listens on port 9 either)
        "remote-ref": orjson.dumps(job(96, batch=True, options=_schema_options({"$ref": REMOTE_REF}))),
        # nested past what can be checked without overflowing the stack
        "deep-schema": orjson.dumps(job(95, batch=True, options=_schema_options(_nested_schema(120)))),
    }
    good = [job(i, batch=True) for i in range(5)]
    async with SimulatorServer(SimulatorConfig()) as base_url:
        async with bus.service(tier_file_dict(base_url + "/v1")):
            await bus.produce(
                [
                    poison["not-utf8"],
                    poison["not-json"],
                    poison["wrong-types"],
                    poison["unknown-tier"],
                    poison["template"],
                    poison["huge"],
                    poison["offline-not-allowed"],
                    poison["bad-schema"],
                    poison["remote-ref"],
                    poison["deep-schema"],
                    *good,
                ],
            )
            outcomes = await bus.wait_for_outcomes(
                {g["id"] for g in good}, timeout_s=60, dead_expected=len(poison)
            )

    assert set(outcomes.results) == {g["id"] for g in good}, "the service must keep running after poison"
    dead = [d for ds in outcomes.dead.values() for d in ds]
    assert len(dead) == len(poison)
    by_raw = {base64.b64decode(d["raw"]): d for d in dead}
    assert set(by_raw) == set(poison.values()), "every dead letter carries the original bytes"
    kinds = {name: by_raw[raw]["error"]["kind"] for name, raw in poison.items()}
    assert kinds == {
        "not-utf8": "invalid_job",
        "not-json": "invalid_job",
        "wrong-types": "invalid_job",
        "unknown-tier": "unknown_tier",
        "template": "template_error",
        "huge": "invalid_job",
        "offline-not-allowed": "invalid_job",
        "bad-schema": "invalid_job",
        "remote-ref": "invalid_job",
        "deep-schema": "invalid_job",
    }
    assert "UTF-8" in by_raw[poison["not-utf8"]]["error"]["message"]
    assert "prompt" in by_raw[poison["wrong-types"]]["error"]["message"]
    assert "nope" in by_raw[poison["unknown-tier"]]["error"]["message"]
    assert "max_job_bytes" in by_raw[poison["huge"]]["error"]["message"]
    assert by_raw[poison["huge"]]["id"] == "job-99", "the record key names the job"
    assert by_raw[poison["not-json"]]["id"] is None
    assert "offline" in by_raw[poison["offline-not-allowed"]]["error"]["message"]
    assert by_raw[poison["offline-not-allowed"]]["job"]["id"] == "job-98"
    assert by_raw[poison["bad-schema"]]["error"]["message"].startswith(
        "options.response_format: the schema is not a valid JSON Schema"
    )
    assert REMOTE_REF in by_raw[poison["remote-ref"]]["error"]["message"]
    assert "nested too deeply" in by_raw[poison["deep-schema"]]["error"]["message"]


@pytest.mark.parametrize("key_kind", ["api_key_env", "api_key_file", "api_key_command"])
async def test_deadline_passed_and_auth_failure_dead_letter_with_their_kinds(
    make_bus: Callable[..., Any], key_kind: str, tmp_path: Path
) -> None:
    bus = make_bus(partitions=1)
    async with SimulatorServer(SimulatorConfig(api_key="right-key")) as base_url:
        # the wrong key from each source the tier file offers: a 401 that a renewed key does
        # not cure stands, and the key is in no dead letter
        key_file = tmp_path / "key"
        key_file.write_text("wrong-key\n")
        source: dict[str, Any] = {
            "api_key_env": {"api_key_env": "PB_TEST_WRONG_KEY"},
            "api_key_file": {"api_key_file": str(key_file)},
            "api_key_command": {"api_key_command": [sys.executable, "-c", "print('wrong-key')"]},
        }[key_kind]
        tiers = tier_file_dict(base_url + "/v1", **source)
        import os

        os.environ["PB_TEST_WRONG_KEY"] = "wrong-key"
        try:
            async with bus.service(tiers):
                late = job(1, batch=False, deadline="2001-01-01T00:00:00Z")
                unauthorized = [job(i, batch=True) for i in range(2, 6)]
                await bus.produce([late, *unauthorized])
                outcomes = await bus.wait_for_outcomes(
                    {"job-1", "job-2", "job-3", "job-4", "job-5"}, timeout_s=60
                )
        finally:
            del os.environ["PB_TEST_WRONG_KEY"]
    assert outcomes.dead["job-1"][0]["error"]["kind"] == "deadline_exceeded"
    for i in range(2, 6):
        (d,) = outcomes.dead[f"job-{i}"]
        assert d["error"]["kind"] == "auth_failed"
        assert d["error"]["status_code"] == 401
        assert "wrong-key" not in orjson.dumps(d).decode(), "the key never appears in a dead letter"
    assert not outcomes.results


async def test_quota_exhausted_pauses_only_its_tier_then_fails_its_jobs(make_bus: Callable[..., Any]) -> None:
    bus = make_bus(partitions=2)
    async with (
        SimulatorServer(SimulatorConfig(billing_rate=1.0)) as broke,
        SimulatorServer(SimulatorConfig()) as ok,
    ):
        tiers = tier_file_dict(ok + "/v1")
        tiers["tiers"]["broke"] = {
            **tier_file_dict(broke + "/v1")["tiers"]["small"],
            "retry": {"max_attempts": 3, "quota_cooldown_s": 0.3, "quota_max_wait_s": 1.0},
        }
        service = bus.service(tiers)
        async with service:
            broke_jobs = [job(i, batch=False, tier="broke") for i in range(4)]
            fine_jobs = [job(i, batch=True) for i in range(10, 30)]
            await bus.produce([*broke_jobs, *fine_jobs])
            outcomes = await bus.wait_for_outcomes(
                {j["id"] for j in broke_jobs + fine_jobs}, timeout_s=60
            )
        stats = service.stats_snapshot()
    for j in broke_jobs:
        (d,) = outcomes.dead[j["id"]]
        assert d["error"]["kind"] == "quota_exhausted"
    assert set(outcomes.results) == {j["id"] for j in fine_jobs}
    # the broke tier paused (more than one attempt per job was made across cool-downs)
    assert stats["tiers"]["broke"]["provider_requests"] > len(broke_jobs)


async def test_deadline_passing_while_waiting_for_retries_dead_letters_without_waiting(
    make_bus: Callable[..., Any],
) -> None:
    """A job whose deadline passes while its request waits out a backoff ends at the next send."""
    bus = make_bus(partitions=1)
    async with SimulatorServer(SimulatorConfig(error_rate=1.0)) as base_url:
        tiers = tier_file_dict(
            base_url + "/v1", retry={"max_attempts": 50, "backoff_initial_s": 1.0, "backoff_max_s": 1.0}
        )
        service = bus.service(tiers)
        async with service:
            soon = (datetime.now(UTC) + timedelta(seconds=2)).isoformat()
            await bus.produce([job(1, batch=False, deadline=soon)])
            outcomes = await bus.wait_for_outcomes({"job-1"}, timeout_s=30)
        stats = service.stats_snapshot()
    (dead,) = outcomes.dead["job-1"]
    assert dead["error"]["kind"] == "deadline_exceeded"
    assert 1 <= dead["attempts"] < 10, "it stopped at the deadline, not after 50 attempts"
    assert stats["tiers"]["small"]["provider_requests"] < 10


async def _committed(settings: Any, partition: int) -> int:  # the record-size test reads Kafka
    """The group's committed offset of one jobs partition (-1: none yet)."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.structs import TopicPartition

    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap_servers)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(settings.group_id)
    finally:
        await admin.close()
    meta = offsets.get(TopicPartition(settings.jobs_topic, partition))
    return meta.offset if meta is not None else -1


def _answers(request: CompletionRequest) -> Completion:
    """Every job's right answer; the job "trigger the bug" gets an answer without usage, as an
    adapter with a bug would return: the plan that reads it fails."""
    text = extract_input(request.messages[-1].content)
    if text == "trigger the bug":
        return replace(text_completion("x"), usage=cast(Any, None))
    return text_completion(answer_for(text))


class _TracerBreakingOnJob1(NoOpTracer):
    """A tracer whose span for job-1 cannot be started: taking that record fails."""

    def start_span(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if (kwargs.get("attributes") or {}).get("promptbus.job.id") == "job-1":
            raise RuntimeError("injected bug")
        return super().start_span(name, *args, **kwargs)


class _TracingBreakingOnJob1(NoOpTracerProvider):
    def get_tracer(self, *_args: Any, **_kwargs: Any) -> Any:
        return _TracerBreakingOnJob1()

    def shutdown(self) -> None:
        pass


def _bug_in_plans() -> tuple[dict[str, Any], str]:
    return {}, "a request plan of tier small failed (a bug); its 1 unfinished jobs stay uncommitted"


def _bug_in_intake() -> tuple[dict[str, Any], str]:
    tracing = {"tracer_provider": _TracingBreakingOnJob1()}
    return tracing, "/0/1 could not be taken (a bug); it stays uncommitted"


@pytest.mark.parametrize("inject", [_bug_in_plans, _bug_in_intake], ids=["plan", "intake"])
async def test_a_bug_on_one_job_is_logged_and_holds_back_the_commit(
    make_bus: Callable[..., Any],
    caplog: pytest.LogCaptureFixture,
    inject: Callable[[], tuple[dict[str, Any], str]],
) -> None:
    """A bug while taking a record or inside its request plan publishes no guess and does not
    stop the service: the job stays uncommitted (read again after a restart), the jobs after
    it are answered, and the log says why the partition's commits stopped."""
    service_kwargs, logged = inject()
    # the stuck job keeps the drain waiting for its outcome: bound it short
    bus = make_bus(partitions=1, PROMPTBUS_SHUTDOWN_TIMEOUT_S="2", PROMPTBUS_REVOKE_TIMEOUT_S="1")
    jobs = [job(0, batch=False), job(1, batch=False, text="trigger the bug"), job(2, batch=False)]
    provider = FakeProvider(_answers, name="small")
    tiers = tier_file_dict("http://127.0.0.1:9/v1")
    async with bus.service(tiers, providers={"small": provider}, **service_kwargs):
        await bus.produce(jobs[:2])
        await bus.wait_for_outcomes({"job-0"}, timeout_s=60)
        await bus.produce(jobs[2:])
        outcomes = await bus.wait_for_outcomes({"job-0", "job-2"}, timeout_s=60)
    # the stop commits all it can (its final flush): job-0's offset, never past job-1's
    assert set(outcomes.results) == {"job-0", "job-2"} and not outcomes.dead
    assert await bus.committed(0) == 1
    (line,) = [r for r in caplog.records if "(a bug)" in r.getMessage()]
    assert line.levelname == "ERROR" and logged in line.getMessage()
    assert line.exc_info is not None


@pytest.mark.integration
async def test_outcomes_over_the_output_topics_record_size_still_end_their_jobs(kafka_bootstrap: str) -> None:
    """Output topics made elsewhere may take smaller records than promptbus sends. A record
    over that size is refused on every attempt, so it held its partition's commits back for
    ever; now a dead letter leaves out its copies of the input and a result too large for
    its topic is dead-lettered output_invalid."""
    from consumer.testing.cluster import create_topic_on

    settings = settings_from_env(service_env(kafka_bootstrap, partitions=1))
    await create_topic_on(kafka_bootstrap, settings.results_topic, 1, 1, {"max.message.bytes": "65536"})
    await create_topic_on(kafka_bootstrap, settings.dlq_topic, 1, 1, {"max.message.bytes": "262144"})
    big_invalid = orjson.dumps(job(1, batch=False, tier="nope", text="x" * 150_000))
    big_metadata = job(2, batch=False, metadata={"notes": "m" * 100_000})
    async with SimulatorServer(SimulatorConfig()) as base_url:
        async with InProcessService(settings, tier_file_dict(base_url + "/v1")):
            await produce(settings, [big_invalid, big_metadata, job(3, batch=False)])
            outcomes = await wait_for_outcomes(settings, {"job-1", "job-2", "job-3"}, timeout_s=60)
            committed = -1
            for _ in range(40):  # bounded: the commit loop follows the acknowledgements
                committed = await _committed(settings, 0)
                if committed == 3:
                    break
                await asyncio.sleep(0.25)
    assert set(outcomes.results) == {"job-3"}
    (unknown,) = outcomes.dead["job-1"]
    assert unknown["error"]["kind"] == "unknown_tier" and unknown["raw"] is None
    assert unknown["job"]["id"] == "job-1", "the job itself still fits"
    assert "[the original bytes left out: the dead letter was" in unknown["error"]["message"]
    assert unknown["error"]["message"].endswith(f"the input is at {settings.jobs_topic}/0/0]")
    (too_long,) = outcomes.dead["job-2"]
    assert too_long["error"]["kind"] == "output_invalid"
    assert "over the results topic's" in too_long["error"]["message"]
    assert committed == 3, "every outcome is acknowledged, so every offset commits"


async def test_a_stop_while_the_group_join_never_ends_ends_the_service() -> None:
    """An instance told to stop while its intake is still joining (a rebalance the cluster does
    not finish) stops at once, with exit code 0, and closes the intake it was starting."""
    from consumer.app import run_service
    from consumer.settings import parse_tier_file
    from consumer.testing.harness import MemoryBus
    from consumer.testing.memory import MemoryEdges, MemoryIntake

    joining, left = asyncio.Event(), asyncio.Event()

    class NeverJoins(MemoryIntake):
        async def start(self, handler: Any) -> None:
            joining.set()
            await asyncio.Event().wait()

        async def stop(self) -> None:
            left.set()
            await super().stop()

    class Edges(MemoryEdges):
        def intake(self, settings: Any, client_id: str, owned: Any, topics: Any = ()) -> MemoryIntake:
            return NeverJoins(self.broker, settings, owned, topics)

    bus = MemoryBus(partitions=1)
    await bus.produce([job(1, batch=False)])
    stop = asyncio.Event()
    service = asyncio.create_task(
        run_service(
            bus.settings,
            parse_tier_file(tier_file_dict("http://127.0.0.1:9/v1")),
            stop=stop,
            install_signal_handlers=False,
            edges=Edges(bus.broker),
            providers={"small": FakeProvider(_answers)},
        )
    )
    await asyncio.wait_for(joining.wait(), 30)
    stop.set()
    assert await asyncio.wait_for(service, 10) == 0
    assert left.is_set(), "the intake it was starting is stopped"
    assert not await bus.read(bus.settings.results_topic), "it took no job"
