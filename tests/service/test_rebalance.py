"""A rebalance in the middle of in-flight work, on the in-memory edges and on the real broker
(`make_bus`), and exactly_once across a scale-out (real broker: transactions).

One instance has every job in flight (its provider holds the answers) when a second one
joins the group. The sticky assignment moves half the partitions; then the answers come.
A kept partition's jobs are neither asked again nor lost; a moved partition's jobs are asked
again by their new owner and each gets one outcome: the old owner's answers to them, which
end after the loss, are dropped, never written.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from consumer.core.completion import Completion, CompletionRequest
from consumer.kafka.partitioning import partition_for
from consumer.providers.fake import FakeProvider, text_completion
from consumer.testing.harness import InProcessService, KafkaBus, job, tier_file_dict
from consumer.testing.simulator import answer_for, extract_input

PARTITIONS = 4
JOBS = 24
#: bounded waits: this many checks, WAIT_S apart
CHECKS, WAIT_S = 600, 0.05


class HeldProvider:
    """A provider per instance whose answers wait for one shared gate; counts what each asked."""

    def __init__(self, gate: asyncio.Event) -> None:
        self.gate = gate
        self.asked: Counter[str] = Counter()

    def provider(self) -> FakeProvider:
        async def held(request: CompletionRequest) -> Completion:
            text = extract_input(request.messages[-1].content)
            self.asked[text] += 1
            await self.gate.wait()
            return text_completion(answer_for(text))

        return FakeProvider(held, name="small")


def _tiers() -> dict[str, Any]:
    # every job its own request, all of them in flight at once
    limiter = {"algorithm": "aimd", "initial": 64, "min": 1, "max": 64}
    return tier_file_dict("http://127.0.0.1:9/v1", batching=False, limiter=limiter)


async def _until(check: Callable[[], bool]) -> bool:
    for _ in range(CHECKS):
        if check():
            return True
        await asyncio.sleep(WAIT_S)
    return check()


async def _rebalance_mid_flight(bus: Any) -> None:
    jobs = [job(i, batch=False) for i in range(JOBS)]
    text_of = {j["id"]: j["variables"]["text"] for j in jobs}
    partitions = list(range(PARTITIONS))
    partition_of = {j["variables"]["text"]: partition_for(j["id"].encode(), partitions) for j in jobs}
    gate = asyncio.Event()
    first, second = HeldProvider(gate), HeldProvider(gate)
    one = bus.service(_tiers(), providers={"small": first.provider()})
    async with one:
        await bus.produce(jobs)
        assert await _until(lambda: len(first.asked) == JOBS), "the first instance did not take every job"
        two = bus.service(_tiers(), providers={"small": second.provider()})
        async with two:
            # the moved partitions' jobs are read again by their new owner, from offset 0
            def moved_all_asked() -> bool:
                moved = {partition_of[text] for text in second.asked}
                wanted = {text for text, p in partition_of.items() if p in moved}
                return bool(moved) and set(second.asked) == wanted

            assert await _until(moved_all_asked), "the second instance did not take over a partition"
            gate.set()  # every answer comes now: the old owner's to the moved jobs too
            outcomes = await bus.wait_for_outcomes(set(text_of), timeout_s=60)
            # the old owner's answers to the moved jobs end after the loss: dropped, not written
            await _until(lambda: one.stats_snapshot()["dropped_late"] >= len(second.asked))
            dropped = one.stats_snapshot()["dropped_late"]
            per_partition = Counter(partition_of.values())
            wanted = [per_partition[p] for p in range(PARTITIONS)]
            for _ in range(CHECKS):  # bounded: until every outcome's offset is committed
                committed = [await bus.committed(p) for p in range(PARTITIONS)]
                if committed == wanted:
                    break
                await asyncio.sleep(WAIT_S)

    moved = {partition_of[text] for text in second.asked}
    assert len(moved) == PARTITIONS // 2, f"the sticky assignment moved {sorted(moved)}"
    assert outcomes.ids() == set(text_of) and not outcomes.dead
    assert outcomes.duplicates() == {}, "a job of a moved partition was written by both owners"
    for jid, (result, *_) in outcomes.results.items():
        assert result["output"] == answer_for(text_of[jid])
    assert all(n == 1 for n in first.asked.values()) and len(first.asked) == JOBS
    assert all(n == 1 for n in second.asked.values())
    kept_asked_again = [t for t in second.asked if partition_of[t] not in moved]
    assert kept_asked_again == [], "a kept partition's job was asked again"
    assert dropped == len(second.asked)
    assert committed == wanted


async def test_a_rebalance_mid_flight_redoes_only_the_moved_partitions(make_bus: Callable[..., Any]) -> None:
    await _rebalance_mid_flight(make_bus(partitions=PARTITIONS))


@pytest.mark.integration
async def test_exactly_once_across_a_scale_out(kafka_bootstrap: str) -> None:
    """The moved partitions' new producers fence the old owner's; its held outcomes go with
    its producers, uncommitted: a read_committed reader sees one result per job."""
    await _rebalance_mid_flight(KafkaBus(kafka_bootstrap, partitions=PARTITIONS, guarantee="exactly_once"))


def _instance(bus: KafkaBus, name: str, provider: FakeProvider) -> InProcessService:
    settings = bus.settings.model_copy(update={"instance_id": name})
    return InProcessService(settings, _tiers(), providers={"small": provider})


@pytest.mark.integration
async def test_static_membership_a_restart_within_the_session_is_no_rebalance(kafka_bootstrap: str) -> None:
    """Two instances with PROMPTBUS_INSTANCE_ID; one stops and starts again under the same
    name within the session: the group does not rebalance (the other one goes on untouched)
    and the restarted one is given its partitions back, reading on from their commits."""
    bus = KafkaBus(kafka_bootstrap, partitions=PARTITIONS)
    gate = asyncio.Event()
    gate.set()
    answers = HeldProvider(gate)
    jobs = [job(i, batch=False) for i in range(3 * JOBS)]
    ids = [j["id"] for j in jobs]
    stays = _instance(bus, "pod-1", answers.provider())
    async with stays:
        async with _instance(bus, "pod-0", answers.provider()):
            await bus.produce(jobs[:JOBS])
            await bus.wait_for_outcomes(set(ids[:JOBS]), timeout_s=60)
            before = stays.stats_snapshot()["rebalances"]
        await bus.produce(jobs[JOBS : 2 * JOBS])  # half of them wait for the restarted one
        restarted = _instance(bus, "pod-0", answers.provider())
        async with restarted:
            await bus.produce(jobs[2 * JOBS :])
            outcomes = await bus.wait_for_outcomes(set(ids), timeout_s=60)
            after = stays.stats_snapshot()["rebalances"]
            again = restarted.stats_snapshot()
    assert before >= 1  # the two joined one after the other
    assert after == before, "the restart rebalanced the group"
    assert again["rebalances"] == 0 and again["items_in"] > 0, "the restarted one got no partition back"
    assert outcomes.ids() == set(ids) and not outcomes.dead
    assert outcomes.duplicates() == {}
    assert all(n == 1 for n in answers.asked.values())
