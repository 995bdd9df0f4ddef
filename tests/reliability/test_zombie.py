"""A frozen instance comes back as a zombie (SIGSTOP past the session timeout, then SIGCONT).

Two `promptbus run` processes share a group; jobs arrive as a steady stream. Process A is
frozen with SIGSTOP while it holds work; after its session times out the group gives all
partitions to B (under exactly_once, B's transactional producers fence A's). Then A is
resumed: its late commits fail (at_least_once: the group moved on; exactly_once: fenced),
it rejoins and takes partitions again, and the stream goes on through it. Checks:

- nothing is lost; every answer is the simulator's answer to the job's own input;
- exactly_once: a read_committed reader sees exactly one outcome per id, A's work from
  before the freeze included;
- A survives being a zombie: it rejoins, processes again, and exits 0 on SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from consumer.testing.harness import (
    JobStream,
    create_topics,
    mixed_jobs,
    read_outcomes,
    service_env,
    settings_from_env,
    tier_file_dict,
)
from consumer.testing.outcomes import OutcomeFollower
from consumer.testing.process import ServiceProcess, logs_of, split_between, stop_gracefully
from consumer.testing.simulator import SimulatorConfig, answer_for, run_simulator

pytestmark = pytest.mark.integration

PARTITIONS = 4
#: the stream runs until told to stop; MAX_JOBS bounds it
MAX_JOBS = 1500
CHUNK = 10
CHUNK_INTERVAL_S = 0.4
FREEZE_AFTER_OUTCOMES = 60
#: after A has rejoined, the stream goes on until this many jobs of A's partitions are answered
AFTER_REJOIN_JOBS = 20
#: covers the session timeout (`short_session_s`) plus the rebalance
TAKEOVER_WAIT_S = 60.0
FINISH_WAIT_S = 120.0
SHUTDOWN_TIMEOUT_S = 10.0
CLOSE_MARGIN_S = 10.0


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_frozen_instance_returns_as_a_zombie(
    kafka_bootstrap: str, tmp_path: Path, guarantee: str, short_session_s: float
) -> None:
    env = service_env(
        kafka_bootstrap,
        partitions=PARTITIONS,
        guarantee=guarantee,
        PROMPTBUS_SHUTDOWN_TIMEOUT_S=SHUTDOWN_TIMEOUT_S,
        PROMPTBUS_SESSION_TIMEOUT_S=short_session_s,
    )
    settings = settings_from_env(env)
    await create_topics(settings)
    all_partitions = set(range(PARTITIONS))
    feed = JobStream(settings, mixed_jobs(MAX_JOBS), CHUNK, CHUNK_INTERVAL_S)

    with run_simulator(SimulatorConfig(latency_ms=50, jitter_ms=20, seed=11)) as base_url:
        tiers = tier_file_dict(base_url + "/v1", max_items=5)
        a = ServiceProcess(env, tiers, tmp_path, name="a")
        b = ServiceProcess(env, tiers, tmp_path, name="b")
        services = [a, b]
        stream: asyncio.Task[None] | None = None
        frozen = False
        try:
            async with (
                OutcomeFollower(settings) as follower,
                OutcomeFollower(settings, isolation_level="read_uncommitted") as uncommitted,
            ):

                def counts() -> str:
                    return (
                        f"results per input partition: read_committed {follower.by_source_partition()}, "
                        f"read_uncommitted {uncommitted.by_source_partition()}"
                    )

                a.start()
                b.start()

                shared = await follower.wait(
                    lambda: split_between([a, b], all_partitions), timeout_s=TAKEOVER_WAIT_S
                )
                assert shared, logs_of(services)
                a_parts = a.assignment() or set()
                stream = asyncio.create_task(feed.run())

                assert await follower.wait(
                    lambda: follower.records >= FREEZE_AFTER_OUTCOMES, timeout_s=FINISH_WAIT_S
                ), f"only {follower.records} outcomes\n{logs_of(services)}"
                assert a.proc is not None
                a.proc.send_signal(signal.SIGSTOP)
                frozen = True
                a_assignments = len(a.assignments())
                done_before_freeze = follower.ids_from(a_parts)
                print(f"froze a (partitions {sorted(a_parts)}) after {follower.records} outcomes")

                assert await follower.wait(
                    lambda: b.assignment() == all_partitions, timeout_s=TAKEOVER_WAIT_S
                ), f"b did not take over a's partitions\n{logs_of([b])}"
                by_b = len(follower.ids_from(a_parts))
                assert await follower.wait(
                    lambda: len(follower.ids_from(a_parts)) > by_b, timeout_s=TAKEOVER_WAIT_S
                ), f"b answered nothing of a's partitions; {counts()}\n{logs_of([b])}"

                a.proc.send_signal(signal.SIGCONT)
                frozen = False
                print("resumed a")
                assert await follower.wait(
                    lambda: len(a.assignments()) > a_assignments or not a.alive(),
                    timeout_s=TAKEOVER_WAIT_S,
                ), f"a did not rejoin the group\n{logs_of(services)}"
                assert a.alive(), f"a died after it was resumed\n{logs_of([a])}"
                rejoined_with = a.assignment() or set()
                assert rejoined_with, f"a rejoined with no partition\n{logs_of(services)}"
                outcomes_at_rejoin = follower.ids_from(rejoined_with)
                # the stream goes on until a has answered jobs of its partitions again
                await follower.wait(
                    lambda: len(follower.ids_from(rejoined_with) - outcomes_at_rejoin) >= AFTER_REJOIN_JOBS
                    or stream.done(),
                    timeout_s=FINISH_WAIT_S,
                )
                feed.stop.set()
                await asyncio.wait_for(stream, timeout=FINISH_WAIT_S)

                ids = {j["id"] for j in feed.sent}
                assert await follower.wait_for_ids(ids, timeout_s=FINISH_WAIT_S), (
                    f"{len(ids - follower.ids())} ids without outcome; {counts()}\n{logs_of(services)}"
                )
                processed_after_rejoin = follower.ids_from(rejoined_with) - outcomes_at_rejoin
                for s in services:
                    assert s.alive(), f"{s.log_path.name} died\n{logs_of([s])}"
                    code = await stop_gracefully(s, SHUTDOWN_TIMEOUT_S + CLOSE_MARGIN_S)
                    assert code == 0, f"SIGTERM exit code {code}\n{logs_of([s])}"
        finally:
            if frozen and a.proc is not None:
                a.proc.send_signal(signal.SIGCONT)
            if stream is not None and not stream.done():
                stream.cancel()
            for s in services:
                s.ensure_stopped()

    outcomes = await read_outcomes(settings)
    assert not outcomes.dead, list(outcomes.dead.items())[:3]
    assert set(outcomes.results) == ids, f"lost: {sorted(ids - set(outcomes.results))[:5]}"
    for j in feed.sent:
        expected = answer_for(j["variables"]["text"])
        assert all(r["output"] == expected for r in outcomes.results[j["id"]]), j["id"]
    assert processed_after_rejoin, "nothing was answered on a's partitions after it rejoined"
    dups = outcomes.duplicate_count()
    a_log = a.log_path.read_text(errors="replace")
    fenced = a_log.count("was fenced (")
    unretrieved = a_log.count("exception was never retrieved")
    if guarantee == "exactly_once":
        assert dups == 0, f"duplicates visible to read_committed: {outcomes.duplicates()}"
        assert done_before_freeze <= set(outcomes.results)
    print(
        f"{guarantee} zombie: {len(ids)} jobs, {dups} duplicates; a rejoined with partitions "
        f"{sorted(rejoined_with)}, {len(processed_after_rejoin)} answered there after the rejoin; "
        f"a's log: {fenced} fenced partitions, {unretrieved} unretrieved-exception errors"
    )
