"""One instance of two cut from the brokers for longer than its session: it is expelled, its
partitions move to the other, and when it comes back it writes no outcome for a partition it
lost; duplicates stay within the bound.

Two `promptbus run` processes share a group, each reaching the broker through its own proxied
path (`proxied_kafka(paths=2)`), so cutting path 1 cuts instance A and leaves B alone. Each
names its provider deployment after itself ("a", "b"), so every result says which instance
wrote it. A zombie write is a result of A's for a job of a partition A lost that B answered
too, made (its record timestamp: when A handed it to its producer) after A's session had
lapsed: A could no longer know it owned the partition, and B was redoing the job. There must
be none. Every other duplicate is work A wrote before its session lapsed but had not
committed when the cut came, which B did again from the committed offset: at_least_once
bounds them (DUPLICATE_SHARE), exactly_once has none.

Besides the outcomes, the fault's events are checked: before the cut both instances answer
jobs; during it the group gives B every partition (A is expelled); after it A says it joined
again as a new member and is given partitions again, and both exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import pytest

from consumer.kafka.admin import ensure_topics
from consumer.testing.faultrun import kill_snapshot
from consumer.testing.harness import JobStream, job, service_env, settings_from_env, tier_file_dict
from consumer.testing.netcluster import ProxiedKafka
from consumer.testing.outcomes import OutcomeFollower
from consumer.testing.process import ServiceProcess, logs_of, stop_gracefully
from consumer.testing.simulator import SimulatorConfig, answer_for, run_simulator
from consumer.testing.toxiproxy import Toxiproxy

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 4
SESSION_S = 4.0
#: the cut outlasts the session by this much
PAST_SESSION_S = 5.0
JOBS = 2500
DUPLICATE_SHARE = 0.02
#: sent and not answered yet, in the steady state (the stream sends 10 jobs every 0.1 s)
STEADY_LAG = 30


def _tiers(base_url: str, instance: str) -> dict[str, Any]:
    """The simulator as one deployment named after the instance: its results name it."""
    tiers = tier_file_dict(base_url + "/v1", max_items=10, timeout_s=2)
    tiers["tiers"]["small"]["deployments"] = [{"name": instance, "base_url": base_url + "/v1"}]
    return tiers


#: what A logs when it is back in the group under a new member id (`KafkaIntake`)
REJOINED_AS_NEW = "joined again as a new member"


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_an_instance_cut_past_its_session_is_expelled_and_writes_nothing_for_lost_partitions(
    toxi: Toxiproxy, proxied_broker: ProxiedKafka, tmp_path: Path, guarantee: str
) -> None:
    env = service_env(
        proxied_broker.proxied(1),
        partitions=PARTITIONS,
        guarantee=guarantee,
        PROMPTBUS_SESSION_TIMEOUT_S=SESSION_S,
        PROMPTBUS_STATS_INTERVAL_S=1,
    )
    direct = settings_from_env(env | {"KAFKA_BOOTSTRAP_SERVERS": proxied_broker.direct})
    await ensure_topics(direct)
    jobs = [job(i, batch=i % 2 != 0) for i in range(JOBS)]
    expected = {j["id"]: answer_for(j["variables"]["text"]) for j in jobs}
    with run_simulator(SimulatorConfig(seed=54, latency_ms=20)) as base_url:
        a = ServiceProcess(env, _tiers(base_url, "a"), tmp_path, name="a")
        env_b = env | {"KAFKA_BOOTSTRAP_SERVERS": proxied_broker.proxied(2)}
        b = ServiceProcess(env_b, _tiers(base_url, "b"), tmp_path, name="b")
        stream = JobStream(direct, jobs, chunk=10, interval_s=0.1)
        async with OutcomeFollower(direct, isolation_level="read_committed") as follower:
            a.start()
            b.start()
            feeding = asyncio.create_task(stream.run())
            try:
                # step 1, the steady state: both instances hold partitions, have written results
                # and keep up with the stream (the backlog that gathers while they start and
                # join is answered): what the cut finds written and not committed yet is then
                # the stream's last moments, not a burst of that backlog
                def steady_state() -> bool:
                    answered = {o.job_id for o in follower.outcomes}
                    return (
                        len((a.assignment() or set()) | (b.assignment() or set())) == PARTITIONS
                        and bool(a.assignment())
                        and bool(b.assignment())
                        and len(answered) >= 100
                        and {"a", "b"} <= {o.deployment for o in follower.outcomes}
                        and len(stream.sent) - len(answered) <= STEADY_LAG
                    )

                steady = await follower.wait(steady_state, timeout_s=90)
                assert steady, "both instances answer before the cut\n" + logs_of([a, b])
                lost = set(a.assignment() or set())
                lag_at_cut = len(stream.sent) - len({o.job_id for o in follower.outcomes})
                a_before, b_before = len(a.assignments()), len(b.assignments())
                # step 2: A cut off past its session; the group expels it and gives B every partition
                with proxied_broker.links["broker-1"].cut():
                    cut_at = time.monotonic()
                    lapsed_ms = int(time.time() * 1000 + SESSION_S * 1000)
                    took_over = await follower.wait(
                        lambda: any(s == set(range(PARTITIONS)) for s in b.assignments()[b_before:]),
                        timeout_s=SESSION_S + 10,
                    )
                    await asyncio.sleep(max(0.0, cut_at + SESSION_S + PAST_SESSION_S - time.monotonic()))
                at_end = await kill_snapshot(direct)
                records_at_end = follower.records
                # step 3: work flows again, and A comes back into the group as a new member
                flowing = await follower.wait(
                    lambda: follower.records >= records_at_end + 20, timeout_s=SESSION_S + 10
                )
                a_back = await follower.wait(
                    lambda: len(a.assignments()) > a_before and bool(a.assignment()), timeout_s=60
                )
                finished = await follower.wait_for_ids(expected, timeout_s=120)
            finally:
                stream.stop.set()
                await feeding
                codes = [await stop_gracefully(s, 30) for s in (a, b)]
                for s in (a, b):
                    s.ensure_stopped()
            with contextlib.suppress(Exception):
                await follower.settle()
            outcomes = list(follower.outcomes)
    seen = {o.job_id for o in outcomes}
    duplicates = len(outcomes) - len(seen)
    by_b = {o.job_id for o in outcomes if o.deployment == "b"}
    a_copies = [
        o for o in outcomes if o.deployment == "a" and o.source_partition in lost and o.job_id in by_b
    ]
    # A's copies of jobs B did too, handed to A's producer after A's session lapsed: the group
    # could have given (and did give) their partitions to B by then
    zombie = [o for o in a_copies if o.timestamp_ms >= lapsed_ms]
    # the rest of the duplicates: work written before the lapse but not committed, done again
    redone = duplicates - len(zombie)
    # of those, A's that reached the log only after the cut (they were in its producer)
    late = [o for o in a_copies if o.offset >= at_end.ends.get((o.dead, o.partition), 0)]
    print(
        f"\nexpulsion ({guarantee}): A held {sorted(lost)}, {lag_at_cut} jobs unanswered at the cut; "
        f"{len(outcomes)} outcomes, "
        f"{duplicates} duplicates: {len(zombie)} zombie writes, {redone} redone "
        f"({len(late)} of A's written after the cut); B took over: {took_over}"
    )
    assert took_over, "B was given every partition while A was cut off\n" + logs_of([a, b])
    assert flowing and a_back and finished, logs_of([a, b])
    assert REJOINED_AS_NEW in a.log_path.read_text(errors="replace"), logs_of([a])
    assert set(expected) <= seen
    assert not any(o.dead for o in outcomes)
    assert all(o.output == expected[o.job_id] for o in outcomes)
    assert zombie == [], f"A wrote outcomes for partitions it had lost: {zombie[:5]}\n" + logs_of([a, b])
    assert redone <= (0 if guarantee == "exactly_once" else int(DUPLICATE_SHARE * JOBS)), logs_of([a, b])
    assert codes == [0, 0], logs_of([a, b])
