"""Records promptbus produces, and the headers every one of them carries."""

from __future__ import annotations

from typing import NamedTuple

# aiokafka's own NamedTuple: its transactional API checks isinstance, so we key every map by it
from aiokafka.structs import TopicPartition

__all__ = ["OutRecord", "SourceOffset", "TopicPartition"]

SOURCE_HEADER = "promptbus-source"
ERROR_KIND_HEADER = "promptbus-error-kind"
TRACEPARENT_HEADER = "traceparent"


class SourceOffset(NamedTuple):
    """Where an input record came from: its topic-partition (every map along a record's way is
    keyed by it, so intake hands over the one aiokafka gave, not a copy) and its offset.

    A NamedTuple, as every record-level value here: one is made per record, and a tuple is
    built in C."""

    tp: TopicPartition
    offset: int

    @property
    def topic(self) -> str:
        return self.tp.topic

    @property
    def partition(self) -> int:
        return self.tp.partition

    def header_value(self) -> bytes:
        """`topic/partition/offset`, the source header's value."""
        tp = self.tp
        prefix = _HEADER_PREFIXES.get(tp)
        if prefix is None:
            prefix = _HEADER_PREFIXES[tp] = f"{tp.topic}/{tp.partition}/".encode()
        return prefix + b"%d" % self.offset


#: "topic/partition/" per partition seen: every record of a partition starts its source
#: header alike (one entry per partition this process ever read)
_HEADER_PREFIXES: dict[TopicPartition, bytes] = {}


class OutRecord(NamedTuple):
    """One record to produce: topic, key, value bytes and headers."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()

    @property
    def size_bytes(self) -> int:
        return len(self.value or b"") + len(self.key or b"")
