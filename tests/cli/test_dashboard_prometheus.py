"""The Grafana dashboard is right against a real Prometheus scraping `hcs up`:
every part's /metrics is on the port `hcs up` announces, and every panel's
query returns series that carry the labels the panel groups by."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from hcs_bus.natsserver import free_port
from tests.cli.fleets import demo_fleet

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy/base/grafana/hcs-dashboard.json"
PROMETHEUS = shutil.which("prometheus")
# Grafana variables, as a person picking "All" over a short range would set them.
VARIABLES = {"$__rate_interval": "1m", "$namespace": ".*"}
PARTS = {"agents", "scheduler", "injector", "healer"}

# The demo job starts on gpu-a, whose device 2 then fails: admission, plan,
# bind, a verdict, a (dry-run) action and a move all happen within ~20 s.
FLEET = demo_fleet(gpu_a_2_fails_at_s=6)

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus binary not on PATH (Debian package prometheus)"
)


def panel_queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    out = []
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for name, value in VARIABLES.items():
                expr = expr.replace(name, value)
            assert "$" not in expr, f"{panel['title']}: unknown variable in {expr}"
            out.append((panel["title"], expr))
    return out


def grouped_by(expr: str) -> set[str]:
    """The labels of the outermost ``by (...)`` (the first one written), ``le``
    aside (histogram_quantile consumes it): each result series must carry them."""
    found = re.search(r"\bby\s*\(([^)]*)\)", expr)
    return {label.strip() for label in found.group(1).split(",")} - {"le", ""} if found else set()


def _get(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return dict(json.load(answer))


class Up:
    """`hcs up` in the background; its stdout read by a thread."""

    def __init__(self, tmp: Path) -> None:
        fleet = tmp / "fleet.yaml"
        fleet.write_text(FLEET)
        argv = [sys.executable, "-m", "hcs.cli", "up", "--for", "150", "--fleet", str(fleet)]
        argv += ["--state-dir", str(tmp / "state")]
        argv += ["--webhook", f"127.0.0.1:{free_port()}", "--extender", f"127.0.0.1:{free_port()}"]
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        self.lines: list[str] = []
        self.announced = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.startswith("hcs up: metrics "):
                self.announced.set()

    def metrics_urls(self) -> dict[str, str]:
        assert self.announced.wait(60), "hcs up announced no metrics ports:\n" + "".join(
            self.lines[-20:]
        )
        line = next(x for x in self.lines if x.startswith("hcs up: metrics "))
        return dict(re.findall(r"(\w+)=(http://\S+)", line))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    running = Up(tmp_path)
    yield running
    running.stop()


@pytest.fixture
def prometheus(tmp_path: Path, up: Up) -> Iterator[str]:
    urls = up.metrics_urls()
    assert set(urls) >= PARTS, urls
    jobs = []
    for part, url in urls.items():
        where = urllib.parse.urlsplit(url)
        jobs.append(
            {
                "job_name": f"hcs-{part}",
                "metrics_path": where.path,
                "static_configs": [{"targets": [where.netloc]}],
            }
        )
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}}
    config["scrape_configs"] = jobs  # type: ignore[assignment]
    (tmp_path / "prometheus.yml").write_text(json.dumps(config))  # YAML is a superset of JSON
    address = f"127.0.0.1:{free_port()}"
    assert PROMETHEUS is not None
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address={address}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield f"http://{address}"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _targets_up(base: str) -> dict[str, str]:
    try:
        found = _get(f"{base}/api/v1/targets")
    except OSError:
        return {}
    active = found["data"]["activeTargets"]  # type: ignore[index]
    return {t["labels"]["job"]: t["health"] for t in active}


def _query(base: str, expr: str) -> list[dict[str, object]]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    answer = _get(url)
    assert answer["status"] == "success", answer
    return list(answer["data"]["result"])  # type: ignore[index]


def _missing(base: str, queries: list[tuple[str, str]]) -> dict[str, str]:
    """Panels whose query returns no series, or series without a grouped-by label."""
    missing = {}
    for title, expr in queries:
        series = _query(base, expr)
        labels = grouped_by(expr)
        if not series:
            missing[title] = "no series"
        elif any(not all(s["metric"].get(label) for label in labels) for s in series):  # type: ignore[attr-defined]
            missing[title] = f"series without one of {sorted(labels)}: {series[:2]}"
    return missing


def test_every_dashboard_panel_returns_series_from_a_real_prometheus_scraping_hcs_up(
    prometheus: str,
) -> None:
    queries = panel_queries()
    assert queries
    deadline = time.monotonic() + 30
    while set(_targets_up(prometheus).values()) != {"up"} or len(_targets_up(prometheus)) < 4:
        assert time.monotonic() < deadline, f"targets not up: {_targets_up(prometheus)}"
        time.sleep(0.5)
    missing: dict[str, str] = {}
    deadline = time.monotonic() + 75  # the demo's fault, verdict, action and move
    while time.monotonic() < deadline:
        missing = _missing(prometheus, queries)
        if not missing:
            break
        time.sleep(2)
    assert not missing, json.dumps(missing, indent=1)


def test_a_panel_grouping_by_a_label_the_metric_lacks_is_caught() -> None:
    assert grouped_by("sum by (answer) (rate(x[1m]))") == {"answer"}
    assert grouped_by("histogram_quantile(0.99, sum by (le, outcome) (rate(y[1m])))") == {"outcome"}
    assert grouped_by("sum by (state) (max by (vendor, state) (z))") == {"state"}
