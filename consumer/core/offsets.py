"""Commit watermarks for out-of-order completion (DESIGN.md "Delivery semantics").

Jobs of one partition finish in any order (batching, retries), but Kafka commits one
position per partition: "everything before this offset is done". `OffsetTracker` keeps, per
partition, the offsets read and not yet finished, and yields the watermark: the lowest
unfinished tracked offset, or (when all are finished) the last tracked offset + 1. That is
the Kafka convention for a committed offset (the next offset to read), so committing it
never skips an unfinished job. Offsets need not be contiguous: compaction and transaction
markers leave gaps, and a gap is never waited for.

Offsets must be tracked in increasing order per partition (the order a consumer reads
them); `forget` a partition on revoke, after which late completions are ignored.

A slow job holds its partition's watermark back while the jobs after it finish; after a
crash all of those would be done again. So a commit also says which offsets above the
watermark are finished (`CommitPoint`), written into the commit's Kafka offset metadata
(`encode_done`, a string of at most `offset.metadata.max.bytes`), and the partition's next
owner skips what it names (`decode_done`). The text, versioned:

    pb1<kind><base>:<payload>:<crc32 of what precedes it, 8 hex digits>

`base` is the committed offset the text belongs to; `payload` is base64url (no padding) of
kind `r`: unsigned LEB128 varints gap, run, gap, run, ... (offsets from `base`: `gap` not
finished, then `run` finished; only the first gap may be 0), or kind `b`: a bitmap, bit i of
byte i // 8 (least significant first) set when `base + i` is finished. The shorter one is
written. What does not fit is left out from the high end: the text may name fewer finished
offsets than there are (they are done again after a crash), never one that is not finished.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from bisect import bisect_right
from collections import deque
from collections.abc import Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

__all__ = [
    "METADATA_MAX_CHARS",
    "CommitPoint",
    "DecodedDone",
    "DoneOffsets",
    "OffsetTracker",
    "decode_done",
    "encode_done",
]

#: the broker's default `offset.metadata.max.bytes` (the text is ASCII: a char is a byte)
METADATA_MAX_CHARS = 4096
METADATA_VERSION = "pb1"
#: the largest offset Kafka can hold (int64)
MAX_OFFSET = 2**63 - 1
_MAX_OFFSET_DIGITS = len(str(MAX_OFFSET))
_RUNS = "r"
_BITS = "b"
_B64_CHARS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


@dataclass(frozen=True, slots=True)
class DoneOffsets:
    """A set of finished offsets, held as sorted, disjoint, non-adjacent ranges [start, stop).

    Build it with `of` (offsets) or `of_ranges` (any ranges); a run of a million finished
    offsets costs one range.
    """

    ranges: tuple[tuple[int, int], ...] = ()
    _starts: tuple[int, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        prev_stop: int | None = None
        for start, stop in self.ranges:
            if stop <= start or (prev_stop is not None and start <= prev_stop):
                raise ValueError(f"ranges not sorted, disjoint, non-adjacent and non-empty: {self.ranges}")
            prev_stop = stop
        object.__setattr__(self, "_starts", tuple(start for start, _ in self.ranges))

    @classmethod
    def of(cls, offsets: Iterable[int]) -> DoneOffsets:
        """The set of these offsets (any order, repeats allowed)."""
        out: list[tuple[int, int]] = []
        for off in sorted(set(offsets)):
            if out and out[-1][1] == off:
                out[-1] = (out[-1][0], off + 1)
            else:
                out.append((off, off + 1))
        return cls(tuple(out))

    @classmethod
    def of_sorted(cls, offsets: list[int]) -> DoneOffsets:
        """The set of these strictly increasing offsets (what a tracker holds, in read order)."""
        ranges: list[tuple[int, int]] = []
        if offsets:
            start = prev = offsets[0]
            for off in offsets:
                if off > prev + 1:
                    ranges.append((start, prev + 1))
                    start = off
                prev = off
            ranges.append((start, prev + 1))
        return cls(tuple(ranges))

    @classmethod
    def of_ranges(cls, ranges: Iterable[tuple[int, int]]) -> DoneOffsets:
        """The union of these [start, stop) ranges (any order; empty ones are ignored)."""
        out: list[tuple[int, int]] = []
        for start, stop in sorted(r for r in ranges if r[1] > r[0]):
            if out and start <= out[-1][1]:
                out[-1] = (out[-1][0], max(out[-1][1], stop))
            else:
                out.append((start, stop))
        return cls(tuple(out))

    def __contains__(self, offset: object) -> bool:
        if not isinstance(offset, int):
            return False
        i = bisect_right(self._starts, offset) - 1
        return i >= 0 and offset < self.ranges[i][1]

    def __len__(self) -> int:
        return sum(stop - start for start, stop in self.ranges)

    def __bool__(self) -> bool:
        return bool(self.ranges)

    def __iter__(self) -> Iterator[int]:
        for start, stop in self.ranges:
            yield from range(start, stop)

    def union(self, other: DoneOffsets) -> DoneOffsets:
        """Offsets in either set."""
        if not other.ranges:
            return self
        if not self.ranges:
            return other
        return DoneOffsets.of_ranges(self.ranges + other.ranges)

    def from_offset(self, offset: int) -> DoneOffsets:
        """The offsets at or above `offset`."""
        i = bisect_right(self._starts, offset) - 1
        if i < 0:
            return self
        kept = [(max(start, offset), stop) for start, stop in self.ranges[i:] if stop > offset]
        return DoneOffsets(tuple(kept))

    def lowest(self, count: int) -> DoneOffsets:
        """The `count` lowest offsets (all of them when there are fewer)."""
        out: list[tuple[int, int]] = []
        left = count
        for start, stop in self.ranges:
            if left <= 0:
                break
            take = min(left, stop - start)
            out.append((start, start + take))
            left -= take
        return DoneOffsets(tuple(out))


NO_OFFSETS = DoneOffsets()


@dataclass(frozen=True, slots=True)
class DecodedDone:
    """What a commit's metadata says is finished; `reason` says why it was not read (else None)."""

    done: DoneOffsets
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class CommitPoint:
    """One partition's commit: the watermark and the offsets finished above it."""

    #: the offset to commit: the next one to read (Kafka's convention)
    offset: int
    #: offsets above `offset` whose outcomes are durable
    done: DoneOffsets
    #: the tracker's completion count when this was taken (so `mark_committed` knows what it covered)
    stamp: int = 0


