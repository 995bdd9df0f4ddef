"""Kafka's default partitioning of keyed records: Java's `Utils.murmur2`, made positive, modulo.

aiokafka ships the same function written byte by byte; the at-least-once sink picks a
partition for every outcome it batches, so this one reads the key's 4-byte words in one
`struct` call, which costs a fraction of the CPU per key (bench/README.md).
tests/unit/test_partitioning.py holds the two equal.
"""

from __future__ import annotations

import functools
import random
import struct
from collections.abc import Sequence

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


@functools.lru_cache(maxsize=64)
def _words(count: int) -> struct.Struct:
    return struct.Struct(f"<{count}I")


def murmur2(data: bytes) -> int:
    """MurmurHash2 (32-bit, seed 0x9747b28c) of `data`, as the Java client computes it."""
    length = len(data)
    h = _SEED ^ length
    count = length >> 2
    if count:
        for k in _words(count).unpack_from(data):
            k = (k * _M) & _MASK
            k ^= k >> 24
            h = ((h * _M) & _MASK) ^ ((k * _M) & _MASK)
    tail = length & 3
    if tail:
        base = length - tail
        if tail == 3:
            h ^= data[base + 2] << 16
        if tail >= 2:
            h ^= data[base + 1] << 8
        h = ((h ^ data[base]) * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    return h ^ (h >> 15)


def partition_for(key: bytes | None, partitions: Sequence[int]) -> int:
    """The partition the default partitioner gives `key` (a keyless record: any of them)."""
    if len(partitions) == 1:
        return partitions[0]
    if key is None:
        return random.choice(partitions)
    return partitions[(murmur2(key) & 0x7FFFFFFF) % len(partitions)]
