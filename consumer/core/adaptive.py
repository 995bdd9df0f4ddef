"""Adaptive batch size and answer-agreement accounting (issue 7), pure.

The batch size of a (tier, batch key) follows what its answers show, in the shape of TCP
congestion control (and of `limit.AIMDLimit`):

- `AdaptiveBatchSize.size` is the most items one request may carry. It starts at
  `initial` (the tier's `batching.initial_items`, else `max_items`).
- GROW after a fully valid (COMPLETE) batched answer that carried at least the current
  size: x2 while below the slow-start threshold, +1 above it, never past `max_items`.
  Why both: doubling finds a working size in log2(max) answers when the key is new, but
  once a size has failed the failure cost dominates -- a failed batch of N is split and
  re-asked (up to 2N-1 requests) while growing from N to N+1 saves only N/(N+1) - (N-1)/N
  of a request per item -- so after a failure the size creeps up one item at a time
  (additive increase, like TCP's congestion avoidance; the threshold is half the size
  that failed). An answer for fewer items than the current size proves nothing about the
  current size (a small window, or a split half) and does not grow it.
- HALVE after an invalid answer (MISSING, MALFORMED, TRUNCATED, UNEXPECTED) of a batched
  request: the new size is at most half of THAT request's size. Halving from the
  request's size, not from the current one, makes reports idempotent: four requests of 16
  sent together that all fail leave the size at 8, not at 1.
- FALL TO 1 (ordinary requests, no batching) after `fallback_after` invalid answers in a
  row at or below the current size ("batching keeps failing"; halving reaches 1 anyway).
- PROBE: `probe_after_s` after falling to 1, `size_at(now_s)` returns 2 again. A valid
  probe answer resumes growth (+1 per valid answer); an invalid one falls back to 1 and
  restarts the probe timer.
- LOW AGREEMENT: `record_agreement` collects (agreed, compared) counts from jobs that were
  asked both batched and alone; once at least `agreement_min_compared` answers are
  compared, a rate below `min_agreement` counts as one invalid answer at the largest size
  compared. The counts restart whenever the size shrinks (they spoke for the old size).
  While the agreement counted so far (or the last judged rate) is below `min_agreement`,
  valid answers do not grow the size: well-formed answers that disagree with the single
  answers are no reason to batch more.

Ordinary requests (size 1) are never judged (DESIGN.md rule 5), so reports with size < 2
change nothing.

`AdaptiveSizes` holds one `AdaptiveBatchSize` per key, e.g. (tier, batch key).
`AgreementStats` counts compared/agreed answers per tier and batch size for stats and
metrics. `answers_agree` compares a batched with a single answer; `choose_verified` picks
the batched jobs that are also asked alone (`batching.verify_fraction`).

How the runtime uses it (per tier; key = (tier name, batch key)):

1. when a window flushes at `now_s`: ``n = sizes.size_at(key, now_s)``; cut its members
   into chunks of at most n (n == 1: ordinary requests) and start one `RequestPlan` each;
2. for every `Step` with a `verdict`: ``sizes.record(key, step.verdict.kind.value,
   len(req.members), now_s)``;
3. with `verify_fraction` > 0, for the members a batched request answered:
   ``choose_verified(members, verify_fraction, rng)``; publish the batched answers as
   usual, send each chosen job's own ordinary request (counted as a verification
   request, not as a re-ask), compare with `answers_agree(batched, single.text)`, then
   ``agreement.record(tier, size, agreed, compared)`` and
   ``sizes.record_agreement(key, agreed, compared, size, now_s)``;
4. stats and metrics: ``sizes.snapshot()`` (size per key) and ``agreement.as_dict()``;
   call ``sizes.expire(now_s, idle_s)`` now and then so departed batch keys are forgotten.

Nothing here reads a clock, sleeps or logs I/O: every time is an explicit `now_s`
(monotonic seconds), randomness comes from an injected `random.Random`.
"""

from __future__ import annotations

import math
import random
import re
import unicodedata
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import orjson

__all__ = [
    "DEFAULT_AGREEMENT_MIN_COMPARED",
    "DEFAULT_FALLBACK_AFTER",
    "DEFAULT_MIN_AGREEMENT",
    "DEFAULT_PROBE_AFTER_S",
    "INVALID_KINDS",
    "VALID_KIND",
    "AdaptiveBatchSize",
    "AdaptiveSizes",
    "AgreementCount",
    "AgreementStats",
    "answers_agree",
    "choose_verified",
    "normalize_answer",
]

#: the verdict kind (`packing.AnswerKind` values) of a fully valid batched answer
VALID_KIND = "complete"
#: verdict kinds that count against the batch size
INVALID_KINDS = frozenset({"missing", "malformed", "truncated", "unexpected"})

