"""``bench.burst``'s CPU per pod: each process's load at rest over the
burst's window is taken off before dividing by the pods that started."""

from __future__ import annotations

import pytest

from bench.burst import (
    API,
    api_requests,
    cpu_ratio,
    hcs_own,
    node_spread,
    pairs,
    report,
    report_pod_cost,
    report_rounds,
    rest_after_settling,
    round_order,
    settled,
    volumes,
)


def _burst(label: str, *, wall_s: float, running: int, **cpu_s: float) -> dict:
    return {
        "label": label,
        "running": running,
        "cpu_wall_s": wall_s,
        "cpu_s": {name: ("kube", s) for name, s in cpu_s.items()},
    }


def test_the_load_at_rest_is_taken_off_before_the_cost_per_pod(
    capsys: pytest.CaptureFixture[str],
) -> None:
    plain = _burst("plain", wall_s=10.0, running=1000, kubelets=8.0, scheduler=1.0)
    hcs = _burst("hcs", wall_s=20.0, running=1000, kubelets=16.0, scheduler=7.0)
    report_pod_cost([plain, hcs], {"kubelets": 0.8, "scheduler": 0.1})
    lines = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()[2:]}
    # kubelets: all of it is load at rest (0.8/s over 10 s and 20 s): nothing per pod
    assert lines["kubelets"] == ["0.0", "0.0", "+0.0"]
    # scheduler: (1.0 - 0.1 × 10) / 1000 = 0 ms and (7.0 - 0.1 × 20) / 1000 = 5 ms
    assert lines["scheduler"] == ["0.0", "5.0", "+5.0"]
    assert lines["all"] == ["0.0", "5.0", "+5.0"]


def test_a_process_busier_than_at_rest_costs_per_pod_and_the_ratio_follows(
    capsys: pytest.CaptureFixture[str],
) -> None:
    plain = _burst("plain", wall_s=10.0, running=500, apiserver=11.0, kubelets=6.0)
    hcs = _burst("hcs", wall_s=10.0, running=500, apiserver=16.0, kubelets=16.0)
    report_pod_cost([plain, hcs], {"apiserver": 0.1, "kubelets": 0.2})
    out = capsys.readouterr().out
    assert "apiserver" in out and "20.0" in out and "30.0" in out and "+10.0" in out
    # (20 + 8) ms against (30 + 28) ms per pod, and 20 against 30 without the kubelets
    assert "predicts for pods/s): 0.48" in out
    assert "its node's CPU): 0.67" in out


