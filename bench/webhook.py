"""Admission latency of the HCS webhook over TLS, next to a bare TLS echo.

``python -m bench.webhook [--nodes 5000] [--requests 2000]``

Processes: a real nats-server; a plan responder on ``hcs.place`` holding a
5,000-node cluster view (the scheduler's own planner when importable, else a
fixed valid Plan — the output says which); a server process with the webhook
(HTTPS) and a bare aiohttp TLS handler that decodes the same AdmissionReview
and answers allowed; and this process as the client (one keep-alive
connection, sequential requests, like the API server's per-webhook client).

Measured: client-side p50/p99 for a GPU pod (plan round-trip and patch) and
for a pass-through pod, server-side handler time for the pass-through, and
the bare echo. Targets: p99 <= 10 ms with a plan; pass-through <= 1 ms
server-side.

Also the server process's CPU per request, each case alone: back to back,
and paced at ``--paced-per-s`` (default 70, a burst's admission rate on a
small machine), one request at a time. A process woken for each request
runs on cold caches and pays several times what the same work costs back
to back; the paced column is the one to set against ``bench.throughput``'s
injector CPU per pod, and the bare echo's is its floor. The last line
shows the same effect without any I/O: the admission rules alone in this
process (``Admitter.admit``, the plan answered in the process), called in
a loop and called after sleeping ``1 / --paced-per-s`` each time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import ssl
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import uvloop
from aiohttp import web

from bench.burst import cpu_s
from bench.fleets import of_profile
from hcs_bus import subjects
from hcs_bus.bus import connect
from hcs_bus.certs import DevCerts, make_dev_certs
from hcs_bus.messages import NodeFingerprint, Plan, PlanRequest
from hcs_bus.natsserver import NatsServer
from hcs_bus.settings import BusSettings, Settings, TelemetrySettings, replace
from hcs_bus.telemetry import configure
from injector.serving import Injector

CLASSES = (
    "nvidia/A100-80G",
    "nvidia/H100-SXM",
    "huawei/Ascend910B2",
    "hygon/K100",
    "cambricon/MLU370-X8",
    "nvidia/H200",
)


# A plan for the GPU review's two devices (the responder's when the
# scheduler's planner is not importable, and the in-process rules').
FIXED_PLAN = Plan(
    ok=True,
    vendor="nvidia",
    model="A100-80G",
    models=("A100-80G",),
    devices=2,
    vram_mib_per_device=16384,
    acu_per_device=100.0,
)


# ------------------------------------------------------------ documents --
def review(*, gpu: bool, uid: str = "0b7a3c1e-4f2d-4e8a-9b6c-1d2e3f4a5b6c") -> dict[str, Any]:
    """A CREATE review shaped like admission-review-pod-create-request.json."""
    resources: dict[str, Any] = {
        "limits": {"cpu": "8", "memory": "32Gi"},
        "requests": {"cpu": "4", "memory": "16Gi"},
    }
    if gpu:
        for part in resources.values():
            part.update({"ai.compute/vram": "32Gi", "ai.compute/devices": "2"})
    pod = {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "generateName": "trainer-7c9d6b5f4-",
            "namespace": "ml-team",
            "creationTimestamp": None,
            "labels": {"app": "trainer", "pod-template-hash": "7c9d6b5f4"},
            "annotations": {"hcs.io/vendors": "nvidia,huawei"} if gpu else {},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "trainer-7c9d6b5f4",
                    "uid": "c1d2e3f4",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "volumes": [
                {
                    "name": "kube-api-access-7xk2p",
                    "projected": {
                        "defaultMode": 420,
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}
                        ],
                    },
                }
            ],
            "containers": [
                {
                    "name": "trainer",
                    "image": "registry.example.com/ml/trainer:2.4.1",
                    "command": ["python", "-m", "trainer.main"],
                    "resources": resources,
                    "volumeMounts": [
                        {
                            "name": "kube-api-access-7xk2p",
                            "readOnly": True,
                            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                        }
                    ],
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "schedulerName": "default-scheduler",
            "priority": 0,
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                }
            ],
        },
        "status": {},
    }
    return {
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ml-team",
            "operation": "CREATE",
            "userInfo": {
                "username": "system:serviceaccount:kube-system:replicaset-controller",
                "groups": ["system:serviceaccounts", "system:authenticated"],
            },
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        },
    }


# ------------------------------------------------------------ responder --
def fleet(nodes: int) -> list[NodeFingerprint]:
    from hcs_bus import profiles

    db = profiles.load()
    chosen = [db.get(key) for key in CLASSES if _known(db, key)]
    out = []
    for n in range(nodes):
        p = chosen[n % len(chosen)]
        labels = {"hcs.io/vendor": p.vendor, "hcs.io/model": p.model}
        out.append(of_profile(f"node-{n:05d}", p, labels=labels))
    return out


def _known(db: Any, key: str) -> bool:
    try:
        db.get(key)
    except KeyError:
        return False
    return True


def make_planner(nodes: int) -> tuple[str, Any]:
    fixed = FIXED_PLAN
    try:
        from hcs_bus import profiles
        from scheduler.plan import rules as planning
        from scheduler.view.state import ClusterState
    except ImportError as exc:
        return f"fixed Plan (scheduler planner not importable: {exc})", lambda _r: fixed
    state = ClusterState()
    for fp in fleet(nodes):
        state.apply_fingerprint(fp, now=0.0)
    db = profiles.load()
    summary = planning.summarise(state.nodes.values())

    def plan(request: PlanRequest) -> Plan:
        return planning.plan(request, summary=summary, profiles=db)

    return f"scheduler.plan.rules.plan over {len(state.nodes)} nodes (summary cached)", plan


def _quiet() -> None:
    """Telemetry as in production (metrics on), logs only from warnings up."""
    configure(TelemetrySettings(log_format="console", log_level="warning"), service="bench")


def run_responder(url: str, nodes: int, ready: Any, stop: Any) -> None:
    _quiet()

    async def main() -> None:
        label, plan = make_planner(nodes)
        bus = await connect(BusSettings(url=url), name="bench-planner")

        async def handle(request: PlanRequest) -> Plan:
            return plan(request)  # type: ignore[no-any-return]

        await bus.serve(
            subjects.PLACE,
            PlanRequest,
            handle,
            queue=subjects.PLACE_QUEUE,
            on_bad=lambda reason: Plan(ok=False, reason=reason),
        )
        await bus.nc.flush()
        ready.put(label)
        await asyncio.to_thread(stop.wait)
        await bus.drain()

    asyncio.run(main())


# --------------------------------------------------------------- servers --
class TimedInjector(Injector):
    """The webhook with a middleware timing the handler (server-side time)."""

    timings: list[float] = []

    def app(self) -> web.Application:
        app = super().app()

        @web.middleware
        async def timed(request: web.Request, handler: Any) -> web.StreamResponse:
            started = time.perf_counter()
            response = await handler(request)
            if request.path == "/mutate":
                self.timings.append(time.perf_counter() - started)
            return response

        app.middlewares.append(timed)
        app.router.add_get("/bench-timings", self._timings)
        return app

    async def _timings(self, request: web.Request) -> web.Response:
        data = json.dumps(self.timings)
        self.timings.clear()
        return web.Response(text=data)


async def echo(request: web.Request) -> web.Response:
    doc = json.loads(await request.read())
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": doc["request"]["uid"], "allowed": True},
    }
    return web.json_response(body)


def run_servers(url: str, certs: DevCerts, ready: Any, stop: Any) -> None:
    _quiet()

    async def main() -> None:
        settings = replace(
            Settings(),
            bus={"url": url},
            injector={
                "host": "127.0.0.1",
                "port": 0,
                "cert_file": str(certs.cert_file),
                "key_file": str(certs.key_file),
            },
        )
        bus = await connect(settings.bus, name="bench-injector")
        injector = TimedInjector(bus, settings)
        await injector.start()
        app = web.Application()
        app.router.add_post("/mutate", echo)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(certs.cert_file, certs.key_file)
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        host, port = runner.addresses[0][:2]
        ready.put((injector.url, f"https://{host}:{port}/mutate"))
        await asyncio.to_thread(stop.wait)
        await runner.cleanup()
        await injector.stop()
        await bus.drain()

    uvloop.run(main())  # the loop the injector runs on (hcs_bus.tasks.run_part)


# ---------------------------------------------------------------- client --
async def measure(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    n: int,
    *,
    gap_s: float = 0.0,
) -> list[float]:
    """Client-side seconds of ``n`` requests, one at a time, each started
    ``gap_s`` after the last answer (0: back to back)."""
    headers = {"Content-Type": "application/json"}
    out = []
    for _ in range(n):
        started = time.perf_counter()
        async with session.post(url, data=body, headers=headers) as resp:
            answer = await resp.read()
        out.append(time.perf_counter() - started)
        assert resp.status == 200, answer
        if gap_s:
            await asyncio.sleep(gap_s)
    return out


async def cpu_per_request(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    n: int,
    *,
    server_pid: int,
    gap_s: float = 0.0,
) -> tuple[float, list[float]]:
    """The server process's CPU milliseconds per request over ``measure``,
    after a warm-up of back-to-back requests that is not counted."""
    await measure(session, url, body, min(200, n))
    before = cpu_s(server_pid)
    times = await measure(session, url, body, n, gap_s=gap_s)
    return (cpu_s(server_pid) - before) / n * 1000, times


async def handler_times(session: aiohttp.ClientSession, webhook: str) -> list[float]:
    """The webhook handler's seconds since the last call (the server forgets them)."""
    async with session.get(webhook.replace("/mutate", "/bench-timings")) as resp:
        return json.loads(await resp.text())  # type: ignore[no-any-return]


