"""Dedupe, pure: what makes two requests the same, what never does, and the table's life cycle
(in flight, answered within the window, failed, abandoned) on a fake clock."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from consumer.core.dedupe import DedupeTable, Follow, Lead, Reuse, dedupe_key, is_deterministic

MESSAGES = (("system", "Be brief."), ("user", "Classify:\nhello"))


def key(**overrides: object) -> str | None:
    args: dict[str, object] = {
        "tier": "small",
        "model": "m-1",
        "options": {"temperature": 0, "max_tokens": 5},
        "messages": MESSAGES,
    }
    args.update(overrides)
    return dedupe_key(args["tier"], args["model"], args["options"], args["messages"])  # type: ignore[arg-type]


def test_identical_requests_share_a_key_whatever_the_option_order() -> None:
    assert key() is not None
    assert key() == key(options={"max_tokens": 5, "temperature": 0})
    assert key(messages=list(MESSAGES)) == key()


def test_what_makes_requests_different() -> None:
    base = key()
    assert key(tier="large") != base
    assert key(model="m-2") != base
    assert key(options={"temperature": 0, "max_tokens": 6}) != base
    assert key(options={"temperature": 0, "max_tokens": 5, "stop": "\n"}) != base
    assert key(messages=(("system", "Be brief."), ("user", "Classify:\nhello!"))) != base
    assert key(messages=(("user", "Be brief."), ("user", "Classify:\nhello"))) != base


def test_never_shared_without_a_deterministic_answer() -> None:
    assert key(options={"temperature": 0.7}) is None
    assert key(options={}) is None, "an unset temperature is the provider's default (1)"
    assert key(options={"temperature": 0.7, "seed": 42}) is not None, "a fixed seed repeats"
    assert key(options={"temperature": 0.0}) is not None
    assert not is_deterministic({"temperature": False})
    assert not is_deterministic({"seed": True})


@given(metadata=st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3))
def test_metadata_is_no_part_of_the_key(metadata: dict[str, str]) -> None:
    # the key is built from the request alone: a job's metadata, id and deadline never reach it
    assert key() == dedupe_key("small", "m-1", {"max_tokens": 5, "temperature": 0}, MESSAGES)


def test_followers_wait_for_the_request_in_flight_and_share_its_answer() -> None:
    table: DedupeTable[str, str] = DedupeTable(window_s=10.0)
    assert table.claim("k", "job-1", "ctx-1", now_s=0.0) == Lead()
    assert table.claim("k", "job-2", "ctx-2", now_s=1.0) == Follow("job-1")
    assert table.claim("k", "job-3", "ctx-3", now_s=1.5) == Follow("job-1")
    assert table.claim("other", "job-4", "ctx-4", now_s=1.5) == Lead()
    assert table.settle("k", "answer", now_s=2.0) == ("job-1", ["ctx-2", "ctx-3"])
    # within the window the answer is reused at once; after it, the next one leads again
    assert table.claim("k", "job-5", "ctx-5", now_s=12.0) == Reuse("job-1", "answer")
    assert table.claim("k", "job-6", "ctx-6", now_s=12.5) == Lead()


def test_a_failure_goes_to_the_followers_only() -> None:
    table: DedupeTable[str, str] = DedupeTable(window_s=10.0)
    table.claim("k", "job-1", "ctx-1", now_s=0.0)
    table.claim("k", "job-2", "ctx-2", now_s=0.0)
    assert table.settle("k", None, now_s=1.0) == ("job-1", ["ctx-2"])
    assert table.claim("k", "job-3", "ctx-3", now_s=1.5) == Lead(), "a failure is not remembered"


def test_an_abandoned_leader_hands_back_its_followers_and_forgets_the_key() -> None:
    table: DedupeTable[str, str] = DedupeTable(window_s=10.0)
    table.claim("k", "job-1", "ctx-1", now_s=0.0)
    table.claim("k", "job-2", "ctx-2", now_s=0.0)
    assert table.abandon("k") == ["ctx-2"]
    assert table.abandon("k") == []
    assert table.settle("k", "late", now_s=1.0) == ("", [])
    assert len(table) == 0


def test_window_zero_shares_only_while_in_flight_and_answers_expire() -> None:
    table: DedupeTable[str, str] = DedupeTable(window_s=0.0)
    table.claim("k", "job-1", "ctx-1", now_s=0.0)
    table.settle("k", "answer", now_s=1.0)
    assert table.claim("k", "job-2", "ctx-2", now_s=1.0) == Lead()
    windowed: DedupeTable[str, str] = DedupeTable(window_s=5.0)
    for i in range(3):
        windowed.claim(f"k{i}", f"job-{i}", "ctx", now_s=float(i))
        windowed.settle(f"k{i}", "answer", now_s=float(i))
    windowed.expire(now_s=6.5)
    assert len(windowed) == 1, "only the answer of t=2 is within 5 s of 6.5"
