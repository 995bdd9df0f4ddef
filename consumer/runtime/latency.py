"""Latency histograms of the service: one table (`HISTOGRAMS`), one `observe` per event, read
by Prometheus `/metrics` (`consumer.runtime.metrics`), OpenTelemetry and the stats snapshot.

    promptbus_job_latency_seconds{tier,lane,outcome}          record timestamp -> outcome
    promptbus_offline_job_latency_seconds{tier,lane,outcome}  the same for offline jobs
    promptbus_queue_wait_seconds{tier,lane}                   record read -> first send
    promptbus_tenant_queue_wait_seconds{tenant}               the same, per tenant account
    promptbus_provider_request_seconds{tier,outcome,deployment}  one provider call

A series (one combination of label values) is created on first use and kept. The hot paths
hold on to their series (`child`), keyed by what varies (a per-tier runner keeps its tier's
series by lane and outcome), so an observation is `Histogram.observe` (a bisect, two
additions) and allocates nothing. OpenTelemetry has no observable histogram, so once
`bind_otel` has made its instruments each observation is also recorded there, with the
series' attributes made once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from consumer.core.histogram import OFFLINE_BOUNDS_S, ONLINE_BOUNDS_S, Histogram
from consumer.core.lanes import DEFAULT_LANE_NAME
from consumer.core.snapshots import JOB_LATENCY_FAMILY, OFFLINE_JOB_LATENCY_FAMILY

#: the lane of a job read from the one jobs topic (no `lanes:` in the tier file)
DEFAULT_LANE = DEFAULT_LANE_NAME
#: `outcome` of job latencies
RESULT, DEAD_LETTER = "result", "dead_letter"
#: `outcome` of provider requests
OK, RATE_LIMITED, ERROR = "ok", "rate_limited", "error"


@dataclass(frozen=True, slots=True)
class HistogramSpec:
    """One histogram family: `promptbus_<name>` in Prometheus, `promptbus.<name>` in OTel."""

    name: str
    help: str
    labels: tuple[str, ...]
    bounds: tuple[float, ...]


JOB_LATENCY = HistogramSpec(
    JOB_LATENCY_FAMILY,
    "Online jobs: the job record's Kafka timestamp to its outcome handed over for delivery",
    ("tier", "lane", "outcome"),
    ONLINE_BOUNDS_S,
)
OFFLINE_JOB_LATENCY = HistogramSpec(
    OFFLINE_JOB_LATENCY_FAMILY,
    "Offline (Batch API) jobs: the job record's Kafka timestamp to its outcome acknowledged",
    ("tier", "lane", "outcome"),
    OFFLINE_BOUNDS_S,
)
QUEUE_WAIT = HistogramSpec(
    "queue_wait_seconds",
    "The job record read to the first send of a request carrying it (window, limiter, circuit)",
    ("tier", "lane"),
    ONLINE_BOUNDS_S,
)
TENANT_QUEUE_WAIT = HistogramSpec(
    "tenant_queue_wait_seconds",
    "The job record read to the first send of a request carrying it, per tenant (named ones, "
    "default, other)",
    ("tenant",),
    ONLINE_BOUNDS_S,
)
PROVIDER_REQUEST = HistogramSpec(
    "provider_request_seconds",
    "One provider call, by outcome (ok, rate_limited, error) and the tier's deployment",
    ("tier", "outcome", "deployment"),
    ONLINE_BOUNDS_S,
)
HISTOGRAMS: tuple[HistogramSpec, ...] = (
    JOB_LATENCY,
    OFFLINE_JOB_LATENCY,
    QUEUE_WAIT,
    TENANT_QUEUE_WAIT,
    PROVIDER_REQUEST,
)


class Series:
    """One series of a family: its histogram and, once bound, its OpenTelemetry instrument."""

    __slots__ = ("attributes", "histogram", "instrument")

    def __init__(self, spec: HistogramSpec, values: tuple[str, ...], instrument: Any) -> None:
        self.histogram = Histogram(spec.bounds)
        self.attributes = dict(zip(spec.labels, values, strict=True))
        self.instrument = instrument

    def observe(self, seconds: float) -> None:
        self.histogram.observe(seconds)
        if self.instrument is not None:
            self.instrument.record(seconds, self.attributes)

    def observe_all(self, seconds: Sequence[float]) -> None:
        """`observe` each of `seconds`, in one call."""
        self.histogram.observe_all(seconds)
        if self.instrument is not None:
            for value in seconds:
                self.instrument.record(value, self.attributes)


class LatencyHistograms:
    """The service's histograms, per family and label values."""

    __slots__ = ("_instruments", "_series")

    def __init__(self) -> None:
        self._series: dict[HistogramSpec, dict[tuple[str, ...], Series]] = {spec: {} for spec in HISTOGRAMS}
        self._instruments: dict[HistogramSpec, Any] = {}

    def child(self, spec: HistogramSpec, values: tuple[str, ...]) -> Series:
        """The series of these label values (in the order of `spec.labels`), made on first use."""
        family = self._series[spec]
        series = family.get(values)
        if series is None:
            series = family[values] = Series(spec, values, self._instruments.get(spec))
        return series

    def observe(self, spec: HistogramSpec, values: tuple[str, ...], seconds: float) -> None:
        """One observation (where no series is held on to)."""
        self.child(spec, values).observe(seconds)

    def series(self, spec: HistogramSpec) -> list[tuple[tuple[str, ...], Histogram]]:
        """(label values, histogram) of every series of a family, sorted by label values."""
        return [(values, s.histogram) for values, s in sorted(self._series[spec].items())]

    def bind_otel(self, meter: Any) -> None:
        """Make an OpenTelemetry histogram per family (same bucket bounds); every observation
        from now on is recorded there too."""
        for spec in HISTOGRAMS:
            instrument = meter.create_histogram(
                "promptbus." + spec.name,
                unit="s",
                description=spec.help,
                explicit_bucket_boundaries_advisory=list(spec.bounds),
            )
            self._instruments[spec] = instrument
            for s in self._series[spec].values():
                s.instrument = instrument

    def snapshot(self) -> dict[str, list[dict[str, Any]]]:
        """Per family name: each series' labels and bucket counts (the stats record's part
        `promptbus stats` merges across instances)."""
        return {
            spec.name: [
                {"labels": dict(zip(spec.labels, values, strict=True)), **h.as_dict()}
                for values, h in self.series(spec)
            ]
            for spec in HISTOGRAMS
        }
