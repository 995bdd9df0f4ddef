"""Offline mode: jobs with `mode: offline` go through the provider's Batch API.

    OfflineCollector  collects offline jobs per tier (up to `offline.max_items` or
                      `offline.collect_s`), submits them as one provider batch, writes the batch
                      id and its members (the full jobs) to the compacted batches topic, and only
                      when that record is acknowledged lets the members' input offsets commit.
                      Under a tier's `offline.max_enqueued_tokens` it cuts a collection into
                      shards that fit and submits each once the unfinished batches of the tier
                      (every instance's: it follows the batches topic) leave it room.
    BatchTracker      owns polling. It reads the batches topic (one partition) through a
                      `TopicReader` of its own consumer group, so exactly one instance tracks at
                      a time and a restarted or surviving instance takes over: on assignment it
                      reads the topic from the beginning (latest record per batch), polls each
                      open batch every `poll_s`,
                      publishes one result or dead letter per member when the batch ends, then a
                      tombstone for the batch. In exactly_once mode those records and the
                      tombstone commit in one transaction. A batch the provider failed for its
                      enqueued token limit is held, and submitted again (its record replaced by
                      the new batch's) once room frees: its jobs are never dead-lettered for it.

What each member of a finished batch ends as is the core's decision
(`consumer.core.offline.item_outcome`), and so is what fits under an enqueued token limit;
this package performs them: `collector.py`, `tracker.py`, and `records.py` (the batches topic's
records and the outcome records of a finished batch).
"""

from consumer.runtime.offline.collector import RECORD_SEEN_S, ROOM_CHECK_S, OfflineCollector
from consumer.runtime.offline.records import (
    batch_key,
    batch_record,
    count_offline_usage,
    observe_offline_latency,
    offline_request,
    outcome_records,
    read_batch_record,
)
from consumer.runtime.offline.tracker import BatchTracker

__all__ = [
    "RECORD_SEEN_S",
    "ROOM_CHECK_S",
    "BatchTracker",
    "OfflineCollector",
    "batch_key",
    "batch_record",
    "count_offline_usage",
    "observe_offline_latency",
    "offline_request",
    "outcome_records",
    "read_batch_record",
]
