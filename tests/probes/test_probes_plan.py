"""Fallback decision from the loader's status (pure)."""

from __future__ import annotations

from agents.probes.plan import LoaderStatus, parse_status_line, plan_sources, status_from_ready


def test_missing_loader_falls_back_to_kmsg_and_sysfs_polling() -> None:
    plan = plan_sources(LoaderStatus(ready=False, errors=("binary missing: /x",)))
    assert (plan.ebpf, plan.kmsg, plan.sysfs_aer) == (False, True, True)
    assert "binary missing" in plan.reason


def test_load_failure_without_status_falls_back_to_kmsg_and_sysfs_polling() -> None:
    plan = plan_sources(None)
    assert (plan.ebpf, plan.kmsg, plan.sysfs_aer) == (False, True, True)


def test_missing_aer_tracepoint_keeps_ebpf_for_log_lines_and_polls_sysfs() -> None:
    status = status_from_ready(
        parse_status_line(
            '{"status":"ready","attached":["printk:console"],"missing":["ras:aer_event"],'
            '"failed":[]}'
        )
        or {}
    )
    plan = plan_sources(status)
    assert (plan.ebpf, plan.kmsg, plan.sysfs_aer) == (True, False, True)
    assert "ras:aer_event missing" in plan.reason


def test_missing_console_tracepoint_adds_kmsg_following() -> None:
    plan = plan_sources(
        LoaderStatus(ready=True, attached=("ras:aer_event",), missing=("printk:console",))
    )
    assert (plan.ebpf, plan.kmsg, plan.sysfs_aer) == (True, True, False)


def test_everything_attached_uses_ebpf_only() -> None:
    plan = plan_sources(LoaderStatus(ready=True, attached=("printk:console", "ras:aer_event")))
    assert (plan.ebpf, plan.kmsg, plan.sysfs_aer) == (True, False, False)
    assert plan.reason == "eBPF"


def test_ready_but_nothing_attached_is_treated_as_unavailable() -> None:
    plan = plan_sources(LoaderStatus(ready=True, attached=()))
    assert (plan.ebpf, plan.kmsg, plan.sysfs_aer) == (False, True, True)


def test_status_line_parser_ignores_libbpf_chatter() -> None:
    assert parse_status_line("libbpf: prog 'x': failed to attach") is None
    assert parse_status_line("[1]") is None
    assert parse_status_line(b'{"status":"error","stage":"load"}') == {
        "status": "error",
        "stage": "load",
    }
