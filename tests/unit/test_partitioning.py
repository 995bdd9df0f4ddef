"""Our murmur2 partitioning must give every key the partition aiokafka's (and Java's) gives it."""

from __future__ import annotations

from aiokafka.partitioner import DefaultPartitioner
from aiokafka.partitioner import murmur2 as reference_murmur2
from hypothesis import given, settings
from hypothesis import strategies as st

from consumer.kafka.partitioning import murmur2, partition_for


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=300))
def test_murmur2_equals_the_reference(data: bytes) -> None:
    assert murmur2(data) == reference_murmur2(data)


@settings(max_examples=500, deadline=None)
@given(st.binary(min_size=1, max_size=64), st.integers(1, 64))
def test_keyed_records_land_where_the_default_partitioner_puts_them(key: bytes, count: int) -> None:
    partitions = list(range(count))
    assert partition_for(key, partitions) == DefaultPartitioner()(key, partitions, partitions)


def test_known_java_values() -> None:
    # Kafka's own test vectors (clients/.../UtilsTest.testMurmur2)
    cases = {
        b"21": -973932308,
        b"foobar": -790332482,
        b"a-little-bit-long-string": -985981536,
        b"a-little-bit-longer-string": -1486304829,
        b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
        b"abc": 479470107,
    }
    for data, java_int in cases.items():
        assert murmur2(data) == java_int & 0xFFFFFFFF


def test_keyless_records_go_to_one_of_the_partitions() -> None:
    assert {partition_for(None, [3, 5]) for _ in range(200)} == {3, 5}
