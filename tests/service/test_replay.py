"""`promptbus replay --dlq`: dead letters' jobs go back to the jobs topic, once.

The broker test runs the real service in-process with the simulator: jobs naming a tier that
is not configured yet (`unknown_tier`), jobs whose template misses a variable
(`template_error`) and one record that is not JSON (`invalid_job`, only its raw bytes kept)
are dead-lettered. A dry run (the CLI, as a process) lists all of them and produces nothing.
With the tier configured, replaying `unknown_tier` republishes exactly those jobs (key: the
job id; header `promptbus-replay-of`: the dead letter's topic/partition/offset; value: the
dead letter's job), the service answers them, and a second run replays nothing: neither the
replayed ones nor the ones the first run's filter left out. The first run says those are behind
for good and prints the two commands that read them again; following them does.

`plan_replay` (no I/O) is checked on its own for the raw-bytes path and the filters.
"""

from __future__ import annotations

import asyncio
import base64
import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer

from consumer.cli import main
from consumer.core.jobs import decode_job
from consumer.kafka.clients import topic_partitions
from consumer.kafka.connection import client_kwargs
from consumer.kafka.records import SourceOffset, TopicPartition
from consumer.kafka.replay import (
    REPLAY_HEADER,
    Replay,
    ReplayFilter,
    ReplayReport,
    Skip,
    left_behind_lines,
    plan_replay,
    replay_dead_letters,
)
from consumer.settings import Settings
from consumer.testing.harness import (
    InProcessService,
    job,
    produce,
    read_outcomes,
    service_env,
    settings_from_env,
    tier_file_dict,
    wait_for_outcomes,
)
from consumer.testing.process import run_cli
from consumer.testing.simulator import SimulatorConfig, SimulatorServer, answer_for

DLQ_TP = TopicPartition("dlq", 0)
NOW = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def dead_letter(kind: str, *, job_value: dict[str, Any] | None = None, raw: bytes | None = None) -> bytes:
    return orjson.dumps(
        {
            "id": job_value["id"] if job_value else None,
            "status": "failed",
            "error": {"kind": kind, "message": "m", "retryable": False},
            "attempts": 0,
            "job": job_value,
            "raw": base64.b64encode(raw).decode() if raw is not None else None,
            "source": {"topic": "jobs", "partition": 0, "offset": 1},
            "failed_at": NOW.isoformat().replace("+00:00", "Z"),
        }
    )


def plan(value: bytes, flt: ReplayFilter | None = None, *, timestamp_ms: int = 0) -> Replay | Skip:
    return plan_replay(value, SourceOffset(DLQ_TP, 7), timestamp_ms, flt or ReplayFilter(), "jobs")


def test_a_never_parsed_job_is_replayed_as_its_original_bytes() -> None:
    # dead-lettered as invalid_job by an older service, a job today's admission takes
    original = b'{"id": "j-1", "tier": "small", "prompt": "hi"}'
    decision = plan(dead_letter("invalid_job", raw=original))
    assert isinstance(decision, Replay)
    assert decision.record.value == original and decision.record.topic == "jobs"
    assert decision.record.key == b"j-1", "the id read from the bytes keys the record"
    assert decision.record.headers == ((REPLAY_HEADER, b"dlq/0/7"),)


def test_a_replayed_job_keeps_the_tenant_its_dead_letter_names() -> None:
    """A budget_exhausted job whose tenant came in its record's header: the replayed record
    names it again (the job's own tenant field, when it has one, still wins at admission)."""
    value = orjson.loads(dead_letter("budget_exhausted", job_value=job(1, batch=False)))
    value["tenant"] = "reports"
    decision = plan(orjson.dumps(value))
    assert isinstance(decision, Replay)
    assert decision.record.headers == ((REPLAY_HEADER, b"dlq/0/7"), ("promptbus-tenant", b"reports"))
    value["tenant"] = None  # a record whose tenant could not be read: no header
    decision = plan(orjson.dumps(value))
    assert isinstance(decision, Replay) and decision.record.headers == ((REPLAY_HEADER, b"dlq/0/7"),)


def test_a_job_goes_back_to_the_topic_it_was_read_from_its_lanes() -> None:
    value = orjson.loads(dead_letter("retries_exhausted", job_value=job(1, batch=False)))
    value["source"]["topic"] = "promptbus.jobs.interactive"
    decision = plan(orjson.dumps(value))
    assert isinstance(decision, Replay) and decision.record.topic == "promptbus.jobs.interactive"
    del value["source"]
    decision = plan(orjson.dumps(value))
    assert isinstance(decision, Replay) and decision.record.topic == "jobs", "no source: the jobs topic"


