"""Telemetry is configured in one place: traces leave by OTLP, metrics are scraped."""

from __future__ import annotations

import http.server
import re
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hcs_bus.natsserver import free_port


class _Receiver(http.server.BaseHTTPRequestHandler):
    seen: list[tuple[str, str, int]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.seen.append((self.path, self.headers.get("Content-Type", ""), len(body)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *_args: object) -> None:
        return


@pytest.fixture
def collector() -> Iterator[tuple[int, list[tuple[str, str, int]]]]:
    _Receiver.seen = []
    server = http.server.HTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], _Receiver.seen
    server.shutdown()


def test_spans_are_exported_over_otlp_and_metrics_are_served(
    collector: tuple[int, list[tuple[str, str, int]]],
) -> None:
    port, seen = collector
    metrics_port = free_port()
    script = textwrap.dedent(
        f"""
        import time, urllib.request
        from opentelemetry import trace
        from hcs_bus.settings import TelemetrySettings
        from hcs_bus.telemetry import configure, tracer
        from hcs_bus import bus  # registers the hcs_bus counters
        configure(TelemetrySettings(otlp_endpoint="http://127.0.0.1:{port}",
                                    metrics_port={metrics_port}, log_level="error"))
        with tracer("test").start_as_current_span("admission"):
            pass
        bus.DEAD_LETTERS.add(1, {{"subject_family": "hcs.fp"}})
        trace.get_tracer_provider().force_flush()
        page = urllib.request.urlopen("http://127.0.0.1:{metrics_port}/metrics").read().decode()
        print("DLQ" if "hcs_bus_dead_letters" in page else "NO-DLQ",
              "SCOPE-LABELS" if "otel_scope_" in page else "NO-SCOPE-LABELS")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "DLQ NO-SCOPE-LABELS"  # no empty otel_scope_* labels
    assert any(
        path == "/v1/traces" and "protobuf" in ctype and size > 0 for path, ctype, size in seen
    ), seen


def test_without_an_exporter_no_span_is_started_here_but_a_parent_is_followed() -> None:
    done = _run(
        """
        from opentelemetry import trace
        from hcs_bus.settings import TelemetrySettings
        from hcs_bus.telemetry import configure, current_traceparent, span
        configure(TelemetrySettings(log_level="error"))
        with span("admission"):
            print(trace.get_current_span().get_span_context().is_valid, current_traceparent())
        sampled = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
        with span("bind", traceparent=sampled):
            outer = current_traceparent()
            with span("reserve"):
                print(trace.get_current_span().is_recording(), outer, current_traceparent())
        """
    )
    assert done.returncode == 0, done.stderr
    own, followed = done.stdout.split("\n")[:2]
    # a root of its own is not started: no context to pass on
    assert own.split() == ["False", "None"]
    recording, outer, inner = followed.split()
    # a parent handed in is followed, and a span inside it is its child
    assert recording == "True" and outer.startswith("00-" + "ab" * 16 + "-")
    assert inner.startswith("00-" + "ab" * 16 + "-") and inner != outer
    assert int(inner.rsplit("-", 1)[1], 16) & 1 == 1  # and keeps its sampled flag


def _run(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=60
    )


def test_duration_histograms_are_in_seconds_with_second_scale_buckets() -> None:
    done = _run(
        """
        from hcs_bus.settings import TelemetrySettings
        from hcs_bus.telemetry import configure, metrics_text
        from injector import serving
        from scheduler.ledger import reservation_store as booking
        from scheduler.plan import service as plans
        from healer import healing
        configure(TelemetrySettings(log_level="error"))
        for histogram in (serving.LATENCY, plans.PLAN_SECONDS, booking.BIND_SECONDS,
                          healing.REACTION_SECONDS):
            histogram.record(0.003)
        print(metrics_text().decode())
        """
    )
    assert done.returncode == 0, done.stderr
    for name in (
        "hcs_injector_admission_seconds",
        "hcs_scheduler_plan_seconds",
        "hcs_scheduler_bind_seconds",
        "hcs_healer_reaction_seconds",
    ):
        buckets = re.findall(rf'^{name}_bucket{{.*le="([^"]+)"', done.stdout, re.M)
        bounds = [float(b) for b in buckets if b != "+Inf"]
        assert bounds and min(bounds) <= 0.001 and max(bounds) <= 300.0, (name, bounds)
        # 3 ms lands in the 5 ms bucket, not in the first (millisecond-scale) one
        counts = dict(re.findall(rf'^{name}_bucket{{.*le="([^"]+)".*}} (\S+)$', done.stdout, re.M))
        assert float(counts["0.0025"]) == 0.0 and float(counts["0.005"]) == 1.0, (name, counts)


def test_a_metrics_port_already_taken_is_one_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _run(
            f"""
            from hcs_bus.errors import ConfigError
            from hcs_bus.settings import TelemetrySettings
            from hcs_bus.telemetry import configure
            try:
                configure(TelemetrySettings(metrics_port={port}, log_level="error"))
            except ConfigError as exc:
                print(exc)
            """
        )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"telemetry.metrics_port {port}: "), done.stdout


def test_a_tally_counter_reads_as_a_counter_of_the_same_name_and_labels() -> None:
    from hcs_bus.telemetry import TallyCounter, metrics_text, zero_init

    tally = zero_init(
        TallyCounter("hcs_test_tallied", description="things tallied", meter_name="hcs.test"),
        {"verb": "bind"},
    )
    for verb in ("filter", "filter", "bind"):
        tally.add(1, {"verb": verb})
    tally.add(2, {"verb": "filter"})
    tally.add(-5, {"verb": "filter"})  # a counter never goes down: dropped
    tally.add(0, {"verb": "preempt"})  # exported at zero before its first event
    found = {
        sample.labels["verb"]: sample.value
        for family in text_string_to_metric_families(metrics_text().decode())
        if family.name == "hcs_test_tallied" and family.type == "counter"
        for sample in family.samples
        if sample.name == "hcs_test_tallied_total"
    }
    assert found == {"filter": 4.0, "bind": 1.0, "preempt": 0.0}
