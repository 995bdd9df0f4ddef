"""Adaptive batch size from evidence, and answer-agreement accounting, pure.

Prompt batching must never make a tier worse. The batch size of a (tier, batch key) is
therefore the largest size its measurements support, not a guess that waits to be
refuted. The rule, for one key:

Sizes. The sizes tried are the LEVELS 1, 2, 4, 8, ... up to `max_items` (the last level is
`max_items` itself). Evidence from a request of n items counts for the largest level <= n:
a window that flushed with 3 items speaks for 2, never for 4.

Evidence per level, all of it measured:

- SHAPE: the items of batched answers judged (`record`), and how many were in a fully valid
  (COMPLETE) answer; an invalid answer (MISSING, MALFORMED, TRUNCATED, UNEXPECTED) counts
  all its items as failed.
- AGREEMENT: batched answers compared with the same job asked alone (`record_agreement`,
  fed by `batching.verify_fraction`), and how many agreed.
- SPEED: seconds spent in requests of the level and the items they answered, requests and
  tokens (`record_speed`), for size 1 (ordinary requests, verification requests included)
  as for every batched level. A batched request whose answer was discarded answered nothing
  and still costs its time.

Counts halve once they pass a bound (`MAX_SAMPLES`, `MAX_SPEED_REQUESTS`), so old evidence
fades and memory stays bounded.

Judging a level L >= 2 (p = `min_agreement`; "proven" uses the lower end, at
`confidence` (one-sided), of the Wilson score interval of the success rate, so one lucky
answer proves nothing: at p 0.8 and 90 % it takes 7 agreeing answers out of 7):

- PROVEN: the Wilson lower bound of its shape rate and (when measured) of its agreement
  rate is at least p. A level in use stops being proven with the first answers that pull
  the bound below p, and is left at once.
- FAILED: the Wilson upper bound of either rate is below p (it is known to be worse). Only
  a failed level backs its probes off and loses its trust.
- SUPPORTED: not failed, and proven or within the TRUSTED sizes. Trusted: the sizes the
  configuration vouches for without measurement -- up to `batching.initial_items` when it
  is set, else up to `max_items` when agreement is not measured (`verify_fraction` 0: the
  operator asked for batching and only the shape can be checked), else only size 1.
- WORTH IT: batching at L is kept unless it is SLOWER and SAVES NOTHING the provider
  charges for. Slower: seconds per answered item at L are at least those of size 1 (judged
  once L has a request and size 1 has `MIN_SINGLE_REQUESTS`). Charges saved: a provider
  that limits requests (the tier has learnt a request budget from rate-limit headers, see
  `pacing.BudgetPacer`) is paid in requests, and batching saves while its measured requests
  per answered item are below those of single requests (L items in one valid answer: 1/L);
  a provider that charges per token (openai, anthropic; `batching.charges`) is paid in
  tokens, and batching saves while its measured tokens per answered item are below those
  of single requests (the prompt prefix is sent once, the batch instruction and JSON
  envelope are added), assumed so until tokens are counted; a local openai_compat server
  without a request budget charges nothing per request or token, so there only speed counts.

The size in use is the largest level L such that every level from 2 to L is supported and
L is worth it; else 1 (ordinary requests, DESIGN.md rule 5). It is recomputed after every
report, so it grows as soon as a level is proven and shrinks as soon as one fails.

Probes. Evidence for a size the key does not use has to be sampled: a share
`probe_fraction` of the key's jobs goes out at the PROBE size, the smallest level above the
size in use that is not established (supported and worth it) -- or, while batching with
speed reported, at size 1 when size 1 has too few speed samples and speed is what decides.
`size_at` counts jobs: once the share has built up a probe's worth of jobs it answers the
probe size for as many calls as the probe takes. A probe whose level still looks failed,
or slower without saving anything, makes the next probe of that level `PROBE_BACKOFF`
times further away (up to `MAX_PROBE_GAP`); a level that becomes established starts
afresh. With verification on, the jobs of a probe batch are verified like any other, which
is how agreement at a size not in use is measured.

Ordinary requests (size 1) are never judged by shape or agreement (DESIGN.md rule 5).

Remembered evidence. What a key measured outlives the process: `export()` gives its
evidence and probe gaps as plain JSON-ready data, `restore()` takes them back into a new
tracker of the same key, which then starts at the size that evidence supports, with the
probe backoff it had reached, instead of at size 1 with nothing known. Levels are matched
by size; one the new tracker does not have (another `max_items`) is left out. `changes`
counts the reports, so a caller can tell which trackers learnt something since it last
exported them.

`AdaptiveSizes` holds one `AdaptiveBatchSize` per key, e.g. (tier, batch key).
`AgreementStats` counts compared/agreed answers per tier and batch size for stats and
metrics. `answers_agree` compares a batched with a single answer; `choose_verified` picks
the batched jobs that are also asked alone (`batching.verify_fraction`).

How the runtime uses it (per tier; key = (tier name, batch key)):

1. for every job routed to a collection window at `now_s`: ``n = sizes.size_at(key, now_s,
   request_limited=...)``; the window the job opens (if it opens one) holds at most n
   (n == 1: ordinary requests). Asked once per job: that is how probes count their share;
2. for every `Step` with a `verdict`: ``sizes.record(key, step.verdict.kind.value,
   len(req.members), now_s)``;
3. for every answered provider request (batched, ordinary or verification):
   ``sizes.record_speed(key, len(req.members), answered, elapsed_s, now_s, tokens=...)``;
4. with `verify_fraction` > 0, for the members a batched request of n items answered, if
   ``sizes.wants_verification(key, n)`` (after step 3's report of that request):
   ``choose_verified(members, verify_fraction, rng)``; publish the batched answers as
   usual, send each chosen job's own ordinary request, compare with
   `answers_agree(batched, single.text)`, then ``agreement.record(tier, size, agreed,
   compared)`` and ``sizes.record_agreement(key, agreed, compared, size, now_s)``;
5. stats and metrics: ``sizes.snapshot()`` (size per key), ``sizes.explain()`` (why) and
   ``agreement.as_dict()``; call ``sizes.expire(now_s, idle_s)`` now and then so departed
   batch keys are forgotten.

Nothing here reads a clock, sleeps or logs I/O: every time is an explicit `now_s`
(monotonic seconds), randomness comes from an injected `random.Random`.
"""

