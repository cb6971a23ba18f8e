"""The console's JSON shaping (scheduler.console.panels): pure, on built cluster states."""

from __future__ import annotations

import math

import pytest

from hcs_bus.messages import (
    CheckpointEvent,
    DeviceSlice,
    HealthEvent,
    NodeReservations,
    PodRef,
    Reservation,
)
from scheduler.console import panels
from scheduler.plan.rules import QuotaLimits
from scheduler.view.state import ClusterState
from tests.scheduler.helpers import DB, dev, node_fp
from tests.view.factories import verdict


def _bound(ns: str, pod: str, slices: list[tuple[int, int, bool]], *, job: str | None = None,
           acu: float = 0.0, model: str = "A100-80G") -> Reservation:  # fmt: skip
    return Reservation(
        pod=PodRef(namespace=ns, name=pod),
        devices=tuple(
            DeviceSlice(index=i, uuid=f"u{i}", vram_mib=m, whole=w) for i, m, w in slices
        ),
        state="bound",
        time_s=1.0,
        vendor="nvidia",
        model=model,
        acu=acu,
        job=job,
    )


def _state() -> ClusterState:
    """gpu-a: 4 × A100-80G, device 1 failed, device 0 held whole by ml/train-0
    (job llama), device 2 half-sliced by web/infer; npu-b: 2 × Ascend 910B2."""
    state = ClusterState()
    state.apply_fingerprint(node_fp("gpu-a", count=4), now=0.0)
    state.apply_fingerprint(node_fp("npu-b", "huawei/Ascend910B2", count=2), now=0.0)
    state.apply_health(verdict("gpu-a", 1, "failed"))
    doc = NodeReservations(
        node="gpu-a",
        reservations=(
            _bound("ml", "train-0", [(0, 81920, True)], job="llama", acu=100.0),
            _bound("web", "infer", [(2, 40960, False)], acu=50.0),
        ),
    )
    state.apply_reservations("gpu-a", doc)
    return state


def test_classes_count_use_in_acu_and_vram_and_never_count_a_failed_device_free() -> None:
    a100, ascend = DB.get("nvidia/A100-80G"), DB.get("huawei/Ascend910B2")
    rows = {r["class"]: r for r in panels.class_rows(_state().nodes.values(), profiles=DB)}
    a = rows["nvidia/A100-80G"]
    assert (a["devices"], a["healthy"], a["failed"], a["stale"]) == (4, 3, 1, 0)
    assert a["vram_total_mib"] == 4 * a100.vram_mib
    assert a["vram_reserved_mib"] == 81920 + 40960
    # device 0 whole, device 1 failed (out), device 2 half used, device 3 idle
    assert a["vram_free_mib"] == (a100.vram_mib - 40960) + a100.vram_mib
    assert a["vram_out_mib"] == a100.vram_mib
    assert a["acu_reserved"] == pytest.approx(a100.acu * 1.5, abs=0.1)
    assert a["acu_out"] == pytest.approx(a100.acu, abs=0.1)
    assert a["profile"]["tflops_fp16"] == a100.tflops_fp16
    b = rows["huawei/Ascend910B2"]
    assert (b["devices"], b["vram_free_mib"], b["acu_reserved"]) == (2, 2 * ascend.vram_mib, 0)


def test_a_model_the_profiles_do_not_know_is_shown_without_a_profile() -> None:
    state = ClusterState()
    odd = dev(0).__class__(**{**_fields(dev(0)), "model": "X9000"})
    state.apply_fingerprint(node_fp("odd", devices=(odd,)), now=0.0)
    (row,) = panels.class_rows(state.nodes.values(), profiles=DB)
    assert row["class"] == "nvidia/X9000" and row["profile"] is None


def _fields(d: object) -> dict[str, object]:
    return {f: getattr(d, f) for f in d.__struct_fields__}  # type: ignore[attr-defined]


def test_totals_add_up_the_classes() -> None:
    classes = panels.class_rows(_state().nodes.values(), profiles=DB)
    t = panels.totals(classes, nodes=2)
    assert t["devices"] == 6 and t["failed"] == 1 and t["healthy"] == 5
    assert t["vram_total_mib"] == sum(c["vram_total_mib"] for c in classes)
    # here no failed device holds a reservation, so every MiB is counted once
    assert t["vram_total_mib"] == t["vram_reserved_mib"] + t["vram_free_mib"] + t["vram_out_mib"]


