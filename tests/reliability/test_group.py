"""Two service processes in one consumer group; SIGTERM one mid-run: the other takes over.

Both `promptbus run` processes share env and group. Jobs arrive as a steady stream (~50/s for
~12 s, batched and unbatched mixed) so the run is under way when one process is stopped.
The stopped process must drain, commit and exit 0 within its shutdown timeout; the survivor
takes over its partitions and finishes the stream. Nothing is lost (at_least_once), and
nothing the stopped process had finished before SIGTERM is redone by the survivor (it
committed). Duplicates are counted and printed.
"""

from __future__ import annotations

import asyncio
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

JOBS = 600
PARTITIONS = 4
#: the stream: CHUNK jobs every CHUNK_INTERVAL_S
CHUNK = 30
CHUNK_INTERVAL_S = 0.6
#: once this many outcomes are in, SIGTERM goes out STOP_DELAY_S after the next chunk is acked,
#: so a fresh chunk is in flight to drain
STOP_AFTER_OUTCOMES = 100
STOP_DELAY_S = 0.1
SHUTDOWN_TIMEOUT_S = 10.0
#: closing the Kafka and HTTP clients after the drain
CLOSE_MARGIN_S = 10.0
JOIN_WAIT_S = 60.0
FINISH_WAIT_S = 120.0

async def test_sigterm_one_of_two_the_other_takes_over(kafka_bootstrap: str, tmp_path: Path) -> None:
    env = service_env(
        kafka_bootstrap, partitions=PARTITIONS, PROMPTBUS_SHUTDOWN_TIMEOUT_S=SHUTDOWN_TIMEOUT_S
    )
    settings = settings_from_env(env)
    await create_topics(settings)
    jobs = mixed_jobs(JOBS)
    ids = {j["id"] for j in jobs}
    all_partitions = set(range(PARTITIONS))

    with run_simulator(SimulatorConfig(latency_ms=150, jitter_ms=50, seed=7)) as base_url:
        tiers = tier_file_dict(base_url + "/v1", max_items=5)
        a = ServiceProcess(env, tiers, tmp_path, name="a")
        b = ServiceProcess(env, tiers, tmp_path, name="b")
        services = [a, b]
        stream: asyncio.Task[None] | None = None
        try:
            async with OutcomeFollower(settings) as follower:
                a.start()
                b.start()

                shared = await follower.wait(
                    lambda: split_between([a, b], all_partitions), timeout_s=JOIN_WAIT_S
                )
                assert shared, logs_of(services)
                a_parts = a.assignment()
                assert a_parts is not None
                feed = JobStream(settings, jobs, CHUNK, CHUNK_INTERVAL_S)
                stream = asyncio.create_task(feed.run())

                assert await follower.wait(
                    lambda: follower.records >= STOP_AFTER_OUTCOMES or stream.done(), timeout_s=FINISH_WAIT_S
                ), f"only {follower.records} outcomes\n{logs_of(services)}"
                chunks = feed.chunks
                await follower.wait(lambda: feed.chunks > chunks or stream.done(), timeout_s=FINISH_WAIT_S)
                if stream.done():
                    stream.result()  # re-raise what failed the stream
                    pytest.fail("the stream ended before the stop: not mid-run (tune the pacing)")
                await asyncio.sleep(STOP_DELAY_S)
                done_before_stop = follower.ids_from(a_parts)
                code = await stop_gracefully(a, SHUTDOWN_TIMEOUT_S + CLOSE_MARGIN_S)
                assert code == 0, f"SIGTERM exit code {code}\n{logs_of([a])}"
                done_by_exit = follower.ids_from(a_parts)
                print(
                    f"SIGTERM of a (partitions {sorted(a_parts)}) after {follower.records} outcomes: "
                    f"exit {code}; {len(done_before_stop)} of its jobs done at SIGTERM, "
                    f"{len(done_by_exit)} at exit (drained {len(done_by_exit - done_before_stop)})"
                )

                assert await follower.wait(
                    lambda: b.assignment() == all_partitions, timeout_s=JOIN_WAIT_S
                ), f"the survivor did not take over every partition\n{logs_of([b])}"
                await asyncio.wait_for(stream, timeout=FINISH_WAIT_S)
                assert await follower.wait_for_ids(ids, timeout_s=FINISH_WAIT_S), (
                    f"{len(ids - follower.ids())} ids without outcome\n{logs_of(services)}"
                )
                taken_over = follower.ids_from(a_parts) - done_by_exit
                code_b = await stop_gracefully(b, SHUTDOWN_TIMEOUT_S + CLOSE_MARGIN_S)
                assert code_b == 0, f"SIGTERM exit code {code_b}\n{logs_of([b])}"
        finally:
            if stream is not None and not stream.done():
                stream.cancel()
            for s in services:
                s.ensure_stopped()

    outcomes = await read_outcomes(settings)
    assert not outcomes.dead, list(outcomes.dead.items())[:3]
    assert set(outcomes.results) == ids, f"lost: {sorted(ids - set(outcomes.results))[:5]}"
    for j in jobs:
        expected = answer_for(j["variables"]["text"])
        assert all(r["output"] == expected for r in outcomes.results[j["id"]]), j["id"]
    assert taken_over, "the survivor answered none of the stopped process's partitions' jobs"
    # the stopped process committed what it finished: the survivor redid none of it
    redone = sorted(jid for jid in done_before_stop if len(outcomes.results[jid]) > 1)
    assert not redone, f"{len(redone)} jobs finished before SIGTERM were redone, e.g. {redone[:5]}"
    dups = outcomes.duplicate_count()
    print(
        f"two processes, SIGTERM one: {len(jobs)} jobs, {dups} duplicates; the survivor answered "
        f"{len(taken_over)} jobs of the stopped process's partitions"
    )