from __future__ import annotations

import math
import random
import re
import statistics
import unicodedata
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import orjson

from consumer.core.packing import AnswerKind, strip_code_fence

__all__ = [
    "DEFAULT_CONFIDENCE",
    "DEFAULT_MIN_AGREEMENT",
    "DEFAULT_PROBE_FRACTION",
    "INVALID_KINDS",
    "VALID_KIND",
    "AdaptiveBatchSize",
    "AdaptiveSizes",
    "AgreementCount",
    "AgreementStats",
    "answers_agree",
    "choose_verified",
    "levels_for",
    "normalize_answer",
    "wilson_bounds",
]

#: the verdict kind of a fully valid batched answer
VALID_KIND = AnswerKind.COMPLETE.value
#: verdict kinds that count against the batch size: every other one
INVALID_KINDS = frozenset(kind.value for kind in AnswerKind if kind is not AnswerKind.COMPLETE)

#: success rate (shape and agreement) a size must show (settings default too)
DEFAULT_MIN_AGREEMENT = 0.8
#: one-sided confidence of the Wilson lower bound that proves a size (settings default too)
DEFAULT_CONFIDENCE = 0.9
#: share of a key's jobs sent at the probe size (settings default too)
DEFAULT_PROBE_FRACTION = 0.1
#: ordinary requests timed before batching may be called slower than they
MIN_SINGLE_REQUESTS = 3
#: a probe that finds its level still bad puts the next one this many times further away ...
PROBE_BACKOFF = 4.0
#: ... up to this many times the first distance
MAX_PROBE_GAP = 256.0
#: shape and agreement counts halve past this many items (old evidence fades)
MAX_SAMPLES = 256.0
#: speed sums halve past this many requests
MAX_SPEED_REQUESTS = 64.0

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


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


class _Evidence:
    """What was measured at one level (see the module docstring)."""

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
    def restored(cls, state: Mapping[str, Any]) -> _Evidence:
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