def test_node_cells_say_health_and_who_occupies_each_device() -> None:
    state = _state()
    row = panels.node_row(state.nodes["gpu-a"])
    cells = {c["index"]: c for c in row["cells"]}
    assert cells[0] == {
        "index": 0,
        "health": "healthy",
        "owners": ["ml/train-0"],
        "reserved_pct": 100,
    }
    assert cells[1]["health"] == "failed" and cells[1]["owners"] == []
    assert cells[2]["owners"] == ["web/infer"] and cells[2]["reserved_pct"] == 50
    assert row["pods"] == ["ml/train-0", "web/infer"]
    assert (row["healthy"], row["failed"]) == (3, 1)


def test_a_stale_node_shows_every_device_stale_and_comes_first() -> None:
    state = _state()
    state.apply_fingerprint(node_fp("aaa-quiet", count=2), now=0.0)
    state.nodes["npu-b"].seen_at = 100.0
    state.nodes["gpu-a"].seen_at = 100.0
    state.mark_stale(now=100.0, stale_after_s=35.0)
    doc = panels.overview(
        state, profiles=DB, alerts=[], checkpoints={}, limits={}, now_s=5.0, ready=True
    )
    names = [n["name"] for n in doc["nodes"]]
    assert names[0] == "aaa-quiet" and doc["nodes"][0]["state"] == "stale"
    assert names[1] == "gpu-a"  # a failed device: needs a look before healthy npu-b
    assert {c["health"] for c in doc["nodes"][0]["cells"]} == {"stale"}
    assert doc["totals"]["stale"] == 2


def test_node_detail_lists_devices_and_reservations() -> None:
    detail = panels.node_detail(_state().nodes["gpu-a"])
    assert [d["index"] for d in detail["device_list"]] == [0, 1, 2, 3]
    assert detail["device_list"][1]["health"] == "failed"
    assert [r["pod"] for r in detail["reservations"]] == ["ml/train-0", "web/infer"]
    assert detail["reservations"][0]["job"] == "llama"
    assert "cells" not in detail


def test_jobs_carry_their_last_checkpoint_and_its_age() -> None:
    ckpt = CheckpointEvent(namespace="ml", job="llama", uri="s3://b/step-90", step=90, time_s=40.0)
    gone = CheckpointEvent(namespace="ml", job="old", uri="s3://b/old", step=3, time_s=10.0)
    rows = panels.job_rows(_state(), checkpoints={"ml/llama": ckpt, "ml/old": gone}, now_s=50.0)
    assert [r["job"] for r in rows] == ["ml/llama", "ml/old"]
    llama = rows[0]
    assert llama["pods"] == [
        {"pod": "train-0", "node": "gpu-a", "state": "bound", "devices": "1 × nvidia/A100-80G"}
    ]
    assert llama["checkpoint"] == {
        "uri": "s3://b/step-90",
        "step": 90,
        "time_s": 40.0,
        "age_s": 10.0,
    }
    assert rows[1]["pods"] == []


def test_namespaces_show_use_beside_their_quota() -> None:
    limits = {"ml": QuotaLimits(vram_mib=163840, acu=400.0), "empty": QuotaLimits(acu=10.0)}
    rows = {r["namespace"]: r for r in panels.namespace_rows(_state(), limits=limits)}
    assert rows["ml"]["vram_mib"] == 81920 and rows["ml"]["vram_pct"] == 50.0
    assert rows["ml"]["acu_pct"] == 25.0
    assert rows["web"]["vram_mib_hard"] is None and rows["web"]["vram_pct"] is None
    assert rows["empty"]["pods"] == 0 and rows["empty"]["acu_pct"] == 0.0


def test_overview_lists_the_newest_alerts_first_and_only_alerts() -> None:
    def event(i: int, severity: str, source: str = "agent") -> HealthEvent:
        return HealthEvent(node="gpu-a", kind="xid", severity=severity, source=source,  # type: ignore[arg-type]
                           time_s=float(i), code=79)  # fmt: skip

    events = [event(1, "info"), event(2, "warning"), event(3, "fatal"), event(4, "info", "healer")]
    kept = [e for e in events if panels.is_alert(e)]
    doc = panels.overview(
        _state(), profiles=DB, alerts=kept, checkpoints={}, limits={}, now_s=9.0, ready=False
    )
    assert [a["time_s"] for a in doc["alerts"]] == [4.0, 3.0, 2.0]
    assert doc["ready"] is False and doc["nodes_total"] == 2


