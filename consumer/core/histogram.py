"""Latency histograms: fixed buckets, merged by bucket, read as quantiles.

A `Histogram` counts observations into buckets with fixed upper bounds, the way Prometheus
does (`le`: a value equal to a bound counts in that bound's bucket; the last bucket, +Inf,
takes the rest). Counts are kept per bucket (not cumulative) so that merging the histograms
of several instances is adding counts bucket by bucket (`merge_histograms`), and a quantile
is read from the merged counts the way PromQL's `histogram_quantile` reads them
(`quantile`: linear inside the bucket the rank falls in).

`observe` allocates nothing: one bisect over the bounds and two additions.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "OFFLINE_BOUNDS_S",
    "ONLINE_BOUNDS_S",
    "Histogram",
    "histogram_from_dict",
    "merge_histograms",
    "quantile",
]

#: online work: a cached answer in tens of ms, a long generation or a queue behind a
#: provider's rate limit in minutes
ONLINE_BOUNDS_S: tuple[float, ...] = (
    0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip
#: offline (provider Batch API) work: minutes to the 24 h completion window
OFFLINE_BOUNDS_S: tuple[float, ...] = (
    60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 43200.0, 86400.0,
)  # fmt: skip


class Histogram:
    """Counts per bucket (`counts[i]`: values <= bounds[i] and above the bound before it;
    `counts[-1]`: above the last bound) and the sum of the observed values."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(
        self, bounds: Sequence[float], counts: Sequence[int] | None = None, total: float = 0.0
    ) -> None:
        if list(bounds) != sorted(set(bounds)):
            raise ValueError(f"histogram bounds must increase strictly: {list(bounds)}")
        self.bounds: tuple[float, ...] = tuple(bounds)
        if counts is None:
            self.counts = [0] * (len(self.bounds) + 1)
        elif len(counts) != len(self.bounds) + 1:
            raise ValueError(
                f"histogram has {len(self.bounds)} bounds but {len(counts)} counts (want bounds + 1)"
            )
        else:
            self.counts = list(counts)
        self.sum = total

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def observe_all(self, values: Sequence[float]) -> None:
        """`observe` each of `values` (the members of one request, in one call)."""
        counts, bounds, total = self.counts, self.bounds, self.sum
        for value in values:
            counts[bisect_left(bounds, value)] += 1
            total += value
        self.sum = total

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations <= it) per bucket, +Inf last: Prometheus's `_bucket` series."""
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"bounds": list(self.bounds), "counts": list(self.counts), "sum": self.sum}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Histogram):
            return NotImplemented
        return self.bounds == other.bounds and self.counts == other.counts and self.sum == other.sum

    def __repr__(self) -> str:
        return f"Histogram(bounds={self.bounds}, counts={self.counts}, sum={self.sum})"


def histogram_from_dict(value: Mapping[str, Any]) -> Histogram:
    """The inverse of `Histogram.as_dict`; ValueError naming what is wrong."""
    try:
        bounds = [float(b) for b in value["bounds"]]
        counts = [int(c) for c in value["counts"]]
        total = float(value.get("sum", 0.0))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"histogram needs bounds, counts and sum: {exc}") from None
    if any(c < 0 for c in counts):
        raise ValueError("histogram counts must not be negative")
    return Histogram(bounds, counts, total)


def merge_histograms(histograms: Iterable[Histogram]) -> Histogram | None:
    """One histogram with every input's observations (counts added bucket by bucket); None
    when there is none. All must have the same bounds (ValueError otherwise)."""
    merged: Histogram | None = None
    for h in histograms:
        if merged is None:
            merged = Histogram(h.bounds, h.counts, h.sum)
            continue
        if h.bounds != merged.bounds:
            raise ValueError(f"cannot merge histograms with different bounds: {merged.bounds} and {h.bounds}")
        merged.counts = [a + b for a, b in zip(merged.counts, h.counts, strict=True)]
        merged.sum += h.sum
    return merged


def quantile(h: Histogram, q: float) -> float | None:
    """The q-quantile (0 <= q <= 1) as PromQL's `histogram_quantile` estimates it: linear
    between the bounds of the bucket the rank falls in (the first bucket starts at 0); a
    rank in the +Inf bucket gives the largest finite bound. None without observations."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be between 0 and 1, not {q}")
    total = h.count
    if total == 0:
        return None
    rank = q * total
    running = 0
    lower = 0.0
    for i, n in enumerate(h.counts):
        if running + n >= rank and n > 0:
            if i == len(h.bounds):
                return h.bounds[-1] if h.bounds else 0.0
            upper = h.bounds[i]
            return lower + (upper - lower) * (rank - running) / n
        running += n
        if i < len(h.bounds):
            lower = h.bounds[i]
    return h.bounds[-1] if h.bounds else 0.0