class AdaptiveBatchSize:
    """The batch size of one (tier, batch key), decided from evidence; see the module docstring.

    max_items: the tier's `batching.max_items`; the size never exceeds it.
    trusted: sizes up to this are supported until evidence says otherwise (1..max_items).
    measure_agreement: agreement is measured (`verify_fraction` > 0) and must be proven.
    min_agreement: success rate (shape, agreement) a size must show, 0..1.
    confidence: one-sided confidence of the Wilson lower bound that proves a size (0.5..1).
    probe_fraction: share of jobs sent at the probe size (0 never probes).
    per_token: the provider charges per token (openai, anthropic).
    """

    def __init__(
        self,
        max_items: int,
        *,
        trusted: int = 1,
        measure_agreement: bool = True,
        min_agreement: float = DEFAULT_MIN_AGREEMENT,
        confidence: float = DEFAULT_CONFIDENCE,
        probe_fraction: float = DEFAULT_PROBE_FRACTION,
        per_token: bool = False,
    ) -> None:
        if max_items < 1:
            raise ValueError(f"max_items must be >= 1, got {max_items}")
        if not 1 <= trusted <= max_items:
            raise ValueError(f"need 1 <= trusted ({trusted}) <= max_items ({max_items})")
        if not 0.0 <= min_agreement <= 1.0:
            raise ValueError("min_agreement must be within 0..1")
        if not 0.5 <= confidence < 1.0:
            raise ValueError("confidence must be within 0.5..1 (1 excluded)")
        if not 0.0 <= probe_fraction <= 1.0:
            raise ValueError("probe_fraction must be within 0..1")
        self.max_items = max_items
        self.trusted = trusted
        self.measure_agreement = measure_agreement
        self.min_agreement = min_agreement
        self.confidence = confidence
        self.probe_fraction = probe_fraction
        self.per_token = per_token
        self._z = statistics.NormalDist().inv_cdf(confidence)
        self.levels = levels_for(max_items)
        self._evidence = {level: _Evidence() for level in self.levels}
        #: the provider limits requests (the tier learnt a request budget)
        self.request_limited = False
        self._credit = 0.0
        self._gap = dict.fromkeys(self.levels, 1.0)
        #: levels whose gap grew since their last probe (one backoff per probe's evidence)
        self._backed_off: set[int] = set()
        self._probe_size = 1
        self._probe_left = 0
        #: probes started (for stats and tests)
        self.probes = 0
        #: last time anything was reported or asked (for `AdaptiveSizes.expire`)
        self.last_used_s: float | None = None
        #: reports counted so far, restored evidence included (see "Remembered evidence")
        self.changes = 0
        self._target: int | None = None
        self._size = self._decide()

    # --- queries -------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Most items per request the evidence supports (1 = ordinary requests); no probes."""
        return self._size

    @property
    def probing(self) -> bool:
        """True while `size_at` hands out a probe size."""
        return self._probe_left > 0

    def wants_verification(self, size: int) -> bool:
        """Whether verifying answers of a batched request of `size` items can still change
        anything: not when agreement is not measured, nor when that size is slower without
        saving a charge (agreement cannot make it worth using)."""
        level = self.level_of(size)
        return self.measure_agreement and level > 1 and self._worth(level)

    def level_of(self, n: int) -> int:
        """The largest level <= n (at least 1)."""
        return max((level for level in self.levels if level <= n), default=1)

    def size_at(self, now_s: float, *, request_limited: bool | None = None) -> int:
        """The size for a job routed at `now_s`: the size in use, or the probe size while a
        probe runs. Asked once per job (see the module docstring).

        request_limited: whether the provider limits requests (None: as last told).
        """
        self.last_used_s = now_s
        if request_limited is not None and request_limited != self.request_limited:
            self.request_limited = request_limited
            self._size = self._decide()
        target = self._target
        if target is None or self.probe_fraction == 0.0:
            self._credit = 0.0
        else:
            # every job counts towards the share, the probe's own included
            self._credit += self.probe_fraction
        if self._probe_left > 0:
            self._probe_left -= 1
            return self._probe_size
        if target is None:
            return self._size
        calls = target if target > 1 else self._size
        cost = calls * self._gap[target]
        if self._credit < cost - 1e-9:  # shares like 0.1 do not add up to 2.0 exactly
            return self._size
        if self._looks_bad(target) and target not in self._backed_off and cost < MAX_PROBE_GAP * calls:
            # what the last probe found is bad: wait PROBE_BACKOFF times longer for the next
            self._gap[target] = min(self._gap[target] * PROBE_BACKOFF, MAX_PROBE_GAP)
            self._backed_off.add(target)
            return self._size
        self._backed_off.discard(target)
        self._credit -= cost
        self.probes += 1
        self._probe_size = target
        self._probe_left = calls - 1
        return target

    # --- reports -------------------------------------------------------------------------

    def record(self, verdict_kind: str, size: int, now_s: float) -> int:
        """Count the verdict of a batched answer for a request of `size` items; return the size.

        verdict_kind: a `packing.AnswerKind` value (complete, missing, malformed, truncated,
        unexpected); sizes below 2 (ordinary requests, never judged) change nothing.
        """
        if verdict_kind != VALID_KIND and verdict_kind not in INVALID_KINDS:
            raise ValueError(f"unknown verdict kind {verdict_kind!r}")
        self.last_used_s = now_s
        if size < 2:
            return self._size
        valid = size if verdict_kind == VALID_KIND else 0
        self.changes += 1
        self._evidence[self.level_of(size)].add_shape(valid, size)
        self._size = self._decide()
        return self._size

    def record_agreement(self, agreed: int, compared: int, size: int, now_s: float) -> int:
        """Count `agreed` of `compared` batched answers (from requests of `size` items) that
        matched the same job asked alone; return the size."""
        if not 0 <= agreed <= compared:
            raise ValueError(f"need 0 <= agreed ({agreed}) <= compared ({compared})")
        self.last_used_s = now_s
        if compared == 0 or size < 2:
            return self._size
        self._evidence[self.level_of(size)].add_agreement(agreed, compared)
        self.changes += 1
        self._size = self._decide()
        return self._size

    def record_speed(
        self, size: int, answered: int, elapsed_s: float, now_s: float, *, tokens: int = 0
    ) -> int:
        """Count one answered request of `size` items that took `elapsed_s` and answered
        `answered` of them (0 when its answer was discarded), using `tokens` (input +
        output, 0 when unknown); return the size."""
        if size < 1 or not 0 <= answered <= size or elapsed_s < 0 or tokens < 0:
            raise ValueError(f"bad speed sample: size {size}, answered {answered}, {elapsed_s} s")
        self.last_used_s = now_s
        self._evidence[self.level_of(size)].add_speed(answered, elapsed_s, tokens)
        self.changes += 1
        self._size = self._decide()
        return self._size

    # --- remembering ----------------------------------------------------------------------

    def export(self) -> dict[str, Any]:
        """The evidence and probe gaps per level, JSON-ready (see "Remembered evidence")."""
        return {
            "levels": {
                str(level): {
                    **self._evidence[level].export(),
                    "gap": self._gap[level],
                    "backed_off": level in self._backed_off,
                }
                for level in self.levels
            },
            "probes": self.probes,
        }

    def restore(self, state: Mapping[str, Any]) -> int:
        """Take back what `export()` gave (of a tracker of the same key); return the size.

        Raises ValueError naming what is wrong when `state` is not such data; nothing is
        changed then.
        """
        levels = state.get("levels")
        if not isinstance(levels, Mapping):
            raise ValueError("levels must be an object of level -> evidence")
        evidence: dict[int, _Evidence] = {}
        gaps: dict[int, float] = {}
        backed_off: set[int] = set()
        for name, data in levels.items():
            if not (isinstance(name, str) and name.isdigit()) or not isinstance(data, Mapping):
                raise ValueError(f"level {name!r} must be a size with an object of evidence")
            level = int(name)
            if level not in self._evidence:
                continue  # another max_items: that size is not tried here
            try:
                evidence[level] = _Evidence.restored(data)
            except ValueError as problem:
                raise ValueError(f"level {level}: {problem}") from None
            gap = data.get("gap", 1.0)
            if isinstance(gap, bool) or not isinstance(gap, int | float) or not 1.0 <= gap <= MAX_PROBE_GAP:
                raise ValueError(f"level {level}: gap must be within 1..{MAX_PROBE_GAP:g}, got {gap!r}")
            gaps[level] = float(gap)
            if data.get("backed_off", False) is True:
                backed_off.add(level)
        probes = state.get("probes", 0)
        if isinstance(probes, bool) or not isinstance(probes, int) or probes < 0:
            raise ValueError(f"probes must be an integer >= 0, got {probes!r}")
        self._evidence.update(evidence)
        self._gap.update(gaps)
        self._backed_off = (self._backed_off - set(evidence)) | backed_off
        self.probes = max(self.probes, probes)
        self.changes += 1
        self._size = self._decide()
        return self._size

    # --- the rule ------------------------------------------------------------------------

    def _failed(self, level: int) -> bool:
        e = self._evidence[level]
        p = self.min_agreement
        if wilson_bounds(e.valid, e.judged, self._z)[1] < p:
            return True
        return self.measure_agreement and wilson_bounds(e.agreed, e.compared, self._z)[1] < p

    def _proven(self, level: int) -> bool:
        e = self._evidence[level]
        p = self.min_agreement
        if wilson_bounds(e.valid, e.judged, self._z)[0] < p:
            return False
        return not self.measure_agreement or wilson_bounds(e.agreed, e.compared, self._z)[0] >= p

    def _supported(self, level: int) -> bool:
        return not self._failed(level) and (level <= self.trusted or self._proven(level))

    def _slower(self, level: int) -> bool:
        single = self._evidence[1]
        batched = self._evidence[level].seconds_per_item()
        if batched is None or single.requests < MIN_SINGLE_REQUESTS:
            return False
        reference = single.seconds_per_item()
        return reference is not None and batched > reference

    def _saves_charges(self, level: int) -> bool:
        if self.request_limited:
            batched = self._evidence[level].requests_per_item()
            single = self._evidence[1].requests_per_item()
            return batched is None or batched < (single if single is not None else 1.0)
        if not self.per_token:
            return False
        batched = self._evidence[level].tokens_per_item()
        single = self._evidence[1].tokens_per_item()
        return batched is None or single is None or batched < single

    def _worth(self, level: int) -> bool:
        return not (self._slower(level) and not self._saves_charges(level))

    def _decide(self) -> int:
        best = 1
        for level in self.levels[1:]:
            if not self._supported(level):
                break
            if self._worth(level):
                best = level
        for level in self.levels:
            if level <= best:
                self._gap[level] = 1.0
        self._size = best
        self._target = self._probe_target()
        return best

    def _established(self, level: int) -> bool:
        return self._supported(level) and self._worth(level)

    def _probe_target(self) -> int | None:
        timed = self._evidence[self._size].requests > 0  # speed is reported at all
        if self._size > 1 and timed and self._evidence[1].requests < MIN_SINGLE_REQUESTS:
            if not self._saves_charges(self._size):
                return 1  # speed decides, and size 1 has not been timed enough
        return next((lv for lv in self.levels if lv > self._size and not self._established(lv)), None)

    def _looks_bad(self, level: int) -> bool:
        return level > 1 and (self._failed(level) or not self._worth(level))

    # --- explaining ----------------------------------------------------------------------

    def reason(self) -> str:
        """Why the size is what it is, in one line (for `promptbus stats`), e.g.
        "size 1: at size 2, batching agreed 71% < 80%" or
        "size 8: agreement 99% of 120, valid 100%, 7.0 requests saved per 8 jobs (max_items)"."""
        size = self._size
        if size == 1:
            if self.max_items == 1:
                return "size 1: max_items is 1"
            blocking = next((lv for lv in self.levels[1:] if not self._established(lv)), self.levels[1])
            return f"size 1: at size {blocking}, {self._why_not(blocking)}"
        e = self._evidence[size]
        parts = []
        if self.measure_agreement and e.compared > 0:
            parts.append(f"agreement {e.agreed / e.compared:.0%} of {e.compared:.0f}")
        elif size <= self.trusted:
            parts.append("configured" + (", agreement not yet measured" if self.measure_agreement else ""))
        if e.judged > 0:
            parts.append(f"valid {e.valid / e.judged:.0%}")
        per_item = (e.requests / e.answered) if e.answered > 0 else 1.0 / size
        parts.append(f"{size - per_item * size:.1f} requests saved per {size} jobs")
        speed = self._speed_text(size)
        if speed:
            parts.append(speed)
        if self.request_limited:
            parts.append("requests are limited")
        text = f"size {size}: " + ", ".join(parts)
        above = next((lv for lv in self.levels if lv > size), None)
        if above is not None and not self._established(above):
            text += f"; at size {above}, {self._why_not(above)}"
        elif size == self.max_items:
            text += " (max_items)"
        return text

    def _why_not(self, level: int) -> str:
        """Why `level` is not used (it is not established)."""
        e = self._evidence[level]
        p = self.min_agreement
        if e.judged > 0 and e.valid / e.judged < p:
            return f"batched answers valid {e.valid / e.judged:.0%} < {p:.0%}"
        if self.measure_agreement and e.compared > 0 and e.agreed / e.compared < p:
            return f"batching agreed {e.agreed / e.compared:.0%} < {p:.0%}"
        if not self._worth(level):
            return f"batching slower ({self._speed_text(level)}) and saves nothing the provider charges for"
        probing = f" (probing {self.probe_fraction:.0%} of jobs)" if self.probe_fraction > 0 else ""
        if self.measure_agreement:
            if e.compared == 0:
                return "agreement not measured yet" + probing
            return (
                f"batching agreed {e.agreed:.0f}/{e.compared:.0f}, "
                f"not yet {p:.0%} at {self.confidence:.0%} confidence" + probing
            )
        if e.judged == 0:
            return "not measured yet" + probing
        return (
            f"batched answers valid {e.valid:.0f}/{e.judged:.0f}, "
            f"not yet {p:.0%} at {self.confidence:.0%} confidence" + probing
        )

    def _speed_text(self, level: int) -> str:
        batched = self._evidence[level].items_per_s()
        single = self._evidence[1].items_per_s()
        if batched is None or single is None or self._evidence[1].requests < MIN_SINGLE_REQUESTS:
            return ""
        return f"{batched:.1f} vs {single:.1f} items/s alone"

    def __repr__(self) -> str:
        return f"AdaptiveBatchSize(size={self._size}, max_items={self.max_items}, probing={self.probing})"


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

    def size_at(self, key: K, now_s: float, *, request_limited: bool | None = None) -> int:
        """`AdaptiveBatchSize.size_at` for `key`."""
        return self.get(key).size_at(now_s, request_limited=request_limited)

    def record(self, key: K, verdict_kind: str, size: int, now_s: float) -> int:
        """`AdaptiveBatchSize.record` for `key`."""
        return self.get(key).record(verdict_kind, size, now_s)

    def record_agreement(self, key: K, agreed: int, compared: int, size: int, now_s: float) -> int:
        """`AdaptiveBatchSize.record_agreement` for `key`."""
        return self.get(key).record_agreement(agreed, compared, size, now_s)

    def record_speed(
        self, key: K, size: int, answered: int, elapsed_s: float, now_s: float, *, tokens: int = 0
    ) -> int:
        """`AdaptiveBatchSize.record_speed` for `key`."""
        return self.get(key).record_speed(size, answered, elapsed_s, now_s, tokens=tokens)

    def wants_verification(self, key: K, size: int) -> bool:
        """`AdaptiveBatchSize.wants_verification` for `key`."""
        return self.get(key).wants_verification(size)

    def snapshot(self) -> dict[K, int]:
        """Current size per key (for stats and metrics)."""
        return {key: t.size for key, t in self._sizes.items()}

    def explain(self) -> str:
        """The reason of the key with the largest size (the most recently used among equals),
        "" without keys."""
        if not self._sizes:
            return ""
        tracker = max(self._sizes.values(), key=lambda t: (t.size, t.last_used_s or 0.0))
        return tracker.reason()

    def expire(self, now_s: float, idle_s: float) -> list[K]:
        """Forget keys unused for `idle_s` or longer (batch keys come and go); returns them.

        A tracker never asked nor reported to holds nothing but its initial state and goes too.
        """
        gone = [
            key for key, t in self._sizes.items() if t.last_used_s is None or now_s - t.last_used_s >= idle_s
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
