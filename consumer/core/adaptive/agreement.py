"""Agreement of batched answers with the same jobs asked alone: counts, comparison, sampling.

`AgreementStats` counts compared/agreed answers per tier and batch size for stats and
metrics; `answers_agree` compares a batched with a single answer after `normalize_answer`
(or as parsed JSON); `choose_verified` picks the batched jobs that are also asked alone
(`batching.verify_fraction`).
"""

from __future__ import annotations

import math
import random
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson

from consumer.core.packing import strip_code_fence

T = TypeVar("T")


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
    stripped = strip_code_fence(text)
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