def test_history_columns_fill_gaps_for_a_class_that_appears_later() -> None:
    history = panels.History(keep=3)
    state = ClusterState()
    state.apply_fingerprint(node_fp("gpu-a", count=2), now=0.0)
    history.record(state, time_s=10.0)
    state.apply_fingerprint(node_fp("npu-b", "huawei/Ascend910B2", count=2), now=0.0)
    state.apply_health(verdict("gpu-a", 0, "failed"))
    history.record(state, time_s=20.0)
    series = history.series(since_s=0.0)
    assert series["time_s"] == [10.0, 20.0]
    assert series["classes"]["huawei/Ascend910B2"]["vram_reserved_pct"] == [None, 0.0]
    assert series["health"]["failed"] == [0, 1]
    assert series["health"]["healthy"] == [2, 3]
    for t in (30.0, 40.0):
        history.record(state, time_s=t)
    assert history.series(since_s=0.0)["time_s"] == [20.0, 30.0, 40.0]
    assert history.series(since_s=35.0)["time_s"] == [40.0]


@pytest.mark.parametrize(
    ("params", "reason"),
    [
        ({"limit": "x"}, "limit='x' is not a whole number"),
        ({"limit": "0"}, "limit=0 is out of range 1..500"),
        ({"limit": "501"}, "out of range"),
        ({"severity": "loud"}, "severity='loud' is not one of info, warning, critical, fatal"),
        ({"node": ""}, "node= must name a node"),
        ({"colour": "red"}, "unknown parameter 'colour'"),
    ],
)
def test_bad_alert_queries_name_the_parameter(params: dict[str, str], reason: str) -> None:
    with pytest.raises(panels.QueryError, match=reason.replace("(", r"\(").replace(".", r"\.")):
        panels.alert_query(params, keep=500)


def test_an_alert_query_filters_by_node_and_least_severity() -> None:
    q = panels.alert_query({"severity": "critical", "node": "gpu-a", "limit": "5"}, keep=500)
    fatal = HealthEvent(node="gpu-a", kind="xid", severity="fatal", source="agent", time_s=1.0)
    warning = HealthEvent(node="gpu-a", kind="ecc", severity="warning", source="agent", time_s=1.0)
    elsewhere = HealthEvent(node="gpu-b", kind="xid", severity="fatal", source="agent", time_s=1.0)
    assert [q.admits(e) for e in (fatal, warning, elsewhere)] == [True, False, False]
    assert q.limit == 5


@pytest.mark.parametrize("window", ["0", "-5", "nan", "inf", "1e9", "soon"])
def test_a_bad_history_window_is_refused(window: str) -> None:
    with pytest.raises(panels.QueryError, match="window_s="):
        panels.history_query({"window_s": window}, most_s=3600)


def test_history_window_defaults_to_all_that_is_kept() -> None:
    assert panels.history_query({}, most_s=3600) == 3600.0
    assert math.isclose(panels.history_query({"window_s": "60"}, most_s=3600), 60.0)


def test_page_query_bounds() -> None:
    assert panels.page_query({}) == (0, 200)
    with pytest.raises(panels.QueryError, match="offset=-1"):
        panels.page_query({"offset": "-1"})
    with pytest.raises(panels.QueryError, match="unknown parameter 'page'"):
        panels.page_query({"page": "2"})


def test_a_node_taking_no_new_pods_says_why_offers_no_room_and_comes_first() -> None:
    state = _state()
    state.apply_fingerprint(node_fp("zzz-cordoned", count=2), now=0.0)
    before = panels.node_row(state.nodes["zzz-cordoned"])
    assert before["blocked"] is None and before["vram_free_mib"] > 0
    state.apply_node("zzz-cordoned", {}, blocked="cordoned (spec.unschedulable)")
    doc = panels.overview(
        state, profiles=DB, alerts=[], checkpoints={}, limits={}, now_s=5.0, ready=True
    )
    first = doc["nodes"][0]
    assert first["name"] == "zzz-cordoned" and first["blocked"] == "cordoned (spec.unschedulable)"
    assert first["vram_free_mib"] == 0  # its devices are not room
