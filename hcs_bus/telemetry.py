"""The one place that configures structlog and OpenTelemetry.

Logs: structlog with contextvars, JSON lines (or console for humans); every
event passes ``hcs_bus.redacting.redact_event`` last, so a NATS password or
token in a URL, an error or a traceback never reaches the output.
Traces: an OpenTelemetry TracerProvider; W3C ``traceparent`` travels in NATS
headers through ``hcs_bus.bus`` only. A part without ``otlp_endpoint``
starts no span of its own and passes no trace context on (``span``): its
spans would go nowhere, and unrecorded ones still cost the injector a
quarter of an admission's CPU back to back (``bench.webhook``). It still
follows a parent it is handed, so a trace an exporting part began keeps its
flag through it. Metrics: an OpenTelemetry MeterProvider exported to
Prometheus (``metrics_text()`` serves ``/metrics``), without exemplars (the
Prometheus text format carries none; offering one cost each measurement in
a recorded span over a third of its time).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from typing import Any, TypeVar

import structlog
from opentelemetry import metrics, trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.propagate import extract, inject
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased
from prometheus_client import REGISTRY, generate_latest, start_http_server

from hcs_bus.errors import ConfigError
from hcs_bus.redacting import redact_event
from hcs_bus.settings import TelemetrySettings

_configured = False
TRACEPARENT = "traceparent"
# Every duration histogram is in seconds (name ends in ``_seconds``, unit "s")
# with these buckets: 1 ms (a plan over core NATS) up to 5 min (a heal).
SECONDS_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip
_tracer_provider: trace.TracerProvider | None = None  # None: the global one
_own_roots = True  # False: configured without an exporter (``span`` starts no root)
_tracers: dict[tuple[str, int], tuple[trace.TracerProvider, trace.Tracer]] = {}
_zeroed: list[tuple[Counting, tuple[Mapping[str, str], ...]]] = []


def configure(settings: TelemetrySettings, *, service: str | None = None) -> None:
    """Configure logging, tracing and metrics once per process."""
    global _configured, _own_roots
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
    _own_roots = bool(settings.otlp_endpoint)
    if settings.otlp_endpoint:  # OTEL_TRACES_SAMPLER, when set, picks the sampler
        provider = TracerProvider(resource=resource)
        exporter = OTLPSpanExporter(endpoint=settings.otlp_endpoint.rstrip("/") + "/v1/traces")
        provider.add_span_processor(BatchSpanProcessor(exporter))
    else:
        provider = TracerProvider(resource=resource, sampler=ParentBased(ALWAYS_OFF))
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(
        MeterProvider(
            resource=resource,
            metric_readers=[PrometheusMetricReader(scope_info_enabled=False)],
            exemplar_filter=AlwaysOffExemplarFilter(),
        )
    )
    for counter, label_sets in _zeroed:
        _add_zeros(counter, label_sets)
    if settings.metrics_port:
        # Every part serves /metrics here (``hcs up`` gives each its own port);
        # the scheduler and injector also serve it on their own HTTP servers.
        try:
            start_http_server(settings.metrics_port)
        except OSError as exc:
            raise ConfigError(
                f"telemetry.metrics_port {settings.metrics_port}: {exc.strerror or exc}"
            ) from exc


def logger(name: str) -> Any:
    return structlog.get_logger(name)


def tracer(name: str) -> trace.Tracer:
    """The tracer ``name`` of the current provider, made once: the SDK's
    ``get_tracer`` builds a new one per call (about a third of a span's cost)."""
    provider = _tracer_provider or trace.get_tracer_provider()
    key = (name, id(provider))
    found = _tracers.get(key)
    if found is None or found[0] is not provider:
        found = _tracers[key] = (provider, trace.get_tracer(name, tracer_provider=provider))
    return found[1]


@contextmanager
def tracing_into(provider: trace.TracerProvider) -> Iterator[None]:
    """Spans started inside go to ``provider`` (tests: an in-memory exporter)."""
    global _tracer_provider
    held, _tracer_provider = _tracer_provider, provider
    try:
        yield
    finally:
        _tracer_provider = held


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


_NO_LABELS: frozenset[tuple[str, Any]] = frozenset()
_log = structlog.get_logger("hcs.telemetry")


class TallyCounter:
    """A monotonic counter kept in this process and read when metrics are
    collected: ``add`` is one dict update, where the SDK's ``Counter.add``
    validates and hashes its attributes and walks its measurement path on
    every event (about 8 µs: for the counters of every bind and plan, 2 %
    of the scheduler's CPU under a burst). Exported as an observable counter
    of the same name, description and labels, so it reads as one."""

    def __init__(self, name: str, *, description: str, meter_name: str = "hcs") -> None:
        self.name = name
        self._counts: dict[frozenset[tuple[str, Any]], float] = {}
        meter(meter_name).create_observable_counter(
            name, callbacks=[self._observe], description=description
        )

    def add(self, amount: float, attributes: Mapping[str, Any] | None = None) -> None:
        if amount < 0:  # as the SDK's counter: dropped, and said
            _log.warning("counter_decrement_dropped", counter=self.name, amount=amount)
            return
        key = frozenset(attributes.items()) if attributes else _NO_LABELS
        self._counts[key] = self._counts.get(key, 0) + amount

    def _observe(self, _options: CallbackOptions) -> list[Observation]:
        # a copy first: the collector may run on the metrics server's thread
        return [Observation(value, dict(key)) for key, value in self._counts.copy().items()]


Counting = metrics.Counter | TallyCounter
C = TypeVar("C", metrics.Counter, TallyCounter)


def zero_init(counter: C, *label_sets: Mapping[str, str]) -> C:
    """Export ``counter`` at 0 for each label set before its first event (so
    ``rate()`` has a series to start from); applied once telemetry is configured."""
    sets = label_sets or ({},)
    _zeroed.append((counter, sets))
    if _configured:
        _add_zeros(counter, sets)
    return counter


def _add_zeros(counter: Counting, label_sets: tuple[Mapping[str, str], ...]) -> None:
    for labels in label_sets:
        counter.add(0, dict(labels))


@contextmanager
def span(
    name: str,
    *,
    traceparent: str | None = None,
    headers: Mapping[str, str] | None = None,
    attributes: Mapping[str, Any] | None = None,
) -> Iterator[None]:
    """A span around a block: a child of ``traceparent`` (W3C) or of the
    context in message ``headers`` when given, else of the current span.

    With no parent of either kind, in a part configured without an exporter
    (``otlp_endpoint``), no span at all: a root there is never recorded, and
    the unsampled context it would pass on only stops the parts after it
    from recording roots of their own."""
    carrier = dict(headers or {}) | ({TRACEPARENT: traceparent} if traceparent else {})
    if TRACEPARENT not in carrier and not _roots_here():
        yield
        return
    parent = extract(carrier) if carrier else None
    with tracer("hcs").start_as_current_span(name, context=parent, attributes=attributes):
        yield


def _roots_here() -> bool:
    """Whether a span with no parent handed to it is started: in a part with
    an exporter (or under ``tracing_into``), or inside a span already open."""
    if _own_roots or _tracer_provider is not None:
        return True
    return trace.get_current_span().get_span_context().is_valid


def current_traceparent() -> str | None:
    """The current span's W3C ``traceparent``, if a span is recording."""
    return inject_headers({}).get(TRACEPARENT)


@contextmanager
def consuming(deliveries: Iterable[tuple[str, Mapping[str, str] | None]]) -> Iterator[None]:
    """A consumer span per message that carries a ``traceparent``, each a child
    of its publisher's span, open while the handler runs (the bus wrappers
    only: handlers never touch OpenTelemetry). Messages published without a
    trace open none, so a replay of untraced fingerprints costs nothing."""
    with ExitStack() as stack:
        for subject, headers in deliveries:
            if not headers or TRACEPARENT not in headers:
                continue
            stack.enter_context(
                tracer("hcs.bus").start_as_current_span(
                    f"consume {subject}",
                    context=extract(dict(headers)),
                    kind=trace.SpanKind.CONSUMER,
                    attributes={"messaging.destination.name": subject},
                )
            )
        yield
