"""The HCS parts on a real test cluster, started as ``hcs up`` starts them.

A nats-server with a temporary store; the parts' argv and environment from
``hcs.up`` (the simulated fleet mapped onto the hollow nodes by name); each
part authenticates as its own ServiceAccount with the project's RBAC from
``deploy/base`` (so a missing rule fails here, as it would in a cluster); the
project's MutatingWebhookConfiguration with the injector's URL and caBundle;
the project's kube-scheduler configuration pointing at the extender, over
mutual TLS as in a cluster (one throw-away CA signs the extender's serving
certificate and kube-scheduler's client certificate, CN hcs-kube-scheduler);
each scheduler replica's console on a port of its own, behind a token. The
healer runs armed (not dry run) with leader election on a real Lease.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import ssl
import sys
import urllib.request
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import yaml

from hcs.up import KUBE_SCHEDULER, UpOptions, part_env, parts
from hcs_bus import checkpoint, kvkeys, messages, streams, subjects
from hcs_bus.bus import Bus, connect
from hcs_bus.certs import make_dev_certs
from hcs_bus.messages import NodeFingerprint
from hcs_bus.natsserver import NatsServer, free_port
from hcs_bus.settings import Settings, replace
from scheduler.plan import gang_records
from tests.e2e.api import wait_for
from tests.e2e.cluster import ROOT, Cluster, ExtenderClient
from tests.e2e.front import Front
from tests.e2e.processes import Process, why_dead

T = TypeVar("T")
DEPLOY = ROOT / "deploy"
WEBHOOK_CONFIG = DEPLOY / "webhook" / "mutating-webhook-configuration.yaml"
RBAC_FILES = [
    DEPLOY / "base" / part / "rbac.yaml"
    for part in ("agent", "scheduler", "injector", "healer", "mirror", "kube-scheduler")
]
CRD_FILES = sorted((DEPLOY / "base" / "crds").glob("*.yaml"))
# part -> ServiceAccount it runs as in deploy/base
ACCOUNTS = {
    "agents": "hcs-agent",
    "scheduler": "hcs-scheduler",
    "injector": "hcs-injector",
    "healer": "hcs-healer",
    "mirror": "hcs-mirror",
}
RUNTIME_CLASSES = ("nvidia", "ascend", "hygon", "cambricon", "mthreads", "iluvatar")


class Stack:
    """The HCS parts around one ``Cluster``."""

    def __init__(
        self,
        cluster: Cluster,
        *,
        fleet: Path,
        root: Path,
        wrap: dict[str, Callable[[list[str]], list[str]]] | None = None,
    ) -> None:
        self.cluster = cluster
        self.wrap = wrap or {}  # part -> its argv as started (a profiler around it)
        self.fleet = fleet
        self.root = root
        self.nats = NatsServer(store_dir=root / "nats")
        self.parts: dict[str, Process] = {}
        self.extender_port = free_port()
        self.webhook_port = free_port()
        self.certs = make_dev_certs(
            root / "certs", dns=["localhost"], ips=["127.0.0.1"], client=KUBE_SCHEDULER
        )
        self.console_token = "e2e-console-token"
        (root / "certs" / "console-token").write_text(self.console_token)
        self.settings = Settings()
        self.env: dict[str, str] = {}
        self.metrics_ports: dict[str, int] = {}
        # scheduler replica (part name) -> its extender port; "scheduler" is the first
        self.extender_ports = {"scheduler": self.extender_port}
        self.console_ports = {"scheduler": free_port()}  # and its console's
        self.front: Front | None = None

    @property
    def extender_url(self) -> str:
        return f"https://127.0.0.1:{self.extender_port}"

    @property
    def kube_scheduler_identity(self) -> ExtenderClient:
        """kube-scheduler's client certificate for the extender, and the CA
        of the extender's serving certificate."""
        assert self.certs.client_cert_file and self.certs.client_key_file
        return ExtenderClient(
            cert_file=self.certs.client_cert_file,
            key_file=self.certs.client_key_file,
            ca_file=self.certs.ca_file,
        )

    def tls_context(self, *, as_kube_scheduler: bool = False) -> ssl.SSLContext:
        """A client context trusting the extender's CA; with kube-scheduler's
        client certificate when ``as_kube_scheduler``."""
        context = ssl.create_default_context(cafile=str(self.certs.ca_file))
        if as_kube_scheduler:
            me = self.kube_scheduler_identity
            context.load_cert_chain(me.cert_file, me.key_file)
        return context

    def start(self) -> None:
        self.nats.start()
        self.settings = replace(
            Settings(),
            bus={"url": self.nats.url},
            scheduler={
                "extender_host": "127.0.0.1",
                "extender_port": self.extender_port,
                "console_port": self.console_ports["scheduler"],
                "console_token_file": str(self.root / "certs" / "console-token"),
            },
            injector={"host": "127.0.0.1", "port": self.webhook_port},
        )
        self.on_bus(lambda bus: streams.init(bus, self.settings.bus))
        api = self.cluster.api
        api.apply_yaml(CRD_FILES)
        api.apply_yaml(RBAC_FILES, namespace="hcs-system")
        api.apply_yaml(
            sorted((DEPLOY / "kube-system").glob("*.yaml")), skip_kinds=["Kustomization"]
        )
        self.cluster.add_runtime_classes(RUNTIME_CLASSES)
        wait_for(
            lambda: all(self._crd_established(f) for f in CRD_FILES),
            what="HCS CRDs established",
            timeout_s=30,
        )
        self.env = part_env(self.settings, certs_dir=self.root / "certs")
        self.env["HCS_TELEMETRY__LOG_LEVEL"] = "info"
        options = UpOptions(
            nats_url=self.nats.url,
            fleet=self.fleet,
            for_s=None,
            extender=f"127.0.0.1:{self.extender_port}",
            webhook=f"127.0.0.1:{self.webhook_port}",
            state_dir=self.root,
        )
        started = parts(options)
        argv = {p.name: p.argv for p in started}
        argv["mirror"] = [sys.executable, "-m", "scheduler.report.computenode_loop"]
        # each part's Prometheus /metrics, as ``hcs up`` serves them
        self.metrics_ports = {p.name: p.metrics_port for p in started if p.metrics_port}
        for name, command in argv.items():
            command = self.wrap[name](command) if name in self.wrap else command
            port = self.metrics_ports.get(name)
            extra = {"HCS_TELEMETRY__METRICS_PORT": str(port)} if port else {}
            self.start_part(name, command, **extra)
        wait_for(
            self._extender_ready, what="the extender's /readyz", timeout_s=60, explain=self.why
        )
        self._apply_webhook(self.certs.ca_bundle_b64)
        self._start_kube_scheduler(self.extender_url)

    def _start_kube_scheduler(self, extender_url: str) -> None:
        """(Re)start kube-scheduler with the project's configuration and ``extender_url``."""
        old = self.cluster.scheduler
        if old is not None:
            old.stop()
            self.cluster.processes.remove(old)
        kubeconfig = self.cluster.service_account_kubeconfig("hcs-system", "hcs-kube-scheduler")
        self.cluster.start_scheduler(
            extender_url=extender_url,
            kubeconfig=kubeconfig,
            extender_client=self.kube_scheduler_identity,
        )

    # -- scheduler replicas ------------------------------------------------------
    def start_replica(self, name: str, **extra_env: str) -> Process:
        """(Re)start scheduler replica ``name`` with the first replica's argv and
        environment, on its own extender port (kept across restarts)."""
        port = self.extender_ports.setdefault(name, free_port())
        console = self.console_ports.setdefault(name, free_port())
        argv = self.parts["scheduler"].argv
        return self.start_part(
            name,
            argv,
            HCS_SCHEDULER__EXTENDER_PORT=str(port),
            HCS_SCHEDULER__CONSOLE_PORT=str(console),
            **extra_env,
        )

    def replica_ready(self, name: str) -> bool:
        """The replica's extender answers ``/readyz`` (its view is replayed)."""
        url = f"https://127.0.0.1:{self.extender_ports[name]}/readyz"
        with urllib.request.urlopen(url, timeout=2, context=self.tls_context()) as resp:
            return bool(resp.status == 200)

    def front_replicas(self, names: list[str]) -> Front:
        """kube-scheduler restarted to reach the replicas ``names`` through one
        ``Front`` (round robin per request, as through a Service), since it
        takes one extender URL."""
        assert self.front is None, "the replicas already have a front"
        me = self.kube_scheduler_identity
        server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(me.ca_file))
        server.load_cert_chain(self.certs.cert_file, self.certs.key_file)  # as the replicas do
        server.verify_mode = ssl.CERT_REQUIRED  # kube-scheduler's certificate, or no connection
        self.front = Front(
            [self.extender_ports[n] for n in names],
            server_tls=server,
            client_tls=self.tls_context(as_kube_scheduler=True),
        )
        self.front.start()
        self._start_kube_scheduler(self.front.url)
        return self.front

    def one_replica_again(self) -> None:
        """Undo ``front_replicas``: the other replicas stopped, kube-scheduler
        back on the first replica's extender, the first replica running."""
        for name in [n for n in self.extender_ports if n != "scheduler"]:
            self.parts.pop(name).stop()
            del self.extender_ports[name]
            self.console_ports.pop(name, None)
        if self.front is not None:
            self._start_kube_scheduler(self.extender_url)
            self.front.stop()
            self.front = None
        first = self.parts["scheduler"]
        if not first.alive:
            first = self.start_part("scheduler", first.argv)
        first.wait_until(self._extender_ready, what="ready", timeout_s=60)

    def part_environment(self, name: str, **extra: str) -> dict[str, str]:
        env = dict(self.env)
        account = ACCOUNTS.get(name.split("-")[0])
        if account:
            env["HCS_KUBE__MODE"] = "kubeconfig"
            env["HCS_KUBE__KUBECONFIG"] = str(
                self.cluster.service_account_kubeconfig("hcs-system", account)
            )
        if name.startswith("healer"):
            env["HCS_HEALER__DRY_RUN"] = "false"
            env["HCS_HEALER__LEASE_NAMESPACE"] = "hcs-system"
            env["HCS_HEALER__RECOVERY_WINDOW_S"] = "30"  # failed nodes come back within a test
            # the tier injects several faults minutes apart, and the breaker's
            # window outlives a healer (it is kept on the bus): room for them
            # (the breaker itself is tested in tests/healer)
            env["HCS_HEALER__BREAKER_MAX_FRACTION"] = "0.5"
        env.update(extra)
        return env

    def _consoles(self, path: str) -> Iterator[tuple[str, Any]]:
        """(replica, its console's JSON answer at ``path``) of each scheduler
        replica that answers; one stopped by a test is left out."""
        auth = {"Authorization": f"Bearer {self.console_token}"}
        for replica, port in self.console_ports.items():
            request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=auth)
            try:
                with urllib.request.urlopen(request, timeout=5) as resp:
                    yield replica, json.load(resp)
            except OSError:
                continue

    def pods_held(self, namespace: str) -> int:
        """Pods of ``namespace`` that a running scheduler replica's view still
        holds a reservation for (its console's ``/api/overview``)."""
        return sum(
            int(r["pods"])
            for _replica, overview in self._consoles("/api/overview")
            for r in overview.get("namespaces", [])
            if r["namespace"] == namespace
        )

    def gangs_held(self, namespace: str) -> int:
        """Gang records of ``namespace`` in KV ``hcs_alloc``, waiting or
        pledged: the room a pledged gang planned is kept from other pods
        until the gang loop deletes its record (its members all gone)."""
        prefix = f"{gang_records.KEY_PREFIX}{namespace}="

        async def count(bus: Bus) -> int:
            held = await kvkeys.stored_values(
                bus, streams.KV_ALLOC, wanted=lambda key: key.startswith(prefix)
            )
            return len(held)

        return self.on_bus(count)

    def views_missing(self, names: Iterable[str]) -> dict[str, list[str]]:
        """Per running scheduler replica, the nodes of ``names`` its view cannot
        plan on yet (unknown, no devices, stale, or blocked), from its console's
        ``/api/nodes``; empty when every replica that answers can use them all.
        Right after a start the agents' first fingerprints may not be in."""
        wanted, out = set(names), {}
        for replica, page in self._consoles(f"/api/nodes?limit={len(wanted) + 100}"):
            usable = {
                r["name"]
                for r in page["nodes"]
                if r["devices"] and not r["blocked"] and r["state"] not in ("stale", "lost")
            }
            if missing := sorted(wanted - usable):
                out[replica] = missing
        return out

    def start_part(self, name: str, argv: list[str], **extra_env: str) -> Process:
        process = Process(
            name,
            argv,
            logs=self.root / "logs",
            env=self.part_environment(name, **extra_env),
            cwd=ROOT,
        )
        self.parts[name] = process
        return process

    def _crd_established(self, file: Path) -> bool:
        name = yaml.safe_load(file.read_text())["metadata"]["name"]
        crd = self.cluster.api.get(
            f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
        )
        return any(
            c["type"] == "Established" and c["status"] == "True"
            for c in crd.get("status", {}).get("conditions", [])
        )

    def _extender_ready(self) -> bool:
        url = f"{self.extender_url}/readyz"
        with urllib.request.urlopen(url, timeout=2, context=self.tls_context()) as resp:
            return bool(resp.status == 200)

    def _apply_webhook(self, ca_bundle_b64: str) -> None:
        doc: dict[str, Any] = copy.deepcopy(yaml.safe_load(WEBHOOK_CONFIG.read_text()))
        for hook in doc["webhooks"]:
            hook["clientConfig"] = {
                "url": f"https://127.0.0.1:{self.webhook_port}/mutate",
                "caBundle": ca_bundle_b64,
            }
        assert base64.b64decode(ca_bundle_b64)
        self.cluster.api.apply(doc)

    def on_bus(self, use: Callable[[Bus], Awaitable[T]]) -> T:
        """Run ``use(bus)`` on a connection of its own, as an outside client would."""

        async def go() -> T:
            bus = await connect(self.settings.bus, name="hcs-e2e-client")
            try:
                return await use(bus)
            finally:
                await bus.nc.close()

        return asyncio.run(go())

    def publish(self, subject: str, message: Any, *, msg_id: str) -> None:
        """Publish one message into its stream as an agent or probe would."""
        self.on_bus(lambda bus: bus.publish(subject, message, msg_id=msg_id))

    def report_checkpoint(self, *, namespace: str, job: str, uri: str, step: int) -> None:
        """What a training job's checkpoint hook does (``hcs_bus.checkpoint.report``)."""
        self.on_bus(
            lambda bus: checkpoint.report(bus, namespace=namespace, job=job, uri=uri, step=step)
        )

    def fingerprints(self, nodes: Iterable[str]) -> dict[str, NodeFingerprint]:
        """The latest ``NodeFingerprint`` of each node, from stream HCS_FP."""
        decode = messages.decoder_for(NodeFingerprint).decode

        async def read(bus: Bus) -> dict[str, NodeFingerprint]:
            return {
                node: decode((await bus.js.get_last_msg(streams.FP, subjects.fp(node))).data)
                for node in nodes
            }

        return self.on_bus(read)

    def fingerprint(self, node: str) -> NodeFingerprint:
        return self.fingerprints([node])[node]

    def why(self) -> str:
        """Which part died, with its last log lines (for failure messages)."""
        return why_dead(self.parts.values()) or "all HCS parts alive"

    def stop(self) -> None:
        from tests.e2e.processes import stop_all

        stop_all(list(self.parts.values()))
        if self.front is not None:
            self.front.stop()
        self.nats.cleanup()
