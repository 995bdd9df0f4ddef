"""`maker(cls)` makes what calling the NamedTuple class makes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from consumer.core.tuples import maker
from consumer.core.window import PackKey
from consumer.kafka.records import OutRecord, SourceOffset, TopicPartition
from consumer.kafka.sink import Ticket


@given(st.text(), st.integers(0, 1000), st.integers(0, 2**40), st.integers(0, 5))
def test_maker_equals_the_class_call(topic: str, partition: int, offset: int, epoch: int) -> None:
    source = SourceOffset(TopicPartition(topic, partition), offset)
    made = maker(SourceOffset)((TopicPartition(topic, partition), offset))
    assert made == source and type(made) is SourceOffset and made.offset == offset
    ticket = maker(Ticket)((source, epoch))
    assert ticket == Ticket(source, epoch) and type(ticket) is Ticket and ticket.epoch == epoch
    record = maker(OutRecord)((topic, b"k", b"v", (("h", b"1"),)))
    assert record == OutRecord(topic, b"k", b"v", (("h", b"1"),)) and record.headers == (("h", b"1"),)
    key = maker(PackKey)(("t", "p", "v", "{}", "online", "default"))
    assert key == PackKey("t", "p", "v", "{}", "online", "default") and key.tenant == "default"
