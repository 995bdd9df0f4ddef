"""Fuzz target `metadata`: `offsets.decode_done`, the commit metadata a broker hands back.

Contract (`consumer.core.offsets` module doc): never raises. Returns a `DecodedDone` whose
`reason` is None for empty text or text that decodes, else a one-line reason ("not ours",
another version, damaged, malformed, another offset); what it names is finished offsets at
or above the committed `base`, within Kafka's int64 offsets. Text the real encoder wrote
decodes to the lowest of the offsets it was given.
"""

from __future__ import annotations

import base64
import zlib

from hypothesis import example, given
from hypothesis import strategies as st

from consumer.core.offsets import MAX_OFFSET, DecodedDone, DoneOffsets, decode_done, encode_done
from tests.fuzz._harness import awkward, fuzz_settings, mutated, run_budget, text_of

BASE = 1000
bases = st.one_of(st.just(BASE), st.integers(0, MAX_OFFSET), st.sampled_from((0, MAX_OFFSET - 1, MAX_OFFSET)))


def check_metadata(base: int, text: str) -> DecodedDone:
    """decode_done's verdict on `text` for a commit at `base`, checked against the contract."""
    decoded = decode_done(base, text)
    assert isinstance(decoded, DecodedDone)
    assert isinstance(decoded.done, DoneOffsets)
    if decoded.reason is not None:
        assert isinstance(decoded.reason, str) and decoded.reason and "\n" not in decoded.reason
        assert not decoded.done
    elif text:
        assert decoded.done, "text that decodes names at least one offset"
    if decoded.done:
        assert decoded.done.ranges[0][0] >= base
        assert decoded.done.ranges[-1][1] - 1 <= MAX_OFFSET
    return decoded


def framed(kind: str, base: int | str, payload: bytes) -> str:
    """Metadata text around any payload bytes, header and checksum right: past the CRC check."""
    head = f"pb1{kind}{base}:{base64.urlsafe_b64encode(payload).rstrip(b'=').decode('ascii')}"
    return f"{head}:{zlib.crc32(head.encode('ascii')):08x}"


def fuzz_one(data: bytes) -> None:
    """First byte: 0 text as it is; 1/2 the rest is a run-length/bitmap payload, framed."""
    if not data:
        return
    mode, rest = data[0] % 3, data[1:]
    text = text_of(rest, errors="surrogateescape") if mode == 0 else framed("rb"[mode - 1], BASE, rest)
    check_metadata(BASE, text)


DONE_SETS = [
    DoneOffsets.of([BASE + 1, BASE + 2, BASE + 5]),
    DoneOffsets.of_ranges([(BASE, BASE + 3), (BASE + 10, BASE + 1_000_000)]),
    DoneOffsets.of(range(BASE + 1, BASE + 4000, 3)),
    DoneOffsets.of(range(BASE, BASE + 64, 2)),
]
#: what the real encoder writes (run-length and bitmap, and one cut to fit), and other tools' text
SEED_TEXTS = [encode_done(BASE, done) for done in DONE_SETS] + [
    encode_done(BASE, DONE_SETS[2], max_chars=200),
    "",
    "my-tool checkpoint 42",
    "pb2r1000:AQI:00000000",
]
SEEDS = [b"\x00" + t.encode() for t in SEED_TEXTS] + [b"\x01\x01\x02\x03\x01", b"\x02\x2a\x81"]


@fuzz_settings
@given(data=st.binary(max_size=200))
def _raw_bytes(data: bytes) -> None:
    fuzz_one(data)


@fuzz_settings
@given(base=st.one_of(st.just(BASE), bases), text=mutated(SEED_TEXTS, surrogates=True))
@example(base=BASE, text=framed("r", "9" * 5000, b"\x01\x02"))  # int() refuses over 4,300 digits
def _mutated_seeds(base: int, text: str) -> None:
    check_metadata(base, text)


@st.composite
def framed_texts(draw: st.DrawFn) -> tuple[int, str]:
    """Structure-aware: a right header and checksum around any payload (or a near-right header)."""
    base = draw(bases)
    payload = draw(
        st.one_of(
            st.binary(max_size=64), st.lists(st.sampled_from(b"\x00\x01\x7f\x80\xff"), max_size=32).map(bytes)
        )
    )
    kind = draw(st.sampled_from("rbx"))
    header_base = draw(st.one_of(st.just(base), st.integers(0, 2**70), st.text("0123456789", min_size=1)))
    return base, framed(kind, header_base, payload)


@fuzz_settings
@given(case=framed_texts())
@example(case=(MAX_OFFSET - 1, framed("r", MAX_OFFSET - 1, b"\x00\x05")))  # past the int64 offsets
@example(case=(BASE, framed("r", BASE, b"\xff" * 10 + b"\x01")))  # a varint past 63 bits
def _framed(case: tuple[int, str]) -> None:
    check_metadata(*case)


@fuzz_settings
@given(base=bases, text=awkward(surrogates=True))
def _any_text(base: int, text: str) -> None:
    check_metadata(base, text)


@fuzz_settings
@given(
    base=st.integers(0, 2**40),
    offsets=st.lists(st.integers(0, 5000), max_size=200),
    max_chars=st.integers(0, 300),
)
def _encoder_roundtrip(base: int, offsets: list[int], max_chars: int) -> None:
    done = DoneOffsets.of(base + o for o in offsets)
    decoded = check_metadata(base, encode_done(base, done, max_chars))
    assert decoded.reason is None
    expected = done.from_offset(base)
    assert decoded.done == expected.lowest(len(decoded.done))


def test_raw_bytes() -> None:
    run_budget(_raw_bytes)


def test_mutated_seeds() -> None:
    run_budget(_mutated_seeds)


def test_framed_payloads() -> None:
    run_budget(_framed)


def test_any_text() -> None:
    run_budget(_any_text)


def test_encoder_output_decodes_to_its_lowest_offsets() -> None:
    run_budget(_encoder_roundtrip)


def test_seeds_are_realistic() -> None:
    """The encoder's seeds decode; the others are each a kind of 'not read'."""
    reasons = [check_metadata(BASE, t).reason for t in SEED_TEXTS]
    assert reasons[:5] == [None] * 5
    assert reasons[6:] == ["not promptbus offset metadata", "unknown metadata version 'pb2r'"]