def rules_alone(n: int, *, gap_s: float) -> float:
    """CPU milliseconds per ``Admitter.admit`` of the GPU review in this
    process (no TLS, HTTP or NATS; a fixed plan), sleeping ``gap_s`` before
    each call (0: back to back)."""

    async def planner(_request: PlanRequest, _timeout_s: float) -> Plan:
        return FIXED_PLAN

    async def calls() -> float:
        injector = Injector(
            None, Settings(), planner=planner, ssl_context=ssl.create_default_context()
        )
        bodies = [json.dumps(review(gpu=True, uid=f"uid-{i}")).encode() for i in range(n + 50)]
        for body in bodies[:50]:  # warm up
            await injector.admitter.admit(body, budget_s=2.0)
        spent = 0.0
        for body in bodies[50:]:
            if gap_s:
                await asyncio.sleep(gap_s)  # the process asleep, as between two admissions
            started = time.process_time()
            answer = await injector.admitter.admit(body, budget_s=2.0)
            spent += time.process_time() - started
            assert answer.result == "patched", answer
        return spent / n * 1000

    return uvloop.run(calls())


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def client(
    webhook: str,
    baseline: str,
    certs: DevCerts,
    n: int,
    *,
    server_pid: int,
    paced_per_s: float,
) -> list[tuple[str, ...]]:
    context = ssl.create_default_context(cafile=str(certs.ca_file))
    gpu = json.dumps(review(gpu=True)).encode()
    plain = json.dumps(review(gpu=False)).encode()
    rows: list[tuple[str, ...]] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context, limit=1)) as s:
        async with s.post(webhook, data=gpu) as resp:
            first = (await resp.json())["response"]
        outcome = "patched" if first.get("patch") else f"NOT patched: {first}"
        for name, url, body in (
            ("GPU pod (plan + patch)", webhook, gpu),
            ("pass-through pod", webhook, plain),
            ("bare TLS echo, same review", baseline, plain),
            ("bare TLS echo, GPU review", baseline, gpu),
        ):
            hot, times = await cpu_per_request(s, url, body, n, server_pid=server_pid)
            server = ""
            if url == webhook:  # the handler times of the back-to-back requests
                handler = await handler_times(s, webhook)
                server = f"{pct(handler, 0.5):.3f} / {pct(handler, 0.99):.3f}"
            paced, _ = await cpu_per_request(
                s, url, body, max(1, n // 4), server_pid=server_pid, gap_s=1 / paced_per_s
            )
            if url == webhook:
                await handler_times(s, webhook)  # the paced ones: not the next case's
            rows.append(
                (
                    name,
                    f"{pct(times, 0.5):.3f}",
                    f"{pct(times, 0.99):.3f}",
                    f"{statistics.mean(times) * 1000:.3f}",
                    server,
                    f"{hot:.2f}",
                    f"{paced:.2f}",
                )
            )
    rows.append(("(GPU pod answer)", outcome, "", "", "", "", ""))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.webhook")
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument(
        "--paced-per-s",
        type=float,
        default=70.0,
        help="the rate of the paced CPU column (requests a second, one at a time)",
    )
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    nats = NatsServer().start()
    stop = ctx.Event()
    with tempfile.TemporaryDirectory(prefix="hcs-bench-") as tmp:
        certs = make_dev_certs(Path(tmp), dns=["localhost"], ips=["127.0.0.1"])
        q_plan, q_srv = ctx.Queue(), ctx.Queue()
        procs = [
            ctx.Process(target=run_responder, args=(nats.url, args.nodes, q_plan, stop)),
            ctx.Process(target=run_servers, args=(nats.url, certs, q_srv, stop)),
        ]
        for proc in procs:
            proc.start()
        try:
            planner = q_plan.get(timeout=120)
            webhook, baseline = q_srv.get(timeout=60)
            rows = asyncio.run(
                client(
                    webhook,
                    baseline,
                    certs,
                    args.requests,
                    server_pid=procs[1].pid or 0,
                    paced_per_s=args.paced_per_s,
                )
            )
        finally:
            stop.set()
            for proc in procs:
                proc.join(timeout=10)
                if proc.is_alive():
                    proc.terminate()
            nats.cleanup()
    print(f"planner: {planner}")
    print(f"requests per row: {args.requests}, sequential, one keep-alive TLS connection")
    header = (
        "case",
        "p50 ms",
        "p99 ms",
        "mean ms",
        "server p50/p99 ms",
        "CPU ms/req",
        f"CPU ms/req at {args.paced_per_s:g}/s",
    )
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
    _quiet()
    hot = rules_alone(max(1, args.requests // 4), gap_s=0.0)
    cold = rules_alone(max(1, args.requests // 4), gap_s=1 / args.paced_per_s)
    print(
        f"admission rules alone, in process (GPU review, plan answered here): "
        f"{hot:.2f} ms CPU a call back to back, {cold:.2f} ms after sleeping "
        f"{1000 / args.paced_per_s:.0f} ms"
    )
    print("targets: GPU pod p99 <= 10 ms; pass-through <= 1 ms server-side")
    print(
        "CPU: the server process (webhook and echo in one), back to back and paced; "
        "the paced GPU row is what bench.throughput's injector CPU per pod compares with"
    )


if __name__ == "__main__":
    main()
