"""The batch size of a (tier, batch key) decided from its evidence, and the map of them per key.

The size in use is the largest level whose every level from 2 up is supported by measured
evidence (or trusted by the configuration) and worth it; else 1, ordinary requests. A share
of the jobs probes the next level so evidence keeps coming in. docs/batching-adaptive.md
states the rule in full and how the runtime calls these objects.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from consumer.core.adaptive.evidence import (
    INVALID_KINDS,
    VALID_KIND,
    LevelEvidence,
    levels_for,
    wilson_bounds,
)

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
#: single requests are not probed again until one of the last such probe reports, or this
#: long after it went out (its requests may fail)
PROBE_PATIENCE_S = 60.0

K = TypeVar("K", bound=Hashable)


class AdaptivePackSize:
    """The batch size of one (tier, batch key), decided from evidence (docs/batching-adaptive.md).

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
        self._evidence = {level: LevelEvidence() for level in self.levels}
        #: the provider limits requests (the tier learnt a request budget)
        self.request_limited = False
        self._credit = 0.0
        self._gap = dict.fromkeys(self.levels, 1.0)
        #: levels whose gap grew since their last probe (one backoff per probe's evidence)
        self._backed_off: set[int] = set()
        self._probe_size = 1
        self._probe_left = 0
        #: when the last probe of single requests went out, until one of them reports
        self._single_probe_s: float | None = None
        #: probes started (for stats and tests)
        self.probes = 0
        #: last time anything was reported or asked (for `AdaptiveSizes.expire`)
        self.last_used_s: float | None = None
        #: reports counted so far, restored evidence included ("Remembered evidence" in the docs)
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
        probe runs. Asked once per job: that is how probes count their share.

        request_limited: whether the provider limits requests (None: as last told).
        """
        self.last_used_s = now_s
        if request_limited is not None and request_limited != self.request_limited:
            self.request_limited = request_limited
            self._size = self._decide()
        if self._probe_left > 0:
            self._credit += self.probe_fraction  # a probe's own jobs count towards the share
            self._probe_left -= 1
            return self._probe_size
        target = self._target
        if target is None or self.probe_fraction == 0.0:
            self._credit = 0.0
            return self._size
        if target == 1 and self._single_probe_s is not None:
            if now_s - self._single_probe_s < PROBE_PATIENCE_S:
                # jobs are routed long before their answers come back (a backlog fills the
                # windows): one probe's answers time single requests, and each probe more
                # before they are in sends a batch's worth of jobs alone for nothing
                return self._size
            self._single_probe_s = None
        self._credit += self.probe_fraction
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
        if target == 1:
            self._single_probe_s = now_s
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
        level = self.level_of(size)
        if level == 1:
            self._single_probe_s = None
        self._evidence[level].add_speed(answered, elapsed_s, tokens)
        self.changes += 1
        self._size = self._decide()
        return self._size

    # --- remembering ----------------------------------------------------------------------

    def export(self) -> dict[str, Any]:
        """The evidence and probe gaps per level, JSON-ready (restored by `restore`)."""
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
        evidence: dict[int, LevelEvidence] = {}
        gaps: dict[int, float] = {}
        backed_off: set[int] = set()
        for name, data in levels.items():
            if not (isinstance(name, str) and name.isdigit()) or not isinstance(data, Mapping):
                raise ValueError(f"level {name!r} must be a size with an object of evidence")
            level = int(name)
            if level not in self._evidence:
                continue  # another max_items: that size is not tried here
            try:
                evidence[level] = LevelEvidence.restored(data)
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
        return f"AdaptivePackSize(size={self._size}, max_items={self.max_items}, probing={self.probing})"


class AdaptiveSizes(Generic[K]):
    """One `AdaptivePackSize` per key (e.g. (tier, batch key)), created on first use by `factory`."""

    def __init__(self, factory: Callable[[K], AdaptivePackSize]) -> None:
        self._factory = factory
        self._sizes: dict[K, AdaptivePackSize] = {}

    def get(self, key: K) -> AdaptivePackSize:
        """The size tracker of `key` (created by the factory the first time)."""
        tracker = self._sizes.get(key)
        if tracker is None:
            tracker = self._sizes[key] = self._factory(key)
        return tracker

    def size_at(self, key: K, now_s: float, *, request_limited: bool | None = None) -> int:
        """`AdaptivePackSize.size_at` for `key`."""
        return self.get(key).size_at(now_s, request_limited=request_limited)

    def record(self, key: K, verdict_kind: str, size: int, now_s: float) -> int:
        """`AdaptivePackSize.record` for `key`."""
        return self.get(key).record(verdict_kind, size, now_s)

    def record_agreement(self, key: K, agreed: int, compared: int, size: int, now_s: float) -> int:
        """`AdaptivePackSize.record_agreement` for `key`."""
        return self.get(key).record_agreement(agreed, compared, size, now_s)

    def record_speed(
        self, key: K, size: int, answered: int, elapsed_s: float, now_s: float, *, tokens: int = 0
    ) -> int:
        """`AdaptivePackSize.record_speed` for `key`."""
        return self.get(key).record_speed(size, answered, elapsed_s, now_s, tokens=tokens)

    def wants_verification(self, key: K, size: int) -> bool:
        """`AdaptivePackSize.wants_verification` for `key`."""
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