def test_a_job_admission_would_refuse_again_is_skipped_with_its_reason() -> None:
    typo = plan(dead_letter("invalid_job", raw=b'{"id": "j-1", "tier": "small", "promt": "typo"}'))
    assert isinstance(typo, Skip) and typo.reason == "still_invalid"
    assert typo.problem is not None and "it would be dead-lettered again: invalid_job: " in typo.problem
    not_json = plan(dead_letter("invalid_job", raw=b"\xff\xfe"))
    assert isinstance(not_json, Skip) and not_json.problem == (
        "it would be dead-lettered again: invalid_job: not UTF-8 (byte 0)"
    )
    broken = plan(
        dead_letter("template_error", job_value=job(1, batch=False, prompt="Say ${missing}:\n${text}"))
    )
    assert isinstance(broken, Skip) and broken.problem == (
        "it would be dead-lettered again: template_error: missing variable 'missing'"
    )


def test_filters_pick_kind_tier_and_time() -> None:
    value = dead_letter("unknown_tier", job_value=job(1, batch=False, tier="large"))
    assert isinstance(plan(value, ReplayFilter(kinds=frozenset({"unknown_tier"}))), Replay)
    assert plan(value, ReplayFilter(kinds=frozenset({"template_error"}))) == Skip(
        "kind", "dlq/0/7", kind="unknown_tier"
    )
    assert isinstance(plan(value, ReplayFilter(tier="large")), Replay)
    assert plan(value, ReplayFilter(tier="small")) == Skip("tier", "dlq/0/7", kind="unknown_tier")
    assert isinstance(plan(value, ReplayFilter(since=NOW)), Replay), "failed_at equal to since is kept"
    assert plan(value, ReplayFilter(since=NOW + timedelta(seconds=1))) == Skip(
        "older", "dlq/0/7", kind="unknown_tier"
    )
    # no usable failed_at: the record timestamp decides
    undated = orjson.loads(value)
    undated["failed_at"] = "yesterday"
    newer_ms = int((NOW + timedelta(hours=1)).timestamp() * 1000)
    decision = plan(orjson.dumps(undated), ReplayFilter(since=NOW), timestamp_ms=newer_ms)
    assert isinstance(decision, Replay)
    assert plan(orjson.dumps(undated), ReplayFilter(since=NOW), timestamp_ms=0).reason == "older"  # type: ignore[union-attr]


def test_what_cannot_be_replayed_says_why() -> None:
    left_out = plan(dead_letter("retries_exhausted"))  # job and raw both left out for size
    assert isinstance(left_out, Skip) and left_out.reason == "no_input" and left_out.problem
    foreign = plan(b"written by another tool")
    assert isinstance(foreign, Skip) and foreign.reason == "not_a_dead_letter"
    bad_raw = orjson.loads(dead_letter("invalid_job", raw=b"x"))
    bad_raw["raw"] = "!!not base64!!"
    assert plan(orjson.dumps(bad_raw)).reason == "no_input"  # type: ignore[union-attr]


