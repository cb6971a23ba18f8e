"""Reading this process's metrics as Prometheus would scrape them."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from hcs_bus.telemetry import metrics_text


def counted(name: str, **labels: str) -> float:
    """The value of counter ``name`` (without ``_total``) for ``labels``; 0 if never added."""
    for family in text_string_to_metric_families(metrics_text().decode()):
        for sample in family.samples:
            if sample.name == f"{name}_total" and all(
                sample.labels.get(k) == v for k, v in labels.items()
            ):
                return float(sample.value)
    return 0.0
