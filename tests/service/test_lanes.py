"""Lanes end to end (the in-memory edges and the real broker): a bulk backlog pauses only its
own lane, interactive jobs overtake it, results carry their lane, stats count per lane."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime
from typing import Any

from consumer.testing.harness import job, tier_file_dict, until
from consumer.testing.simulator import SimulatorConfig, answer_for, run_simulator

BULK_JOBS = 300
BULK_MAX_INFLIGHT = 20
INTERACTIVE_JOBS = 10
#: requests of the tier at the provider at once
LIMITER_SLOTS = 2


def lane_tiers(base_url: str, jobs_topic: str) -> dict[str, Any]:
    """Two requests at a time at most; interactive on its own topic, bulk on the jobs topic."""
    tiers = tier_file_dict(base_url + "/v1", batching=False)
    tiers["tiers"]["small"]["limiter"] = {
        "algorithm": "fixed", "initial": LIMITER_SLOTS, "min": 1, "max": LIMITER_SLOTS
    }
    tiers["lanes"] = {
        "interactive": {"topic": jobs_topic + ".interactive", "max_wait_ms": 50},
        "bulk": {"topic": jobs_topic, "min_share": 0.1, "max_inflight": BULK_MAX_INFLIGHT},
    }
    return tiers


def _at(result: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(result["completed_at"].replace("Z", "+00:00"))


async def test_a_bulk_backlog_pauses_only_its_lane_and_interactive_jobs_overtake_it(
    make_bus: Callable[..., Any],
) -> None:
    bus = make_bus(partitions=2)
    jobs_topic = bus.settings.jobs_topic
    bulk = [job(i, batch=False) for i in range(BULK_JOBS)]
    interactive = [{**job(i, batch=False), "id": f"int-{i}"} for i in range(INTERACTIVE_JOBS)]
    with run_simulator(SimulatorConfig(latency_ms=50, capacity=2, seed=11)) as base_url:
        async with bus.service(lane_tiers(base_url, jobs_topic)) as svc:
            await bus.produce(bulk)
            lanes = svc.stats.lanes
            peak_bulk = 0

            def bulk_paused() -> bool:
                nonlocal peak_bulk
                peak_bulk = max(peak_bulk, lanes["bulk"].inflight)
                return lanes["bulk"].paused == 1

            assert await until(bulk_paused, 30), svc.stats_snapshot()["lanes"]
            await bus.produce(interactive, topic=jobs_topic + ".interactive")
            int_ids = {j["id"] for j in interactive}
            # while the interactive jobs are served: is the bulk lane paused, the interactive not?
            seen_paused: set[tuple[str, int]] = set()

            async def watch_lanes() -> None:
                while True:
                    seen_paused.update((name, lane.paused) for name, lane in lanes.items())
                    await asyncio.sleep(0.02)

            watching = asyncio.create_task(watch_lanes())
            try:
                outcomes = await bus.wait_for_outcomes(int_ids, timeout_s=30)
            finally:
                watching.cancel()
            assert int_ids <= set(outcomes.results), "an interactive job has no result"
            bulk_done = sum(1 for j in bulk if j["id"] in outcomes.results)
            assert bulk_done < BULK_JOBS, "the bulk backlog drained before the interactive jobs were answered"
            assert ("bulk", 1) in seen_paused and ("interactive", 1) not in seen_paused, seen_paused
            all_ids = {j["id"] for j in bulk} | int_ids
            outcomes = await bus.wait_for_outcomes(all_ids, timeout_s=90)
            # the gauges follow the acks (an outcome is readable before its ack is counted)
            settled = await until(lambda: lanes["bulk"].paused == 0 and lanes["bulk"].inflight == 0, 10)
            snapshot = svc.stats_snapshot()
            assert settled, snapshot["lanes"]
    assert set(outcomes.results) == all_ids and not outcomes.dead
    for j in bulk + interactive:
        (r,) = outcomes.results[j["id"]]
        assert r["output"] == answer_for(j["variables"]["text"])
        assert r["lane"] == ("interactive" if j["id"].startswith("int-") else "bulk")
    # once the interactive jobs were in, they went first: between the first interactive answer
    # and the last, only bulk requests already at the provider (the limiter's slots) ended
    first_interactive = min(_at(outcomes.results[i][0]) for i in int_ids)
    last_interactive = max(_at(outcomes.results[i][0]) for i in int_ids)
    overtaken = [
        j["id"] for j in bulk if first_interactive < _at(outcomes.results[j["id"]][0]) < last_interactive
    ]
    assert len(overtaken) <= LIMITER_SLOTS, overtaken
    # a poll takes at most the room left under the bound
    assert peak_bulk <= BULK_MAX_INFLIGHT
    assert snapshot["lanes"]["interactive"]["results"] == INTERACTIVE_JOBS
    assert snapshot["lanes"]["bulk"]["results"] == BULK_JOBS
    assert snapshot["lanes"]["bulk"]["paused"] == 0 and snapshot["lanes"]["bulk"]["inflight"] == 0


async def test_without_lanes_results_carry_the_default_lane(make_bus: Callable[..., Any]) -> None:
    bus = make_bus(partitions=2)
    jobs = [job(i, batch=i % 2 == 0) for i in range(20)]
    with run_simulator(SimulatorConfig(latency_ms=5, seed=12)) as base_url:
        async with bus.service(tier_file_dict(base_url + "/v1")) as svc:
            await bus.produce(jobs)
            outcomes = await bus.wait_for_outcomes({j["id"] for j in jobs}, timeout_s=30)
            snapshot = svc.stats_snapshot()
    assert {r[0]["lane"] for r in outcomes.results.values()} == {"default"}
    assert snapshot["lanes"]["default"]["results"] == len(jobs)


async def test_a_record_rejected_in_a_lane_counts_in_that_lanes_dead_letters(
    make_bus: Callable[..., Any],
) -> None:
    """The lane lines count dead letters as the totals do: a job of an unknown tier read from
    the interactive lane's topic is a dead letter of that lane."""
    bus = make_bus(partitions=2)
    jobs_topic = bus.settings.jobs_topic
    answered = [job(i, batch=False) for i in range(3)]
    unknown = {**job(99, batch=False), "id": "unknown-tier", "tier": "nope"}
    with run_simulator(SimulatorConfig(latency_ms=5, seed=13)) as base_url:
        async with bus.service(lane_tiers(base_url, jobs_topic)) as svc:
            await bus.produce([unknown], topic=jobs_topic + ".interactive")
            await bus.produce(answered)
            expected = {j["id"] for j in answered} | {"unknown-tier"}
            outcomes = await bus.wait_for_outcomes(expected, timeout_s=30)
            snapshot = svc.stats_snapshot()
    assert set(outcomes.dead) == {"unknown-tier"}
    assert outcomes.dead["unknown-tier"][0]["error"]["kind"] == "unknown_tier"
    assert snapshot["dead_letters"] == {"unknown_tier": 1}
    interactive, bulk = snapshot["lanes"]["interactive"], snapshot["lanes"]["bulk"]
    assert (interactive["results"], interactive["dead_letters"]) == (0, 1)
    assert (bulk["results"], bulk["dead_letters"]) == (len(answered), 0)


async def test_the_stats_after_a_stop_count_what_the_drain_committed(make_bus: Callable[..., Any]) -> None:
    """Stopped while its requests run, the service finishes them in the drain; its last stats
    (what `promptbus stats` reads after the stop) count them answered, none in flight."""
    bus = make_bus(partitions=2)
    jobs = [job(i, batch=False) for i in range(6)]
    with run_simulator(SimulatorConfig(latency_ms=400, seed=14)) as base_url:
        svc = bus.service(tier_file_dict(base_url + "/v1"))
        async with svc:
            await bus.produce(jobs)
            running = await until(lambda: svc.stats_snapshot()["inflight"] == len(jobs), 30)
            assert running, svc.stats_snapshot()
        snapshot = svc.stats_snapshot()
    outcomes = await bus.outcomes()
    assert set(outcomes.results) == {j["id"] for j in jobs}
    assert (snapshot["items_in"], snapshot["results"]) == (len(jobs), len(jobs))
    assert snapshot["inflight"] == 0, snapshot
    assert snapshot["lanes"]["default"]["inflight"] == 0, snapshot["lanes"]
