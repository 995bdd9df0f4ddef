"""The evidence of one batch size level: what was measured there, and the bounds it gives.

Shape (batched answers judged, items in a fully valid answer), agreement (batched answers
compared with the same job asked alone) and speed (seconds, answered items, requests and
tokens of the level's requests) are counted per level; counts halve past a bound, so old
evidence fades and memory stays bounded. The Wilson score interval turns a count into the
bounds a level is judged by. docs/batching-adaptive.md states the whole rule.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from consumer.core.packing import AnswerKind

#: the verdict kind of a fully valid batched answer
VALID_KIND = AnswerKind.COMPLETE.value
#: verdict kinds that count against the batch size: every other one
INVALID_KINDS = frozenset(kind.value for kind in AnswerKind if kind is not AnswerKind.COMPLETE)
#: shape and agreement counts halve past this many items (old evidence fades)
MAX_SAMPLES = 256.0
#: speed sums halve past this many requests
MAX_SPEED_REQUESTS = 64.0


def wilson_bounds(successes: float, trials: float, z: float) -> tuple[float, float]:
    """The Wilson score interval (low, high) of a success rate, `z` standard errors wide.

    With no trials nothing is known: (0.0, 1.0).
    """
    if trials <= 0:
        return 0.0, 1.0
    p = min(1.0, max(0.0, successes / trials))
    z2 = z * z
    centre = p + z2 / (2 * trials)
    spread = z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials))
    denominator = 1 + z2 / trials
    # clamped around p: at p = 0 or 1 rounding would otherwise put a bound past the rate
    low = max(0.0, (centre - spread) / denominator)
    high = min(1.0, (centre + spread) / denominator)
    return min(p, low), max(p, high)


def levels_for(max_items: int) -> tuple[int, ...]:
    """The sizes tried: 1, 2, 4, ... below `max_items`, then `max_items`."""
    levels = [1]
    while levels[-1] * 2 < max_items:
        levels.append(levels[-1] * 2)
    if levels[-1] != max_items:
        levels.append(max_items)
    return tuple(levels)


class LevelEvidence:
    """What was measured at one level: shape, agreement and speed counts."""

    __slots__ = (
        "agreed",
        "answered",
        "compared",
        "judged",
        "requests",
        "seconds",
        "token_items",
        "tokens",
        "valid",
    )

    def __init__(self) -> None:
        self.valid = self.judged = 0.0
        self.agreed = self.compared = 0.0
        self.seconds = self.answered = self.requests = 0.0
        self.tokens = self.token_items = 0.0

    def add_shape(self, valid: float, judged: float) -> None:
        self.valid += valid
        self.judged += judged
        if self.judged > MAX_SAMPLES:
            self.valid /= 2
            self.judged /= 2

    def add_agreement(self, agreed: float, compared: float) -> None:
        self.agreed += agreed
        self.compared += compared
        if self.compared > MAX_SAMPLES:
            self.agreed /= 2
            self.compared /= 2

    def add_speed(self, answered: float, elapsed_s: float, tokens: float) -> None:
        self.seconds += elapsed_s
        self.answered += answered
        self.requests += 1
        if tokens > 0:
            self.tokens += tokens
            self.token_items += answered
        if self.requests > MAX_SPEED_REQUESTS:
            for name in ("seconds", "answered", "requests", "tokens", "token_items"):
                setattr(self, name, getattr(self, name) / 2)

    def seconds_per_item(self) -> float | None:
        """Seconds per answered item; inf when requests answered nothing; None before any."""
        if self.requests == 0:
            return None
        return self.seconds / self.answered if self.answered > 0 else math.inf

    def items_per_s(self) -> float | None:
        spi = self.seconds_per_item()
        if spi is None:
            return None
        return 0.0 if math.isinf(spi) else (1.0 / spi if spi > 0 else math.inf)

    def requests_per_item(self) -> float | None:
        """Requests per answered item; inf when requests answered nothing; None before any."""
        if self.requests == 0:
            return None
        return self.requests / self.answered if self.answered > 0 else math.inf

    def tokens_per_item(self) -> float | None:
        return self.tokens / self.token_items if self.token_items > 0 else None

    def export(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in self.__slots__}

    @classmethod
    def restored(cls, state: Mapping[str, Any]) -> LevelEvidence:
        """Evidence from `export()`'s data; ValueError naming the field that is not a
        non-negative number, or a count above its total."""
        evidence = cls()
        for name in cls.__slots__:
            value = state.get(name, 0.0)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
            setattr(evidence, name, float(value))
        for part, whole in (("valid", "judged"), ("agreed", "compared"), ("token_items", "answered")):
            count, total = getattr(evidence, part), getattr(evidence, whole)
            if count > total:
                raise ValueError(f"{part} ({count:g}) exceeds {whole} ({total:g})")
        return evidence