#: seconds at size 1 before a batch of 2 is tried again
DEFAULT_PROBE_AFTER_S = 60.0
#: invalid answers in a row (at or below the current size) that end batching for the key
DEFAULT_FALLBACK_AFTER = 3
#: agreement rate below which batched answers count as invalid (settings default too)
DEFAULT_MIN_AGREEMENT = 0.8
#: compared answers needed before an agreement rate is judged (one disagreement in a
#: single comparison says little about a model)
DEFAULT_AGREEMENT_MIN_COMPARED = 5

#: the size a probe tries after a fall to 1
_PROBE_SIZE = 2

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


class AdaptiveBatchSize:
    """The current batch size of one (tier, batch key); see the module docstring for the rule.

    initial: the starting size (1..max_items).
    max_items: the tier's `batching.max_items`; the size never exceeds it.
    probe_after_s: seconds at size 1 before a probe with 2 items.
    min_agreement: agreement rate (0..1) below which batched answers count as invalid.
    fallback_after: invalid answers in a row that drop the size straight to 1.
    agreement_min_compared: compared answers needed before an agreement rate is judged.
    """

    def __init__(
        self,
        initial: int,
        max_items: int,
        *,
        probe_after_s: float = DEFAULT_PROBE_AFTER_S,
        min_agreement: float = DEFAULT_MIN_AGREEMENT,
        fallback_after: int = DEFAULT_FALLBACK_AFTER,
        agreement_min_compared: int = DEFAULT_AGREEMENT_MIN_COMPARED,
    ) -> None:
        if max_items < 1:
            raise ValueError(f"max_items must be >= 1, got {max_items}")
        if not 1 <= initial <= max_items:
            raise ValueError(f"need 1 <= initial ({initial}) <= max_items ({max_items})")
        if probe_after_s < 0:
            raise ValueError("probe_after_s must be >= 0")
        if not 0.0 <= min_agreement <= 1.0:
            raise ValueError("min_agreement must be within 0..1")
        if fallback_after < 1:
            raise ValueError("fallback_after must be >= 1")
        if agreement_min_compared < 1:
            raise ValueError("agreement_min_compared must be >= 1")
        self.max_items = max_items
        self.probe_after_s = probe_after_s
        self.min_agreement = min_agreement
        self.fallback_after = fallback_after
        self.agreement_min_compared = agreement_min_compared
        self._size = initial
        #: slow-start threshold: below it the size doubles, at or above it grows by one
        self._threshold = max_items
        self._strikes = 0
        #: when the size fell to 1 (the probe timer), None while above 1 or probing
        self._at_one_since_s: float | None = None
        self._probing = False
        self._agreed = 0
        self._compared = 0
        self._compared_max_size = 0
        #: the last judged agreement rate was below min_agreement: hold growth until one is not
        self._agreement_low = False
        #: last time anything was reported or asked (for `AdaptiveSizes.expire`)
        self.last_used_s: float | None = None

    # --- queries -------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Most items per request right now (1 = ordinary requests). `size_at` also starts probes."""
        return self._size

    @property
    def probing(self) -> bool:
        """True while a probe (size 2 after a fall to 1) waits for its verdict."""
        return self._probing

    def size_at(self, now_s: float) -> int:
        """The size to use for requests formed at `now_s`.

        At size 1 for `probe_after_s` or longer, this starts a probe: the size becomes 2
        until a batched answer is judged.
        """
        self.last_used_s = now_s
        if self._size == 1 and self._at_one_since_s is None and not self._probing:
            self._at_one_since_s = now_s  # started at 1 (initial_items: 1): the timer runs from now
        if (
            self._size == 1
            and self.max_items >= _PROBE_SIZE
            and self._at_one_since_s is not None
            and now_s - self._at_one_since_s >= self.probe_after_s
        ):
            self._size = _PROBE_SIZE
            self._probing = True
            self._at_one_since_s = None
            self._strikes = 0
        return self._size

    # --- reports -------------------------------------------------------------------------

    def record(self, verdict_kind: str, size: int, now_s: float) -> int:
        """Apply the verdict of a batched answer for a request of `size` items; return the new size.

        verdict_kind: a `packing.AnswerKind` value (complete, missing, malformed, truncated,
        unexpected); sizes below 2 (ordinary requests, never judged) change nothing.
        """
        self.last_used_s = now_s
        if verdict_kind == VALID_KIND:
            self._valid(size)
        elif verdict_kind in INVALID_KINDS:
            self._invalid(size, now_s)
        else:
            raise ValueError(f"unknown verdict kind {verdict_kind!r}")
        return self._size

    def record_agreement(self, agreed: int, compared: int, size: int, now_s: float) -> int:
        """Count `agreed` of `compared` batched answers (from requests of `size` items) that
        matched the same job asked alone; return the new size.

        Once `agreement_min_compared` answers are counted, a rate below `min_agreement`
        counts as one invalid answer at the largest size among them.
        """
        if not 0 <= agreed <= compared:
            raise ValueError(f"need 0 <= agreed ({agreed}) <= compared ({compared})")
        self.last_used_s = now_s
        if compared == 0 or size < 2:
            return self._size
        self._agreed += agreed
        self._compared += compared
        self._compared_max_size = max(self._compared_max_size, size)
        if self._compared >= self.agreement_min_compared:
            rate = self._agreed / self._compared
            judged_size = self._compared_max_size
            self._reset_agreement()
            self._agreement_low = rate < self.min_agreement
            if self._agreement_low:
                self._invalid(judged_size, now_s)
        return self._size

    # --- the rule ------------------------------------------------------------------------

    def _valid(self, size: int) -> None:
        if size < 2:
            return
        self._strikes = 0
        if self._probing or self._size == 1:
            # a valid probe (or a late valid answer from before the fall): batching works again
            self._probing = False
            self._at_one_since_s = None
            self._threshold = _PROBE_SIZE
        if size < self._size:
            return  # a smaller request proves nothing about the current size
        if self._agreement_low or (self._compared and self._agreed / self._compared < self.min_agreement):
            # well-formed answers that disagree with single answers are no reason to grow
            return
        if self._size < self._threshold:
            grown = min(self._size * 2, self._threshold)
        else:
            grown = self._size + 1
        self._size = min(grown, self.max_items)

    def _invalid(self, size: int, now_s: float) -> None:
        if size < 2:
            return
        current = self._size
        if size <= current:
            self._strikes += 1  # about the present size, not a late report on a bigger one
        # the threshold only comes down: a late report on a big request must not restart slow start
        self._threshold = max(_PROBE_SIZE, min(self._threshold, size // 2))
        new = min(current, max(1, size // 2))
        if self._probing or self._strikes >= self.fallback_after:
            new = 1
        self._probing = False
        if new < current:
            self._reset_agreement()
        if new == 1 and (current > 1 or self._at_one_since_s is None):
            self._at_one_since_s = now_s
            self._strikes = 0
            self._agreement_low = False  # a probe starts afresh
        self._size = new

    def _reset_agreement(self) -> None:
        self._agreed = self._compared = self._compared_max_size = 0

    def __repr__(self) -> str:
        return (
            f"AdaptiveBatchSize(size={self._size}, max_items={self.max_items}, "
            f"threshold={self._threshold}, probing={self._probing})"
        )


class AdaptiveSizes(Generic[K]):
    """One `AdaptiveBatchSize` per key (e.g. (tier, batch key)), created on first use by `factory`."""

    def __init__(self, factory: Callable[[K], AdaptiveBatchSize]) -> None:
        self._factory = factory
        self._sizes: dict[K, AdaptiveBatchSize] = {}

    def get(self, key: K) -> AdaptiveBatchSize:
        """The size tracker of `key` (created by the factory the first time)."""
        tracker = self._sizes.get(key)
        if tracker is None:
            tracker = self._sizes[key] = self._factory(key)
        return tracker

    def size_at(self, key: K, now_s: float) -> int:
        """`AdaptiveBatchSize.size_at` for `key`."""
        return self.get(key).size_at(now_s)

    def record(self, key: K, verdict_kind: str, size: int, now_s: float) -> int:
        """`AdaptiveBatchSize.record` for `key`."""
        return self.get(key).record(verdict_kind, size, now_s)

    def record_agreement(self, key: K, agreed: int, compared: int, size: int, now_s: float) -> int:
        """`AdaptiveBatchSize.record_agreement` for `key`."""
        return self.get(key).record_agreement(agreed, compared, size, now_s)

    def snapshot(self) -> dict[K, int]:
        """Current size per key (for stats and metrics)."""
        return {key: t.size for key, t in self._sizes.items()}

    def expire(self, now_s: float, idle_s: float) -> list[K]:
        """Forget keys unused for `idle_s` or longer (batch keys come and go); returns them.

        A tracker never asked nor reported to holds nothing but its initial state and goes too.
        """
        gone = [
            key
            for key, t in self._sizes.items()
            if t.last_used_s is None or now_s - t.last_used_s >= idle_s
        ]
        for key in gone:
            del self._sizes[key]
        return gone

    def __len__(self) -> int:
        return len(self._sizes)

    def __iter__(self) -> Iterator[K]:
        return iter(self._sizes)


# --- agreement accounting ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AgreementCount:
    """Batched answers compared with the same job asked alone, and how many agreed."""

    compared: int = 0
    agreed: int = 0

    @property
    def rate(self) -> float | None:
        """agreed / compared, None before anything was compared."""
        return self.agreed / self.compared if self.compared else None

    def plus(self, agreed: int, compared: int) -> AgreementCount:
        """A new count with these added."""
        return AgreementCount(self.compared + compared, self.agreed + agreed)


class AgreementStats:
    """Agreement counts per tier and batch size (for `promptbus stats` and metrics)."""

    def __init__(self) -> None:
        self._counts: dict[str, dict[int, AgreementCount]] = {}

    def record(self, tier: str, size: int, agreed: int, compared: int) -> AgreementCount:
        """Add `agreed` of `compared` answers of requests of `size` items; returns the new count."""
        if not 0 <= agreed <= compared:
            raise ValueError(f"need 0 <= agreed ({agreed}) <= compared ({compared})")
        per_size = self._counts.setdefault(tier, {})
        count = per_size.get(size, AgreementCount()).plus(agreed, compared)
        per_size[size] = count
        return count

    def count(self, tier: str, size: int | None = None) -> AgreementCount:
        """The count of one tier and size, or of the whole tier when `size` is None."""
        per_size = self._counts.get(tier, {})
        if size is not None:
            return per_size.get(size, AgreementCount())
        total = AgreementCount()
        for c in per_size.values():
            total = total.plus(c.agreed, c.compared)
        return total

    def rate(self, tier: str, size: int | None = None) -> float | None:
        """Agreement rate of one tier (and size), None before anything was compared."""
        return self.count(tier, size).rate

    def snapshot(self) -> dict[str, dict[int, AgreementCount]]:
        """tier -> size -> count (copies; sizes in ascending order)."""
        return {tier: dict(sorted(per.items())) for tier, per in self._counts.items()}

    def as_dict(self) -> dict[str, dict[str, dict[str, Any]]]:
        """JSON-ready snapshot: tier -> str(size) -> {compared, agreed, rate}."""
        return {
            tier: {
                str(size): {"compared": c.compared, "agreed": c.agreed, "rate": c.rate}
                for size, c in per.items()
            }
            for tier, per in self.snapshot().items()
        }


# --- comparing answers -----------------------------------------------------------------------

_FENCED = re.compile(r"\A```[A-Za-z0-9_-]*[ \t]*\r?\n?(.*?)```\Z", re.DOTALL)
_SPACES = re.compile(r"\s+")


def normalize_answer(text: str) -> str:
    """Case-folded, punctuation removed (any Unicode P* character), whitespace collapsed."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    kept = "".join(" " if unicodedata.category(ch).startswith("P") else ch for ch in folded)
    return _SPACES.sub(" ", kept).strip()


def _canonical(value: Any) -> Any:
    """A parsed JSON value in comparable form: strings normalized, numbers as floats."""
    if isinstance(value, bool) or value is None:
        return ("const", value)  # True must not equal 1
    if isinstance(value, int | float):
        return ("num", float(value))
    if isinstance(value, str):
        return ("str", normalize_answer(value))
    if isinstance(value, list):
        return ("list", tuple(_canonical(v) for v in value))
    if isinstance(value, Mapping):
        return ("obj", frozenset((normalize_answer(str(k)), _canonical(v)) for k, v in value.items()))
    return ("str", normalize_answer(str(value)))


def _comparable(text: str) -> Any:
    stripped = text.strip()
    fenced = _FENCED.match(stripped)
    if fenced:
        stripped = fenced.group(1).strip()
    try:
        return _canonical(orjson.loads(stripped))
    except orjson.JSONDecodeError:
        # plain text compares like a JSON string: '"Positive."' agrees with 'positive'
        return ("str", normalize_answer(text))


def answers_agree(a: str, b: str) -> bool:
    """True when two answers say the same: equal after `normalize_answer`, or, when they are
    JSON (optionally in a code fence), equal as parsed JSON with strings normalized the
    same way (key order, spacing and number format do not matter; true is not 1).
    """
    return bool(_comparable(a) == _comparable(b))


def choose_verified(members: Sequence[T], fraction: float, rng: random.Random) -> list[T]:
    """The members (jobs of one batched request) to ask alone as well, in input order.

    Picks floor(fraction * n) members, plus one more with probability equal to the
    remainder, so the expected share is exactly `fraction` even for small batches
    (fraction 0.1 of 4 members: one member in 2 requests of 5, none in the others).
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be within 0..1, got {fraction}")
    n = len(members)
    if n == 0 or fraction == 0.0:
        return []
    exact = fraction * n
    count = math.floor(exact)
    if count < n and rng.random() < exact - count:
        count += 1
    picked = sorted(rng.sample(range(n), count))
    return [members[i] for i in picked]