def encode_done(base: int, done: DoneOffsets, max_chars: int = METADATA_MAX_CHARS) -> str:
    """The metadata text of a commit at `base` naming the finished offsets in `done`.

    Offsets below `base` are covered by the commit itself and left out. At most `max_chars`
    characters: when not all fit, the lowest ones that do (possibly none: "").
    """
    done = done.from_offset(base)
    if not done or max_chars <= 0:
        return ""
    whole = _fitting(base, done, max_chars)
    if whole is not None:
        return whole
    # The text grows with each offset added, so bisect the count of lowest offsets that fits.
    fits, too_many = 0, len(done)
    while too_many - fits > 1:
        mid = (fits + too_many) // 2
        if _fitting(base, done.lowest(mid), max_chars) is None:
            too_many = mid
        else:
            fits = mid
    return _fitting(base, done.lowest(fits), max_chars) or ""


def decode_done(base: int, text: str) -> DecodedDone:
    """The finished offsets a commit at `base` carries in its metadata `text`.

    Never raises: text that is empty, another tool's, another version, damaged, or written
    for another offset decodes to no offsets, with the reason (None for empty text).
    """
    if not text:
        return DecodedDone(NO_OFFSETS)
    if not text.startswith(METADATA_VERSION):
        if text.startswith("pb") and text[2:3].isdigit():
            return DecodedDone(NO_OFFSETS, f"unknown metadata version {text[:4]!r}")
        return DecodedDone(NO_OFFSETS, "not promptbus offset metadata")
    head, sep, crc = text.rpartition(":")
    if not sep or len(crc) != 8 or f"{zlib.crc32(head.encode('ascii', 'replace')):08x}" != crc:
        return DecodedDone(NO_OFFSETS, "checksum mismatch (damaged or truncated)")
    prefix, sep, payload = head.partition(":")
    kind, digits = prefix[len(METADATA_VERSION) :][:1], prefix[len(METADATA_VERSION) + 1 :]
    # an offset has at most MAX_OFFSET's digits (and int() refuses over 4,300 of them)
    if (
        not sep
        or kind not in (_RUNS, _BITS)
        or not digits.isascii()
        or not digits.isdigit()
        or len(digits) > _MAX_OFFSET_DIGITS
    ):
        return DecodedDone(NO_OFFSETS, "malformed header")
    if int(digits) != base:
        return DecodedDone(NO_OFFSETS, f"written for offset {int(digits)}, not the committed {base}")
    raw = _b64decode(payload)
    if raw is None:
        return DecodedDone(NO_OFFSETS, "payload is not base64url")
    ranges = _runs_decode(raw) if kind == _RUNS else _bits_decode(raw)
    if isinstance(ranges, str):
        return DecodedDone(NO_OFFSETS, ranges)
    if ranges and base + ranges[-1][1] - 1 > MAX_OFFSET:
        return DecodedDone(NO_OFFSETS, "offsets beyond the largest Kafka offset")
    return DecodedDone(DoneOffsets(tuple((base + a, base + b) for a, b in ranges)))


