"""Bound tenants on a broker that authorizes: SASL_SSL plus KRaft's StandardAuthorizer, the
principals `promptbus`, `team-a` and `team-b`, and ACLs set by this module's setup. The broker
does the refusing:

- team-a cannot write team-b's job topic (and can write its own);
- a job team-a writes claiming `team-b` is dead-lettered `tenant_mismatch` into team-a's
  dead-letter topic and spends nothing of team-b's budget;
- team-a cannot read team-b's results (and can read its own); `promptbus results --tenant
  team-b` as team-a is one line naming the user and the topic, exit 2;
- promptbus runs (exactly-once) with exactly the ACLs `consumer.kafka.acls.service_acls` lists,
  the list docs/operations.md#security gives and `promptbus check-config --acls` prints.

Every topic is made by the admin beforehand: promptbus gets no Create.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError, TopicAuthorizationFailedError

from consumer.core.errors import ConfigError
from consumer.kafka.acls import service_acls, tenant_acls
from consumer.kafka.admin import ensure_topics, topic_specs, with_admin
from consumer.kafka.clients import topic_partitions
from consumer.kafka.connection import client_kwargs
from consumer.kafka.records import TopicPartition
from consumer.settings import Settings, parse_tier_file
from consumer.testing.acls import create_acls
from consumer.testing.cluster import LocalKafka
from consumer.testing.harness import InProcessService, job, service_env, settings_from_env, tier_file_dict
from consumer.testing.process import run_cli
from consumer.testing.simulator import SimulatorConfig, answer_for, run_simulator
from tests.integration.private_broker import private_broker

pytestmark = pytest.mark.integration

TEAMS = ("team-a", "team-b")
BUDGET_TOKENS = 1_000_000


def tier_file(base_url: str, env: dict[str, str]) -> dict[str, Any]:
    """Two lanes, each a team's job topic, each team bound to its own with its own outputs and
    a daily budget."""
    tiers = tier_file_dict(base_url, batching=False)
    tiers["lanes"] = {team: {"topic": f"{team}.jobs"} for team in TEAMS}
    tiers["tenants"] = {
        team: {
            "topics": [f"{team}.jobs"],
            "results_topic": f"{team}.results",
            "dead_letter_topic": f"{team}.dlq",
            "budget": {"tokens_per_day": BUDGET_TOKENS},
        }
        for team in TEAMS
    }
    return tiers


@pytest.fixture(scope="module")
def acl_kafka() -> Iterator[LocalKafka]:
    """A 1-node SASL_SSL broker with the authorizer on and the users team-a and team-b."""
    with private_broker("acl", security="sasl_ssl", acl=True, users=TEAMS) as kafka:
        yield kafka


@pytest.fixture(scope="module")
def setup(acl_kafka: LocalKafka) -> Iterator[dict[str, Any]]:
    """The service's env (as promptbus), the tier file, and every topic and ACL made as admin."""
    env = {**service_env(acl_kafka.bootstrap, partitions=2, guarantee="exactly_once"), **acl_kafka.client_env}
    with run_simulator(SimulatorConfig(latency_ms=5)) as base_url:
        tiers = tier_file(base_url + "/v1", env)
        settings = settings_from_env(env)
        parsed = parse_tier_file(tiers)
        admin = user_settings(acl_kafka, env, "admin")
        specs = topic_specs(
            settings,
            [lane.topic for lane in parsed.lane_list(settings.jobs_topic, settings.max_inflight)],
            output_topics=parsed.tenant_topics(settings.results_topic, settings.dlq_topic).output_topics,
        )
        grants = [("promptbus", acl) for acl in service_acls(settings, parsed)]
        grants += [(team, acl) for team in TEAMS for acl in tenant_acls(settings, parsed, team)]

        async def prepare() -> None:
            await ensure_topics(admin, specs)
            await create_acls(client_kwargs(admin), grants)
            # the broker's authorizer learns new ACLs from the metadata log, a moment later
            teams = [(user_settings(acl_kafka, env, t), f"{t}.jobs") for t in TEAMS]
            for _ in range(100):
                with contextlib.suppress(ConfigError):  # refused until the ACLs are in
                    if all([await topic_partitions(user, topic) for user, topic in teams]):
                        return
                await asyncio.sleep(0.1)
            raise AssertionError("the teams' ACLs did not take effect")

        asyncio.run(prepare())
        yield {"env": env, "tiers": tiers, "settings": settings, "kafka": acl_kafka}


def user_settings(kafka: LocalKafka, env: dict[str, str], user: str) -> Settings:
    return settings_from_env({**env, **kafka.user_env(user)})


async def send(
    settings: Settings, topic: str, value: dict[str, Any], headers: list[Any] | None = None
) -> None:
    producer = AIOKafkaProducer(**client_kwargs(settings), acks="all", request_timeout_ms=10_000)
    await producer.start()
    try:
        await producer.send_and_wait(topic, orjson.dumps(value), key=value["id"].encode(), headers=headers)
    finally:
        await producer.stop()


async def read_all(
    settings: Settings, topic: str, want: set[str], timeout_s: float = 60
) -> dict[str, dict[str, Any]]:
    """Every value of `topic` by id, once the ids `want` are there (bounded; none: what is
    there now), read as `settings`' user."""
    # no group, no committed offsets: each partition is read from its start
    consumer = AIOKafkaConsumer(
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **client_kwargs(settings),
    )
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(int(settings.topic_partitions))])
        found: dict[str, dict[str, Any]] = {}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for records in batch.values():
                found.update((v["id"], v) for v in (orjson.loads(r.value) for r in records))
            if want and want <= set(found):
                break
            if not want and not batch:  # nothing wanted: what is there now
                break
        return found
    finally:
        await consumer.stop()