def test_the_ceiling_counts_each_hcs_process_and_the_bus_at_their_plain_cost(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def burst(label: str, **ms: tuple[str, float]) -> dict:
        return {"label": label, "running": 1000, "cpu_wall_s": 10.0, "cpu_s": ms}

    plain = burst(
        "plain",
        kubelets=("kube", 12.0),
        apiserver=("kube", 11.0),
        scheduler=("hcs", 1.0),
        **{"nats-server": ("kube", 0.5)},
    )
    hcs = burst(
        "hcs",
        kubelets=("kube", 18.0),
        apiserver=("kube", 14.0),
        scheduler=("hcs", 5.0),
        **{"nats-server": ("kube", 1.5)},
    )
    # 24.5 ms a plain pod; an HCS pod 38.5, of which the scheduler's 4 and the
    # bus's 1 are HCS's own: 24.5 / 33.5 were they to cost what a plain pod does
    assert hcs_own(hcs) == {"scheduler", "nats-server"}
    assert cpu_ratio(plain, hcs, {}, at_plain=hcs_own(hcs)) == pytest.approx(24.5 / 33.5)
    report_pod_cost([plain, hcs], {})
    out = capsys.readouterr().out
    assert "predicts for pods/s): 0.64" in out
    assert "own code can reach here): 0.73" in out


def test_rounds_give_each_back_to_back_pairs_ratio_and_their_median(
    capsys: pytest.CaptureFixture[str],
) -> None:
    results = []
    for plain_s, hcs_s in ((40.0, 20.0), (30.0, 24.0), (50.0, 30.0)):
        plain = _burst("plain", wall_s=10.0, running=100, kubelets=2.0)
        hcs = _burst("hcs", wall_s=10.0, running=100, kubelets=4.0)
        plain["pods_per_s"], hcs["pods_per_s"] = plain_s, hcs_s
        results += [plain, hcs]
    report_rounds(results, {"kubelets": 0.0})
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [row[3] for row in rows] == ["0.50", "0.80", "0.60"]
    assert [row[4] for row in rows] == ["0.50"] * 3  # 20 ms against 40 ms per pod
    assert "median ratio 0.60 (min 0.50, max 0.80; by CPU 0.50" in out


def test_rounds_where_a_kubelet_restarted_are_marked_and_left_out_of_a_second_median(
    capsys: pytest.CaptureFixture[str],
) -> None:
    results = []
    for plain_s, hcs_s, revived in (
        (40.0, 20.0, ["burst-020"]),
        (30.0, 24.0, []),
        (50.0, 35.0, []),
    ):
        plain = _burst("plain", wall_s=10.0, running=100, kubelets=2.0)
        hcs = _burst("hcs", wall_s=10.0, running=100, kubelets=4.0)
        plain["pods_per_s"], hcs["pods_per_s"], hcs["revived"] = plain_s, hcs_s, revived
        results += [plain, hcs]
    report_rounds(results, {"kubelets": 0.0})
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert ["restarted" in row for row in rows] == [True, False, False]
    assert "median ratio 0.70 (min 0.50" in out  # 0.50, 0.80, 0.70: all rounds
    assert "median of the 2 rounds without a restarted kubelet: 0.75" in out


def test_rounds_alternate_which_burst_runs_first_and_each_pair_compares_hcs_with_plain(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert round_order(4, "plain", "hcs") == ["plain", "hcs", "hcs", "plain"] * 2
    assert round_order(1, "plain", "hcs") == ["plain", "hcs"]
    results = []
    for label, per_s in zip(
        ("plain", "hcs", "hcs-2", "plain-2", "plain-3", "hcs-3"),
        (40.0, 20.0, 24.0, 30.0, 50.0, 35.0),
        strict=True,
    ):
        burst = _burst(label, wall_s=10.0, running=100, kubelets=4.0 if "hcs" in label else 2.0)
        burst["pods_per_s"] = per_s
        results.append(burst)
    assert [(p["label"], h["label"]) for p, h in pairs(results)] == [
        ("plain", "hcs"),
        ("plain-2", "hcs-2"),
        ("plain-3", "hcs-3"),
    ]
    report_rounds(results, {"kubelets": 0.0})
    rows = [
        line.split() for line in capsys.readouterr().out.splitlines() if line.strip()[:1].isdigit()
    ]
    # round 2 ran HCS first: still hcs/s over plain/s (24/30), never the other way round
    assert [(row[1], row[2], row[3]) for row in rows] == [
        ("40.0", "20.0", "0.50"),
        ("30.0", "24.0", "0.80"),
        ("50.0", "35.0", "0.70"),
    ]


def test_the_report_takes_its_ratio_from_the_first_pair_with_a_same_placement_burst_after(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def full(label: str, per_s: float) -> dict:
        burst = _burst(label, wall_s=10.0, running=100, kubelets=2.0)
        burst.update(
            pods=100, pods_per_s=per_s, p50_s=1.0, p99_s=2.0, pending=0, double_booked=[],
            created_s=3.0, spread={"nodes": 0}, volumes={}, pending_reasons=[],
            create_error_count=0, create_errors=[], room=None, latency={}, counted={},
            requests={},
        )  # fmt: skip
        return burst

    # one round, then --same-placement's pinned plain burst: three bursts, not pairs
    report([full("plain", 40.0), full("hcs", 20.0), full("plainpin", 30.0)])
    assert "ratio hcs/plain pods/s: 0.50" in capsys.readouterr().out


def test_one_round_prints_no_rounds_table(capsys: pytest.CaptureFixture[str]) -> None:
    plain = _burst("plain", wall_s=10.0, running=100, kubelets=2.0)
    hcs = _burst("hcs", wall_s=10.0, running=100, kubelets=4.0)
    plain["pods_per_s"], hcs["pods_per_s"] = 40.0, 20.0
    report_rounds([plain, hcs], {})
    assert capsys.readouterr().out == ""


def _pod(node: str | None) -> dict:
    return {"spec": {"nodeName": node} if node else {}}


def test_the_spread_names_the_busiest_node_and_when_its_last_pod_started() -> None:
    pods = {"a": _pod("n1"), "b": _pod("n1"), "c": _pod("n1"), "d": _pod("n2"), "e": _pod(None)}
    pods["f"] = _pod("n3")  # bound, never started: not counted
    started = 100.0
    running_at = {"a": 101.0, "b": 104.0, "c": 102.5, "d": 107.0, "e": 103.0}
    spread = node_spread(pods, running_at, start=started)
    assert (spread["nodes"], spread["max"], spread["busiest"]) == (2, 3, "n1")
    assert spread["median"] == 2  # of 3 and 1
    assert spread["busiest_done_s"] == 4.0 and spread["last_done_s"] == 7.0
    assert node_spread({}, {}, start=started)["nodes"] == 0


def test_volumes_per_pod_are_counted_by_runtime_class() -> None:
    def pod(runtime_class: str | None, count: int) -> dict:
        spec: dict = {"volumes": [{"name": f"v{i}"} for i in range(count)]}
        if runtime_class:
            spec["runtimeClassName"] = runtime_class
        return {"spec": spec}

    pods = [pod("nvidia", 2), pod("nvidia", 2), pod("hygon", 7), pod(None, 1), {"spec": {}}]
    assert volumes(pods) == {"": (2, 0.5), "hygon": (1, 7.0), "nvidia": (2, 2.0)}


def test_api_requests_are_counted_by_verb_and_resource_from_the_api_servers_samples() -> None:
    from prometheus_client.samples import Sample

    def total(verb: str, resource: str, subresource: str, value: float) -> Sample:
        labels = {"verb": verb, "resource": resource, "subresource": subresource}
        return Sample("apiserver_request_total", labels, value)

    scraped = {
        API: [
            total("POST", "pods", "", 3),
            total("POST", "pods", "binding", 2),
            total("POST", "pods", "", 1),  # another code, the same request
            Sample("apiserver_request_duration_seconds_count", {"verb": "POST"}, 9),
        ]
    }
    assert api_requests(scraped) == {"POST pods": 4, "POST pods/binding": 2}
    assert api_requests({}) == {}


def test_the_next_burst_waits_until_all_processes_together_are_back_near_rest() -> None:
    rest = {"kubelets": 0.3, "scheduler": 0.05, "kube-apiserver": 0.05}  # 0.4 in all
    # kubelets still tearing the last burst's pods down: 0.9 > 0.4 × 1.25 + 0.1
    assert not settled({"kubelets": 0.8, "scheduler": 0.05, "kube-apiserver": 0.05}, rest)
    # HCS still releasing devices, though the kubelets are quiet: 0.8 > 0.6
    assert not settled({"kubelets": 0.3, "scheduler": 0.45, "kube-apiserver": 0.05}, rest)
    assert settled({"kubelets": 0.4, "scheduler": 0.1, "kube-apiserver": 0.1}, rest)  # 0.6
    assert settled({"kubelets": 0.2, "scheduler": 0.0}, rest)


def _windows(*loads: dict[str, float]):
    """A ``measure`` that hands out ``loads`` in turn, counting the seconds asked."""
    asked: list[float] = []
    left = list(loads)

    def measure(seconds: float) -> dict[str, float]:
        asked.append(seconds)
        return left.pop(0)

    return measure, asked


def test_the_load_at_rest_is_taken_once_the_fresh_cluster_stops_settling() -> None:
    measure, asked = _windows(
        {"kube-apiserver": 0.85, "etcd": 0.2, "scheduler": 0.06},  # fresh Nodes being written
        {"kube-apiserver": 0.30, "etcd": 0.06, "scheduler": 0.02},  # falling: 0.38 < 0.8 × 1.11
        {"kube-apiserver": 0.18, "etcd": 0.04, "scheduler": 0.02},  # still falling: 0.24 < 0.30
        {"kube-apiserver": 0.22, "etcd": 0.03, "mirror": 0.05},  # no longer: 0.30 >= 0.19
    )
    load, _took, done = rest_after_settling(measure, seconds=8.0)
    assert done and asked == [8.0] * 4
    # the last two windows averaged, a process seen in only one at half its load
    assert load == pytest.approx(
        {"kube-apiserver": 0.20, "etcd": 0.035, "scheduler": 0.01, "mirror": 0.025}
    )


def test_a_cluster_that_never_settles_gives_its_last_two_windows_and_says_so() -> None:
    measure, asked = _windows(*({"kube-apiserver": 1.0 / (i + 1)} for i in range(10)))
    load, _took, done = rest_after_settling(measure, seconds=1.0, timeout_s=0.0)
    assert not done and len(asked) == 2
    assert load == pytest.approx({"kube-apiserver": 0.75})
