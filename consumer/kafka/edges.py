"""The service's edges to Kafka, as one Protocol (`ServiceEdges`) and its real implementation
(`KafkaEdges`: aiokafka's admin client, consumers and producers on the brokers the settings name).

`consumer.testing.memory.MemoryEdges` is the fake: it keeps every topic in memory, so tests run
the whole service, its real sink included, without a broker. The composition root
(`consumer.app`) builds the service's Kafka parts through whichever it is given.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from consumer.kafka.admin import ensure_topics, max_record_bytes
from consumer.kafka.assignment import Assignment
from consumer.kafka.board import KafkaTopicFollower, TopicFollower
from consumer.kafka.clients import read_latest
from consumer.kafka.intake import JobIntake, KafkaIntake
from consumer.kafka.sink import kafka_producer_factory
from consumer.kafka.topicreader import KafkaTopicReader, TopicReader
from consumer.settings import Settings

__all__ = ["KafkaEdges", "ServiceEdges", "ServiceIntake"]


class ServiceIntake(JobIntake, Protocol):
    """The intake the sinks commit through (`rejoin`: ask the group for a new assignment)."""

    def rejoin(self) -> None: ...


class ServiceEdges(Protocol):
    """The service's edges to Kafka: topics, the jobs intake, producers, the offline tracker's
    reader, the followers of compacted topics (the batches topic, the group's boards)."""

    async def ensure_topics(
        self,
        settings: Settings,
        lane_topics: Sequence[str] = (),
        enriched_topics: Sequence[str] = (),
        output_topics: Sequence[str] = (),
    ) -> dict[str, str]: ...

    async def max_record_bytes(self, settings: Settings, topics: list[str]) -> dict[str, int]: ...

    def intake(
        self, settings: Settings, client_id: str, owned: Assignment, topics: Sequence[str] = ()
    ) -> ServiceIntake:
        """The consumer-group member reading `topics` (the lanes'; none: the jobs topic)."""
        ...

    def producer(self, settings: Settings, client_id: str, transactional_id: str | None) -> Any: ...

    def topic_reader(self, settings: Settings, client_id: str, topic: str, group_id: str) -> TopicReader:
        """`topic` read by one member of `group_id` at a time, from its beginning."""
        ...

    def follower(
        self, settings: Settings, client_id: str, topic: str, *, follow: bool = True
    ) -> TopicFollower:
        """Every key's latest record of the compacted `topic`, read by every instance alike
        (a group's board, `consumer.kafka.board`: fleet quotas, tenants' budgets); `follow`:
        kept current as records come (False: read at start and when caught up)."""
        ...

    async def read_latest(self, settings: Settings, topic: str) -> dict[bytes, bytes]:
        """The latest value of every key of a compacted topic."""
        ...


class KafkaEdges:
    """The real edges: aiokafka's admin client, consumer and producers."""

    async def ensure_topics(
        self,
        settings: Settings,
        lane_topics: Sequence[str] = (),
        enriched_topics: Sequence[str] = (),
        output_topics: Sequence[str] = (),
    ) -> dict[str, str]:
        return await ensure_topics(
            settings, lane_topics=lane_topics, enriched_topics=enriched_topics, output_topics=output_topics
        )

    async def max_record_bytes(self, settings: Settings, topics: list[str]) -> dict[str, int]:
        return await max_record_bytes(settings, topics)

    def intake(
        self, settings: Settings, client_id: str, owned: Assignment, topics: Sequence[str] = ()
    ) -> KafkaIntake:
        return KafkaIntake(settings, client_id=client_id, assignment=owned, topics=topics)

    def producer(self, settings: Settings, client_id: str, transactional_id: str | None) -> Any:
        return kafka_producer_factory(settings, client_id)(transactional_id=transactional_id)

    def topic_reader(self, settings: Settings, client_id: str, topic: str, group_id: str) -> KafkaTopicReader:
        return KafkaTopicReader(settings, topic=topic, group_id=group_id, client_id=client_id)

    def follower(
        self, settings: Settings, client_id: str, topic: str, *, follow: bool = True
    ) -> KafkaTopicFollower:
        return KafkaTopicFollower(settings, topic=topic, client_id=client_id, follow=follow)

    async def read_latest(self, settings: Settings, topic: str) -> dict[bytes, bytes]:
        return await read_latest(settings, topic)

