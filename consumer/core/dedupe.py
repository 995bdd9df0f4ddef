"""Duplicate prompts answered once (tier option `dedupe`): the key and the table, pure.

Two jobs are duplicates when the provider request each would send is the same and its answer
is deterministic:

    same     tier, model, options (merged over the tier's; canonical JSON, so key order does
             not matter), messages (roles and text, after the template is rendered) and
             tenant (a job is never answered from another tenant's request);
    never    a request whose temperature is above 0 (or unset: providers default to 1) without
             a fixed `seed`: two asks may rightly answer differently.

Nothing else counts: a job's id, `metadata`, `deadline`, source offset and `batch` flag do not
change what the provider is asked.

The table (`DedupeTable`) holds, per key, the request in flight (its leader job and the jobs
waiting for its answer) and the answers of the last `window_s` seconds:

    claim(key)   nothing known -> Lead (send it); in flight -> Follow (wait for the leader);
                 answered within the window -> Reuse (that answer, at once)
    settle(key)  the leader's outcome: its followers, each to end with it; an answer (not a
                 failure: a failed request is not remembered, the next duplicate tries again)
                 is kept for `window_s`
    abandon(key) the leader ends with no outcome (shutdown, revoke): its followers, which end
                 the same way
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import orjson

from consumer.core.tenants import DEFAULT_TENANT

__all__ = ["DedupeTable", "Follow", "Lead", "Reuse", "dedupe_key", "is_deterministic"]

T = TypeVar("T")
A = TypeVar("A")


def is_deterministic(options: Mapping[str, Any]) -> bool:
    """True when the request asks for a repeatable answer: temperature 0, or a fixed seed."""
    temperature = options.get("temperature")
    seed = options.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool):
        return True
    return isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and temperature == 0


def dedupe_key(
    tier: str,
    model: str,
    options: Mapping[str, Any],
    messages: Iterable[tuple[str, str]],
    tenant: str = DEFAULT_TENANT,
) -> str | None:
    """The key under which identical requests of one tenant share an answer; None when the
    request is not deterministic (`is_deterministic`), so it is never shared. `messages`:
    (role, content)."""
    if not is_deterministic(options):
        return None
    canonical = orjson.dumps(
        [tier, model, dict(options), [[role, content] for role, content in messages], tenant],
        option=orjson.OPT_SORT_KEYS,
    )
    return hashlib.sha256(canonical).hexdigest()


@dataclass(frozen=True, slots=True)
class Lead:
    """No identical request is in flight or answered recently: this job's request goes out."""


@dataclass(frozen=True, slots=True)
class Follow:
    """An identical request is in flight: the job waits for it (`leader`: that job's id)."""

    leader: str


@dataclass(frozen=True, slots=True)
class Reuse(Generic[A]):
    """An identical request was answered within the window: the job ends with `answer`."""

    leader: str
    answer: A


@dataclass(slots=True)
class _InFlight(Generic[T]):
    leader: str
    followers: list[T] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Answered(Generic[A]):
    leader: str
    answer: A
    at_s: float


class DedupeTable(Generic[T, A]):
    """Requests in flight and answered within `window_s`, per dedupe key.

    T: what a waiting job is (the runtime's job context); A: what an answer is (what a
    follower's result is built from). Time is the caller's `now_s` (monotonic seconds).
    """

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._inflight: dict[str, _InFlight[T]] = {}
        #: oldest answer first: expiry pops from the front
        self._answered: OrderedDict[str, _Answered[A]] = OrderedDict()

    def __len__(self) -> int:
        """Keys in flight plus answers remembered."""
        return len(self._inflight) + len(self._answered)

    def claim(self, key: str, job_id: str, job: T, now_s: float) -> Lead | Follow | Reuse[A]:
        """What the job `job_id` (`job`) under `key` does: lead, follow or reuse."""
        self.expire(now_s)
        inflight = self._inflight.get(key)
        if inflight is not None:
            inflight.followers.append(job)
            return Follow(inflight.leader)
        answered = self._answered.get(key)
        if answered is not None:
            return Reuse(answered.leader, answered.answer)
        self._inflight[key] = _InFlight(job_id)
        return Lead()

    def settle(self, key: str, answer: A | None, now_s: float) -> tuple[str, list[T]]:
        """The leader of `key` ended: (its id, its followers). With an `answer`, it is kept for
        `window_s`; a failure (`answer` None) is shared with the followers only."""
        inflight = self._inflight.pop(key, None)
        if inflight is None:
            return "", []
        if answer is not None and self.window_s > 0:
            self._answered.pop(key, None)
            self._answered[key] = _Answered(inflight.leader, answer, now_s)
        return inflight.leader, inflight.followers

    def abandon(self, key: str) -> list[T]:
        """The leader of `key` ended without an outcome: its followers, to end the same way."""
        inflight = self._inflight.pop(key, None)
        return inflight.followers if inflight is not None else []

    def expire(self, now_s: float) -> None:
        """Forget answers older than `window_s`."""
        while self._answered:
            key, oldest = next(iter(self._answered.items()))
            if now_s - oldest.at_s <= self.window_s:
                break
            del self._answered[key]
