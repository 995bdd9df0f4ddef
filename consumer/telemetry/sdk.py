"""The OpenTelemetry SDK's providers, made from its own environment variables.

Which exporters run is the SDK's `OTEL_TRACES_EXPORTER` / `OTEL_METRICS_EXPORTER` (a comma
list; `none` or unset: off). A name is looked up among the installed exporters the way the
SDK's own auto-configuration does, in the `opentelemetry_traces_exporter` /
`opentelemetry_metrics_exporter` entry points (`console`, `otlp_proto_http`, and whatever else
is installed); `otlp` is the exporter of the OTLP protocol that
`OTEL_EXPORTER_OTLP_{TRACES,METRICS}_PROTOCOL` or `OTEL_EXPORTER_OTLP_PROTOCOL` names, and
HTTP/protobuf (the one promptbus installs) when neither is set.

Every exporter is made without arguments, so it reads the rest of its configuration itself,
as the SDK documents it: `OTEL_EXPORTER_OTLP_ENDPOINT` (`/v1/traces`, `/v1/metrics` appended)
or the per-signal `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used as given), `..._HEADERS`,
`..._TIMEOUT`, `..._COMPRESSION`, `..._CERTIFICATE`; the span processor reads `OTEL_BSP_*`,
the metric reader `OTEL_METRIC_EXPORT_INTERVAL` / `_TIMEOUT`, the tracer provider
`OTEL_TRACES_SAMPLER`. A name that is not installed, or a protocol that is not, is logged
and that exporter stays off: telemetry never stops the service.
"""

from __future__ import annotations

import logging
import os
from importlib.metadata import entry_points
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from consumer import __version__

log = logging.getLogger(__name__)

TRACES, METRICS = "traces", "metrics"
_EXPORTER_VARIABLE = {TRACES: "OTEL_TRACES_EXPORTER", METRICS: "OTEL_METRICS_EXPORTER"}
_PROTOCOL_VARIABLE = {
    TRACES: "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    METRICS: "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
}
_ENTRY_POINTS = {TRACES: "opentelemetry_traces_exporter", METRICS: "opentelemetry_metrics_exporter"}
#: the entry point the OTel exporter package of each OTLP protocol registers
_OTLP_BY_PROTOCOL = {"http/protobuf": "otlp_proto_http", "grpc": "otlp_proto_grpc"}
#: the protocol of `otlp` when no variable names one: the one promptbus installs
DEFAULT_OTLP_PROTOCOL = "http/protobuf"
#: what to install for an exporter that is not (the grpc one is left out of promptbus's install)
_PACKAGE_OF = {"otlp_proto_grpc": "opentelemetry-exporter-otlp-proto-grpc"}
#: the service name when neither OTEL_SERVICE_NAME nor OTEL_RESOURCE_ATTRIBUTES names one
SERVICE_NAME = "promptbus"


def exporters_from_env(signal: str) -> list[Any]:
    """The exporters the signal's OTEL_*_EXPORTER variable names, made (empty: off)."""
    variable = _EXPORTER_VARIABLE[signal]
    names = [n.strip().lower() for n in os.environ.get(variable, "").split(",")]
    exporters = []
    for name in names:
        if name in ("", "none"):
            continue
        entry = _entry_point_name(signal, name)
        if entry is None:
            continue
        exporter = _make(signal, name, entry)
        if exporter is not None:
            exporters.append(exporter)
    return exporters


def _entry_point_name(signal: str, name: str) -> str | None:
    """The entry point of an exporter name: `otlp` by the protocol variables, else the name."""
    if name != "otlp":
        return name
    protocol = os.environ.get(_PROTOCOL_VARIABLE[signal]) or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    protocol = (protocol or DEFAULT_OTLP_PROTOCOL).strip().lower()
    entry = _OTLP_BY_PROTOCOL.get(protocol)
    if entry is None:
        log.warning(
            "%s=otlp: OTLP protocol %r is not one the SDK exports (http/protobuf or grpc); "
            "%s export stays off",
            _EXPORTER_VARIABLE[signal], protocol, signal,
        )
    return entry


def _make(signal: str, name: str, entry: str) -> Any:
    """The installed exporter of entry point `entry`, made from its env variables (None: not
    installed, or it refused its configuration)."""
    variable = _EXPORTER_VARIABLE[signal]
    found = list(entry_points(group=_ENTRY_POINTS[signal], name=entry))
    if not found:
        package = _PACKAGE_OF.get(entry)
        hint = f" (it needs {package})" if package else ""
        log.warning("%s names %r: no such exporter is installed%s; it stays off", variable, name, hint)
        return None
    try:
        return found[0].load()()
    except Exception as exc:  # a bad OTEL_EXPORTER_* value: the service runs without this export
        log.warning("%s exporter %r cannot be made (%s); it stays off", signal, name, type(exc).__name__)
        return None


def service_resource(instance: str | None = None) -> Resource:
    """The resource every signal carries: the SDK's (OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME
    and its detectors), with `service.name` promptbus, `service.version` and
    `service.instance.id` (the instance id `promptbus stats` shows) where those name none."""
    chosen = OTELResourceDetector().detect().attributes
    own: dict[str, str] = {}
    if "service.name" not in chosen:
        own["service.name"] = SERVICE_NAME
    if "service.version" not in chosen:
        own["service.version"] = __version__
    if instance is not None and "service.instance.id" not in chosen:
        own["service.instance.id"] = instance
    return Resource.create().merge(Resource(own))


def tracer_provider_from_env(resource: Resource | None = None) -> TracerProvider | None:
    """A TracerProvider exporting in batches to each exporter OTEL_TRACES_EXPORTER names; None
    when it names none (tracing off)."""
    exporters = exporters_from_env(TRACES)
    if not exporters:
        return None
    provider = TracerProvider(resource=resource if resource is not None else service_resource())
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def meter_provider_from_env(resource: Resource | None = None) -> MeterProvider | None:
    """A MeterProvider exporting periodically (every OTEL_METRIC_EXPORT_INTERVAL ms, 60 s by
    default) to each exporter OTEL_METRICS_EXPORTER names; None when it names none."""
    exporters = exporters_from_env(METRICS)
    if not exporters:
        return None
    # a pull exporter (Prometheus') is a reader itself; a push exporter is read periodically
    readers = [e if isinstance(e, MetricReader) else PeriodicExportingMetricReader(e) for e in exporters]
    return MeterProvider(
        metric_readers=readers, resource=resource if resource is not None else service_resource()
    )
