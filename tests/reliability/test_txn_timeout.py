"""exactly_once: a transaction that outlives `transaction_timeout_s` (real broker).

The broker aborts such a transaction and fences its producer, and tells the producer exactly
what it tells a zombie whose partition moved: ProducerFenced. Here the instance still owns
the partition. The sink drops the partition's uncommitted outcomes and asks the group for a
new assignment; the partition comes back with a fresh producer and is read again from its
committed offset. Before that, the partition kept being read and answered but never
committed again (until some unrelated rebalance), and its outcomes piled up in memory.

The stall is injected where a slow commit would stall: the partition's real producer waits
inside its open transaction, past the timeout, before adding the input offset to it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from consumer.kafka.sink import ExactlyOnceSink
from consumer.testing.cluster import broker_config
from consumer.testing.harness import (
    InProcessService,
    job,
    produce,
    service_env,
    settings_from_env,
    tier_file_dict,
    wait_for_outcomes,
)
from consumer.testing.simulator import SimulatorConfig, SimulatorServer, answer_for

pytestmark = pytest.mark.integration

TXN_TIMEOUT_S = 1.0
#: how often the broker looks for timed-out transactions
CLEANUP_INTERVAL = "transaction.abort.timed.out.transaction.cleanup.interval.ms"
JOBS = 120


async def test_a_timed_out_transaction_gets_its_partition_assigned_afresh(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = settings_from_env(
        service_env(
            kafka_bootstrap,
            partitions=2,
            guarantee="exactly_once",
            PROMPTBUS_TRANSACTION_TIMEOUT_S=TXN_TIMEOUT_S,
        )
    )
    first = [job(i, batch=True) for i in range(JOBS)]
    second = [job(i, batch=True) for i in range(JOBS, 2 * JOBS)]
    # past the timeout and the broker's next look for timed-out transactions: always aborted
    stall_s = TXN_TIMEOUT_S + int(await broker_config(kafka_bootstrap, CLEANUP_INTERVAL)) / 1000 + 1.0
    caplog.set_level(logging.INFO, logger="consumer")
    async with SimulatorServer(SimulatorConfig(seed=1)) as base_url:
        service = InProcessService(settings, tier_file_dict(base_url + "/v1", max_items=10))
        async with service:
            await produce(settings, first)
            done = await wait_for_outcomes(settings, {j["id"] for j in first}, timeout_s=60)
            assert set(done.results) == {j["id"] for j in first}, "the service did not start answering"

            sink = service.pipeline._sink
            assert isinstance(sink, ExactlyOnceSink)
            stalled_tp, producer = next(iter(sorted(sink._producers.items())))
            fenced: list[BaseException] = []
            add_offsets = producer.send_offsets_to_transaction

            async def stall_then_add_offsets(*args: Any, **kwargs: Any) -> Any:
                producer.send_offsets_to_transaction = add_offsets  # stall once
                await asyncio.sleep(stall_s)
                try:
                    return await add_offsets(*args, **kwargs)
                except BaseException as exc:
                    fenced.append(exc)
                    raise

            producer.send_offsets_to_transaction = stall_then_add_offsets
            await produce(settings, second)
            ids = {j["id"] for j in first + second}
            outcomes = await wait_for_outcomes(settings, ids, timeout_s=90)
            replaced = sink._producers.get(stalled_tp)

    assert [type(e).__name__ for e in fenced] == ["ProducerFenced"], (
        f"the broker did not fence the stalled transaction: {fenced}"
    )
    missing = ids - set(outcomes.results)
    assert not missing, f"{len(missing)} jobs never got a committed result, e.g. {sorted(missing)[:5]}"
    assert not outcomes.dead, list(outcomes.dead.items())[:3]
    assert outcomes.duplicates() == {}, "a read_committed reader saw a job twice"
    for j in first + second:
        assert outcomes.results[j["id"]][0]["output"] == answer_for(j["variables"]["text"]), j["id"]
    assert replaced is not None and replaced is not producer, "the partition has no new producer"
    messages = [r.getMessage() for r in caplog.records]
    assert any("asking the group for a new assignment" in m for m in messages), messages[-20:]