def test_what_a_filter_left_out_is_named_behind_for_good_with_the_commands_that_replay_it() -> None:
    settings = Settings(KAFKA_BOOTSTRAP_SERVERS="b1:9092,b2:9092", group_id="g", dlq_topic="g.dlq")
    report = ReplayReport(dry_run=False)
    only_quota = ReplayFilter(kinds=frozenset({"quota_exhausted"}))
    for kind in ("unknown_tier", "budget_exhausted", "unknown_tier", "quota_exhausted"):
        report.add(plan(dead_letter(kind, job_value=job(1, batch=False)), only_quota))
    report.add(plan(b"written by another tool", only_quota))  # cannot be replayed: no hint for it
    assert report.summary() == [
        "replayed 1 dead letters: quota_exhausted=1",
        "skipped 4: kind=3, not_a_dead_letter=1",
    ]
    assert left_behind_lines(report, settings) == [
        "the 3 a filter left out are now behind the replay group's place (g.replay) for good: "
        "no later run reads them; to replay them anyway, move its place back to the start and run "
        "again with their kinds (dead letters of those kinds replayed before are replayed again too):",
        "  kafka-consumer-groups.sh --bootstrap-server b1:9092,b2:9092 --group g.replay --topic g.dlq "
        "--reset-offsets --to-earliest --execute",
        "  promptbus replay --dlq --kind budget_exhausted --kind unknown_tier",
    ]
    secured = Settings(KAFKA_BOOTSTRAP_SERVERS="b1:9093", kafka={"security_protocol": "SASL_SSL"})
    reset = left_behind_lines(report, secured)[1]
    assert "--bootstrap-server b1:9093 --command-config CLIENT.properties --group" in reset
    dry = ReplayReport(dry_run=True)
    dry.add(plan(dead_letter("unknown_tier", job_value=job(1, batch=False)), only_quota))
    assert left_behind_lines(dry, settings) == [
        "a dry run moves nothing; without --dry-run the 1 a filter left out are behind for good"
    ]
    nothing_left_out = ReplayReport(dry_run=False)
    nothing_left_out.add(plan(b"written by another tool"))
    assert left_behind_lines(nothing_left_out, settings) == []


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["replay"], "replay: give --dlq"),
        (["replay", "--dlq", "--kind", "nope"], "--kind: unknown error kind 'nope'"),
        (["replay", "--dlq", "--since", "yesterday"], "--since: not an RFC 3339 time"),
        (["replay", "--dlq", "--since", "2026-12-01T10:00:00"], "--since: give a UTC offset"),
    ],
)
def test_bad_arguments_exit_2_naming_the_option(
    args: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == 2
    assert says in capsys.readouterr().err


async def _end_offsets(settings: Settings, topic: str) -> dict[TopicPartition, int]:
    tps = [TopicPartition(topic, p) for p in await topic_partitions(settings, topic)]
    consumer = AIOKafkaConsumer(**client_kwargs(settings))
    await consumer.start()
    try:
        end: dict[TopicPartition, int] = await consumer.end_offsets(tps)
        return end
    finally:
        await consumer.stop()


async def _records_between(
    settings: Settings, start: dict[TopicPartition, int], end: dict[TopicPartition, int]
) -> list[Any]:
    """The records of each partition from `start` up to `end` (bounded: end is known)."""
    consumer = AIOKafkaConsumer(enable_auto_commit=False, **client_kwargs(settings))
    await consumer.start()
    out: list[Any] = []
    try:
        tps = [tp for tp in end if end[tp] > start.get(tp, 0)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, start.get(tp, 0))
        for _ in range(100):
            positions = {tp: await consumer.position(tp) for tp in tps}
            if all(positions[tp] >= end[tp] for tp in tps):
                break
            for tp, records in (await consumer.getmany(timeout_ms=500)).items():
                out += [r for r in records if r.offset < end[tp]]
        return out
    finally:
        await consumer.stop()


async def _commit_earliest(settings: Settings, group: str) -> None:
    """`kafka-consumer-groups.sh --group GROUP --topic DLQ --reset-offsets --to-earliest --execute`."""
    consumer = AIOKafkaConsumer(group_id=group, enable_auto_commit=False, **client_kwargs(settings))
    await consumer.start()
    try:
        tps = [
            TopicPartition(settings.dlq_topic, p)
            for p in await topic_partitions(settings, settings.dlq_topic)
        ]
        consumer.assign(tps)
        await consumer.commit(await consumer.beginning_offsets(tps))
    finally:
        await consumer.stop()


def _dead_letters_by_id(records: list[Any]) -> dict[Any, tuple[dict[str, Any], str]]:
    return {
        orjson.loads(r.value)["id"]: (orjson.loads(r.value), f"{r.topic}/{r.partition}/{r.offset}")
        for r in records
    }


@pytest.mark.integration
async def test_replay_republishes_one_kind_once_and_the_service_answers_it(kafka_bootstrap: str) -> None:
    env = service_env(kafka_bootstrap, partitions=2)
    settings = settings_from_env(env)
    unknown = [job(i, batch=False, tier="large") for i in range(5)]
    broken = [job(100 + i, batch=False, prompt="Say ${missing} about:\n${text}") for i in range(3)]
    fine = [job(200 + i, batch=True) for i in range(4)]
    poison = b"\xffnot json"
    async with SimulatorServer(SimulatorConfig(seed=3)) as base_url:
        small = tier_file_dict(base_url + "/v1")
        both = copy.deepcopy(small)
        both["tiers"]["large"] = copy.deepcopy(small["tiers"]["small"])

        async with InProcessService(settings, small):
            await produce(settings, [*unknown, *broken, *fine, poison])
            first = await wait_for_outcomes(
                settings, {j["id"] for j in unknown + broken + fine}, timeout_s=60, dead_expected=9
            )
        kinds = sorted(d["error"]["kind"] for ds in first.dead.values() for d in ds)
        assert kinds == ["invalid_job"] + ["template_error"] * 3 + ["unknown_tier"] * 5, kinds
        jobs_end = await _end_offsets(settings, settings.jobs_topic)
        dlq_end = await _end_offsets(settings, settings.dlq_topic)
        dead = _dead_letters_by_id(await _records_between(settings, {}, dlq_end))

        # Dry run, as the operator runs it: lists the five that can succeed, says why the four
        # whose own content admission refuses cannot, produces and commits nothing
        done = await asyncio.to_thread(run_cli, "replay", "--dlq", "--dry-run", env=env)
        code, out, err = done.returncode, done.stdout, done.stderr
        assert code == 0, err
        assert "would replay 5 dead letters: unknown_tier=5" in out
        assert "skipped 4: still_invalid=4" in out
        assert err.count("not replayable: ") == 4 and "template_error: missing variable 'missing'" in err
        for j in unknown:
            assert f"would replay {j['id']} (unknown_tier) from {dead[j['id']][1]}" in out
        assert await _end_offsets(settings, settings.jobs_topic) == jobs_end, "a dry run produced"

        # The tier exists now: replay the unknown_tier dead letters (the CLI, as the operator
        # runs it: it says the four its filter left out are behind for good, and how to replay
        # them anyway), the service answers them
        async with InProcessService(settings, both):
            done = await asyncio.to_thread(run_cli, "replay", "--dlq", "--kind", "unknown_tier", env=env)
            assert done.returncode == 0, done.stderr
            lines = done.stdout.splitlines()
            assert lines[:2] == ["replayed 5 dead letters: unknown_tier=5", "skipped 4: kind=4"], done.stdout
            group = f"{settings.group_id}.replay"
            assert lines[2].startswith(
                f"the 4 a filter left out are now behind the replay group's place ({group})"
            )
            assert lines[3] == (
                f"  kafka-consumer-groups.sh --bootstrap-server {settings.kafka_bootstrap_servers} "
                f"--group {group} --topic {settings.dlq_topic} --reset-offsets --to-earliest --execute"
            )
            assert lines[4] == "  promptbus replay --dlq --kind invalid_job --kind template_error"
            rerun = lines[4].split()[1:]
            replayed_end = await _end_offsets(settings, settings.jobs_topic)
            replayed = await _records_between(settings, jobs_end, replayed_end)
            assert len(replayed) == 5
            for r in replayed:
                jid = r.key.decode()
                letter, where = dead[jid]
                assert dict(r.headers)[REPLAY_HEADER] == where.encode()
                assert orjson.loads(r.value) == letter["job"]
                assert decode_job(r.value).tier == "large"
            answered = await wait_for_outcomes(settings, {j["id"] for j in unknown}, timeout_s=60)
            for j in unknown:
                (result,) = answered.results[j["id"]]
                assert result["output"] == answer_for(j["variables"]["text"])
                assert (
                    result["source"]["offset"]
                    >= jobs_end[TopicPartition(settings.jobs_topic, result["source"]["partition"])]
                )

        # Again: nothing new, and what the first run's filter left out stays behind
        again = await replay_dead_letters(settings, ReplayFilter(kinds=frozenset({"unknown_tier"})))
        everything = await replay_dead_letters(settings, ReplayFilter())
        assert sum(again.replayed.values()) == 0 and sum(again.skipped.values()) == 0
        assert sum(everything.replayed.values()) == 0, everything.summary()
        assert await _end_offsets(settings, settings.jobs_topic) == replayed_end

        # The two commands it printed: the reset (what kafka-consumer-groups.sh commits), then
        # the rerun reads the four again (their own content still fails: skipped, named)
        await _commit_earliest(settings, group)
        done = await asyncio.to_thread(run_cli, *rerun, env=env)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[:2] == [
            "replayed 0 dead letters",
            "skipped 9: kind=5, still_invalid=4",
        ]
        assert done.stderr.count("not replayable: ") == 4, done.stderr
        assert await _end_offsets(settings, settings.jobs_topic) == replayed_end
    outcomes = await read_outcomes(settings)
    assert all(len(rs) == 1 for rs in outcomes.results.values()), "a job was answered twice"
    assert sorted(outcomes.results) == sorted(j["id"] for j in unknown + fine)
    assert sum(len(ds) for ds in outcomes.dead.values()) == 9, "a replayed job failed again"
