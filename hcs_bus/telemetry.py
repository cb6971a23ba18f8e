"""The one place that configures structlog and OpenTelemetry.

Logs: structlog with contextvars, JSON lines (or console for humans); every
event passes ``hcs_bus.redacting.redact_event`` last, so a NATS password or
token in a URL, an error or a traceback never reaches the output.
Traces: an OpenTelemetry TracerProvider; W3C ``traceparent`` travels in NATS
headers through ``hcs_bus.bus`` only. Metrics: an OpenTelemetry MeterProvider
exported to Prometheus (``metrics_text()`` serves ``/metrics``).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

import structlog
from opentelemetry import metrics, trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.propagate import extract, inject
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from prometheus_client import REGISTRY, generate_latest, start_http_server

from hcs_bus.redacting import redact_event
from hcs_bus.settings import TelemetrySettings

_configured = False


def configure(settings: TelemetrySettings, *, service: str | None = None) -> None:
    """Configure logging, tracing and metrics once per process."""
    global _configured
    level = logging.getLevelNamesMapping().get(settings.log_level.upper(), logging.INFO)
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if settings.log_format == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            redact_event,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    if _configured:
        return
    _configured = True
    resource = Resource.create({"service.name": service or settings.service_name})
    provider = TracerProvider(resource=resource)
    if settings.otlp_endpoint:
        exporter = OTLPSpanExporter(endpoint=settings.otlp_endpoint.rstrip("/") + "/v1/traces")
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(
        MeterProvider(resource=resource, metric_readers=[PrometheusMetricReader()])
    )
    if settings.metrics_port:
        # Parts without an HTTP server of their own (agent, healer, mirror)
        # serve /metrics here; the scheduler and injector also serve it on theirs.
        start_http_server(settings.metrics_port)


def logger(name: str) -> Any:
    return structlog.get_logger(name)


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)


def meter(name: str) -> metrics.Meter:
    return metrics.get_meter(name)


def inject_headers(headers: dict[str, str]) -> dict[str, str]:
    """Add the current span's W3C ``traceparent`` (and ``tracestate``)."""
    inject(headers)
    return headers


def extract_context(headers: dict[str, str] | None) -> Any:
    return extract(headers or {})


def metrics_text() -> bytes:
    """Prometheus exposition of every metric of this process."""
    return generate_latest(REGISTRY)


def observe_counter(
    name: str, read: Callable[[], float], *, description: str, meter_name: str = "hcs"
) -> None:
    """A monotonic counter read when metrics are scraped (no cost per event)."""

    def callback(_options: CallbackOptions) -> list[Observation]:
        return [Observation(read())]

    meter(meter_name).create_observable_counter(name, callbacks=[callback], description=description)
