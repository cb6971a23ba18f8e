"""Telemetry is configured in one place: traces leave by OTLP, metrics are scraped."""

from __future__ import annotations

import http.server
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator

import pytest

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
        print("DLQ" if "hcs_bus_dead_letters" in page else "NO-DLQ")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "DLQ"
    assert any(
        path == "/v1/traces" and "protobuf" in ctype and size > 0 for path, ctype, size in seen
    ), seen
