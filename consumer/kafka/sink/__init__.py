"""Delivery: makes each job's outcome durable, then commits its input offset.

    at_least_once  `AtLeastOnceSink`: one idempotent producer (acks=all). An offset becomes
                   committable when the outcomes of it and of every offset below it are acked
                   (the contiguous watermark of `OffsetTracker`); a commit loop commits it,
                   with the offsets whose outcomes are acked above it (a `CommitPoint`: the
                   intake writes them into the commit's offset metadata, so a new owner of the
                   partition skips them instead of doing them again).
    exactly_once   `ExactlyOnceSink`: one transactional producer per input partition
                   (transactional.id = group.topic.partition, so a restarted or rebalanced owner
                   fences the zombie). Outcomes wait in memory until their offsets are contiguous;
                   then outcomes and the input offset commit in ONE transaction, so a
                   read_committed reader never sees an outcome whose input will be read again.
                   Its commits carry no finished offsets: nothing above the watermark has a
                   committed outcome yet (those outcomes wait in memory).

A `Ticket` is issued per input record on intake; it carries the partition's assignment
epoch, so completions that arrive after the partition was revoked are dropped.

A rebalance's revoke commits what is durable and holds new outcomes and commits until the
assignment; then a kept partition goes on, and a lost one is forgotten, even when the
revoke's commit failed (the group moved on: the new owner reads from the last committed
offset), its held and late outcomes dropped. A transactional producer fenced by a
newer owner of its partition (this instance is a zombie) drops that partition's uncommitted
outcomes and leaves the other partitions committing.
"""

from __future__ import annotations

from consumer.kafka.sink.at_least_once import AtLeastOnceSink
from consumer.kafka.sink.base import COMMIT_INTERVAL_S, COMMIT_TIMEOUT_S, CommitFn, OutcomeSink, Ticket
from consumer.kafka.sink.exactly_once import ExactlyOnceSink
from consumer.kafka.sink.record_batch import (
    PRODUCER_BATCH_BYTES,
    ProducerFactory,
    kafka_producer_factory,
    produce_record_batches,
)

__all__ = [
    "COMMIT_INTERVAL_S",
    "COMMIT_TIMEOUT_S",
    "PRODUCER_BATCH_BYTES",
    "AtLeastOnceSink",
    "CommitFn",
    "ExactlyOnceSink",
    "OutcomeSink",
    "ProducerFactory",
    "Ticket",
    "kafka_producer_factory",
    "produce_record_batches",
]