def _fitting(base: int, done: DoneOffsets, max_chars: int) -> str | None:
    """The shorter encoding of `done` (all at or above `base`) if it fits in max_chars, else None."""
    if not done:
        return ""
    rel = [(start - base, stop - base) for start, stop in done.ranges]
    texts = [_text(_RUNS, base, _runs_encode(rel))]
    # base64 makes 4 chars of 3 bytes: skip a bitmap that cannot fit (and never build a huge one)
    if (rel[-1][1] + 7) // 8 * 4 // 3 < max_chars:
        texts.append(_text(_BITS, base, _bits_encode(rel)))
    best = min(texts, key=len)
    return best if len(best) <= max_chars else None


def _text(kind: str, base: int, payload: bytes) -> str:
    head = f"{METADATA_VERSION}{kind}{base}:{base64.urlsafe_b64encode(payload).rstrip(b'=').decode('ascii')}"
    return f"{head}:{zlib.crc32(head.encode('ascii')):08x}"


def _b64decode(payload: str) -> bytes | None:
    data = payload.encode("ascii", "replace")
    if not data or len(data) % 4 == 1 or not set(data) <= _B64_CHARS:
        return None
    try:
        return base64.b64decode(data + b"=" * (-len(data) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        return None


def _runs_encode(rel: list[tuple[int, int]]) -> bytes:
    out = bytearray()
    append = out.append
    pos = 0
    for start, stop in rel:
        for n in (start - pos, stop - start):
            while n >= 0x80:  # LEB128: 7 bits a byte, the high bit says more follow
                append((n & 0x7F) | 0x80)
                n >>= 7
            append(n)
        pos = stop
    return bytes(out)


def _runs_decode(raw: bytes) -> list[tuple[int, int]] | str:
    numbers: list[int] = []
    n = shift = 0
    for byte in raw:
        n |= (byte & 0x7F) << shift
        shift += 7
        if byte & 0x80:
            if shift > 63:
                return "run length out of range"
            continue
        numbers.append(n)
        n = shift = 0
    if shift or len(numbers) % 2:
        return "incomplete run-length payload"
    ranges: list[tuple[int, int]] = []
    pos = 0
    for i in range(0, len(numbers), 2):
        gap, run = numbers[i], numbers[i + 1]
        if run == 0 or (gap == 0 and i > 0):
            return "run-length payload is not canonical"
        start = pos + gap
        pos = start + run
        if pos > MAX_OFFSET:
            return "run length out of range"
        ranges.append((start, pos))
    return ranges


def _bits_encode(rel: list[tuple[int, int]]) -> bytes:
    mask = 0
    for start, stop in rel:
        mask |= ((1 << (stop - start)) - 1) << start
    return mask.to_bytes((rel[-1][1] + 7) // 8, "little")


def _bits_decode(raw: bytes) -> list[tuple[int, int]] | str:
    if raw[-1] == 0:
        return "bitmap payload is not canonical"
    ranges: list[tuple[int, int]] = []
    for i, byte in enumerate(raw):
        if not byte:
            continue
        for j in range(8):
            if byte >> j & 1:
                off = i * 8 + j
                if ranges and ranges[-1][1] == off:
                    ranges[-1] = (ranges[-1][0], off + 1)
                else:
                    ranges.append((off, off + 1))
    return ranges


@dataclass(slots=True)
class _Partition:
    #: tracked offsets in read order, finished ones included until they reach the front
    order: deque[int] = field(default_factory=deque)
    #: tracked offsets not finished yet
    pending: set[int] = field(default_factory=set)
    #: finished offsets still in `order` (above the watermark): what a commit names, kept
    #: apart so a commit costs what is finished, not everything in flight
    done: set[int] = field(default_factory=set)
    last_tracked: int = -1
    #: the position last committed (or, before any commit, the first offset tracked)
    committed: int = -1
    #: the tracker's completion count at this partition's latest completion, and at the
    #: latest commit point taken that was then committed
    completed_stamp: int = 0
    committed_stamp: int = 0

    def watermark(self) -> int:
        # Finished offsets at the front no longer hold the watermark back: drop them.
        order, pending, done = self.order, self.pending, self.done
        while order and order[0] not in pending:
            done.discard(order.popleft())
        return order[0] if order else self.last_tracked + 1

    def done_above(self) -> DoneOffsets:
        """Finished offsets above the watermark (call `watermark` first: it trims the front)."""
        return DoneOffsets.of_sorted(sorted(self.done))


class OffsetTracker:
    """Per-partition commit watermarks; partitions are any hashable (e.g. TopicPartition).

    `committable` gives the watermarks that advanced; `commit_points` also the offsets
    finished above them, for commits that carry them (DESIGN.md "Delivery semantics").
    """

    def __init__(self) -> None:
        self._parts: dict[Hashable, _Partition] = {}
        #: completions so far, over all partitions: stamps what a commit point covered
        self._completions = 0

    def track(self, tp: Hashable, offset: int) -> None:
        """A record at `offset` was read from `tp` and is now in flight.

        Raises ValueError when `offset` is not above the last offset tracked for `tp`
        (a consumer reads in order; a seek back must `forget` the partition first).
        """
        part = self._parts.get(tp)
        if part is None:
            part = self._parts[tp] = _Partition(committed=offset)
        elif offset <= part.last_tracked:
            raise ValueError(f"offset {offset} of {tp!r} is not above the last tracked {part.last_tracked}")
        part.order.append(offset)
        part.pending.add(offset)
        part.last_tracked = offset

    def complete(self, tp: Hashable, offset: int) -> bool:
        """The record at `offset` of `tp` has its outcome durably written.

        Returns False (and changes nothing) when the offset is not in flight: the partition
        was forgotten (revoked), or the offset was completed already.
        """
        part = self._parts.get(tp)
        if part is None or offset not in part.pending:
            return False
        part.pending.discard(offset)
        part.done.add(offset)
        self._completions += 1
        part.completed_stamp = self._completions
        return True

    def watermark(self, tp: Hashable) -> int | None:
        """The offset to commit for `tp` now (None for an unknown partition)."""
        part = self._parts.get(tp)
        return part.watermark() if part is not None else None

    def committable(self) -> dict[Hashable, int]:
        """Partitions whose watermark advanced since the last commit -> offset to commit."""
        out: dict[Hashable, int] = {}
        for tp, part in self._parts.items():
            mark = part.watermark()
            if mark > part.committed:
                out[tp] = mark
        return out

    def commit_points(self) -> dict[Hashable, CommitPoint]:
        """Partitions whose watermark advanced, or that finished an offset, since their last
        commit -> the watermark and the offsets finished above it."""
        out: dict[Hashable, CommitPoint] = {}
        stamp = self._completions
        for tp, part in self._parts.items():
            mark = part.watermark()
            if mark > part.committed or part.completed_stamp > part.committed_stamp:
                out[tp] = CommitPoint(mark, part.done_above(), stamp)
        return out

    def done_above(self, tp: Hashable) -> DoneOffsets:
        """Finished offsets of `tp` above its watermark (none for an unknown partition)."""
        part = self._parts.get(tp)
        if part is None:
            return NO_OFFSETS
        part.watermark()
        return part.done_above()

    def mark_committed(self, offsets: Mapping[Hashable, int | CommitPoint]) -> None:
        """These positions (or commit points) were committed (unknown partitions are ignored)."""
        for tp, value in offsets.items():
            part = self._parts.get(tp)
            if part is None:
                continue
            offset = value if isinstance(value, int) else value.offset
            if offset > part.committed:
                part.committed = offset
            if isinstance(value, CommitPoint) and value.stamp > part.committed_stamp:
                part.committed_stamp = value.stamp

    def forget(self, tp: Hashable) -> None:
        """Drop all state of `tp` (revoked); its late completions are then ignored."""
        self._parts.pop(tp, None)

    def partitions(self) -> list[Hashable]:
        """The partitions being tracked."""
        return list(self._parts)

    def pending_offsets(self, tp: Hashable) -> list[int]:
        """The offsets of `tp` in flight, in order."""
        part = self._parts.get(tp)
        return sorted(part.pending) if part is not None else []

    def pending_count(self, tp: Hashable | None = None) -> int:
        """Offsets in flight, for `tp` or for all partitions."""
        if tp is not None:
            part = self._parts.get(tp)
            return len(part.pending) if part is not None else 0
        return sum(len(p.pending) for p in self._parts.values())