async def refused(coro: Any) -> KafkaError:
    """The authorization error `coro` ends with (the test fails if it succeeds)."""
    with pytest.raises(KafkaError) as caught:
        await asyncio.wait_for(coro, timeout=30)
    return caught.value


async def test_team_a_cannot_write_team_bs_job_topic(setup: dict[str, Any]) -> None:
    team_a = user_settings(setup["kafka"], setup["env"], "team-a")
    error = await refused(send(team_a, "team-b.jobs", job(900, batch=False)))
    assert isinstance(error, TopicAuthorizationFailedError), repr(error)
    # its own topic takes the same job: the refusal is the ACL's, not the connection's
    await send(team_a, "team-a.jobs", {**job(901, batch=False), "tier": "no-such-tier"})


async def test_team_a_cannot_read_team_bs_results(setup: dict[str, Any]) -> None:
    kafka, env = setup["kafka"], setup["env"]
    team_a, team_b = (user_settings(kafka, env, team) for team in TEAMS)
    # an answer of team-b's (written as admin: what promptbus writes there)
    await send(user_settings(kafka, env, "admin"), "team-b.results", {"id": "b-answer", "output": "secret"})
    assert set(await read_all(team_b, "team-b.results", {"b-answer"})) == {"b-answer"}
    # the broker refuses team-a the topic's metadata, so no fetch of it can start...
    assert await topic_error(team_a, "team-b.results") == TopicAuthorizationFailedError.errno
    assert await topic_error(team_a, "team-a.results") == 0
    # ...and a reader of it, as promptbus's client reads (assigned, no group), gets nothing
    assert await read_all(team_a, "team-b.results", {"b-answer"}, timeout_s=5) == {}


def test_promptbus_results_as_team_a_for_team_b_is_one_refusal_line(
    setup: dict[str, Any], tmp_path: Path
) -> None:
    kafka, env = setup["kafka"], setup["env"]
    config = tmp_path / "tiers.yaml"
    config.write_text(yaml.safe_dump(setup["tiers"]))
    as_a = {**env, **kafka.user_env("team-a"), "PROMPTBUS_CONFIG": str(config)}
    refused_run = run_cli("results", "--tenant", "team-b", env=as_a)
    assert refused_run.returncode == 2, refused_run.stderr
    lines = refused_run.stderr.strip().splitlines()
    assert len(lines) == 1 and "'team-a'" in lines[0] and "'team-b.results'" in lines[0], lines
    assert kafka.user_env("team-a")["PROMPTBUS_KAFKA__SASL_PASSWORD"] not in refused_run.stderr
    own = run_cli("results", "--tenant", "team-a", env=as_a)  # its own: read, no refusal
    assert own.returncode == 0, own.stderr


async def topic_error(settings: Settings, topic: str) -> int:
    """The error code of `topic` in a metadata answer to `settings`' user (0: none)."""
    described = await with_admin(settings, lambda admin: admin.describe_topics([topic]))
    (found,) = [t for t in described if t.get("topic") == topic]
    return int(found.get("error_code") or 0)


async def test_a_claim_of_another_team_is_its_own_dead_letter_and_spends_nothing_of_the_other(
    setup: dict[str, Any],
) -> None:
    """promptbus runs as its own principal with exactly the listed ACLs (exactly-once)."""
    env, kafka = setup["env"], setup["kafka"]
    team_a, team_b = (user_settings(kafka, env, team) for team in TEAMS)
    own = job(1, batch=False, text="team a asks")
    claims_b = {**job(2, batch=False, text="team a pretends"), "tenant": "team-b"}
    claims_b_by_header = job(3, batch=False, text="team a pretends again")
    async with InProcessService(setup["settings"], setup["tiers"]) as svc:
        await send(team_a, "team-a.jobs", own)
        await send(team_a, "team-a.jobs", claims_b)
        await send(team_a, "team-a.jobs", claims_b_by_header, headers=[("promptbus-tenant", b"team-b")])
        results = await read_all(team_a, "team-a.results", {"job-1"})
        dead = await read_all(team_a, "team-a.dlq", {"job-2", "job-3"})
        for _ in range(100):  # the budget gauges are refreshed each pipeline turn
            if svc.stats.tenants["team-a"].spent_tokens > 0:
                break
            await asyncio.sleep(0.1)
        spent = {team: svc.stats.tenants[team].spent_tokens for team in TEAMS}
        ended_b = (svc.stats.tenants["team-b"].results, svc.stats.tenants["team-b"].dead_letters)
    assert svc.task is not None and svc.task.result() == 0
    assert set(results) == {"job-1"}  # the claims were never answered
    assert results["job-1"]["tenant"] == "team-a" and results["job-1"]["output"] == answer_for("team a asks")
    for jid, value in (("job-2", claims_b), ("job-3", claims_b_by_header)):
        assert dead[jid]["error"]["kind"] == "tenant_mismatch" and dead[jid]["tenant"] == "team-a"
        assert orjson.loads(base64.b64decode(dead[jid]["raw"])) == value
    # team-a's answer was paid by team-a; team-b spent nothing and ended nothing
    assert spent["team-a"] > 0 and spent["team-b"] == 0, spent
    assert ended_b == (0, 0)
    for topic in ("team-b.results", "team-b.dlq"):  # none of team-a's claims reached team-b
        assert not {"job-2", "job-3"} & set(await read_all(team_b, topic, set()))

