"""A real Kubernetes control plane with hollow kubelets, on loopback.

etcd (Debian ``etcd-server``), kube-apiserver, kube-controller-manager,
kube-scheduler (configured from ``deploy/scheduler/kube-scheduler-config.yaml``,
calling the extender over mutual TLS with the client certificate it is given)
and N ``kubemark --morph=kubelet`` hollow nodes (the real kubelet code over a
fake runtime), from the folder ``HCS_KUBE_BIN`` names (``../shared/kube``'s
``unpack.sh`` prints it). Free ports, one temporary folder, a log per
component; ``stop()`` leaves no process behind.

``Cluster.binaries()`` answers the reason to skip (naming the missing binary)
when something is absent. Facts this relies on are in ``../shared/kube/README.md``.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hcs_bus.natsserver import free_port
from tests.e2e.api import Api, ApiError, wait_for
from tests.e2e.pki import Identity, Pki
from tests.e2e.processes import Process, Revive, stop_all, why_dead

ROOT = Path(__file__).resolve().parents[2]
SCHEDULER_CONFIG = ROOT / "deploy" / "scheduler" / "kube-scheduler-config.yaml"
# gang members wait behind a scheduling gate (hcs.io/gang): alpha in 1.26, beta
# and on by default from 1.27
FEATURE_GATES = "PodSchedulingReadiness=true"
KUBE_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubemark")
SERVICE_RANGE = "10.96.0.0/24"
CONTROLLERS = (
    "*,-nodeipam,-cloud-node-lifecycle,-service,-route,-attachdetach,-persistentvolume-binder"
)
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
# the root folder a hollow kubelet makes for itself, as its log names it
HOLLOW_ROOT = re.compile(r"/tmp/hollow-kubelet\.\d+")


@dataclass(frozen=True)
class ExtenderClient:
    """kube-scheduler's side of the extender's mutual TLS (its ``tlsConfig``)."""

    cert_file: Path
    key_file: Path
    ca_file: Path  # the CA of the extender's serving certificate


@dataclass(frozen=True)
class Binaries:
    folder: Path
    etcd: Path

    def __getitem__(self, name: str) -> str:
        return str(self.folder / name)


def find_binaries() -> Binaries | str:
    """The binaries, or why the tier cannot run (naming what is missing)."""
    folder = os.environ.get("HCS_KUBE_BIN")
    if not folder:
        return (
            "HCS_KUBE_BIN is not set: no kube-apiserver/kube-scheduler/kubemark binaries "
            "(export HCS_KUBE_BIN=$(../shared/kube/unpack.sh))"
        )
    for name in KUBE_BINARIES:
        if not os.access(Path(folder) / name, os.X_OK):
            return f"{name} not found in HCS_KUBE_BIN={folder}"
    etcd = shutil.which("etcd") or "/usr/bin/etcd"
    if not os.access(etcd, os.X_OK):
        return "etcd not found (Debian package etcd-server)"
    return Binaries(Path(folder), Path(etcd))


def _fast_dir(prefix: str) -> Path:
    """A folder on tmpfs when there is one (etcd's fsyncs), else /tmp."""
    import tempfile

    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


class Cluster:
    """One control plane and its hollow nodes; every component logs to ``logs``."""

    def __init__(self, bins: Binaries, *, root: Path) -> None:
        self.bins = bins
        self.root = root
        self.logs = root / "logs"
        self.pki = Pki(root / "pki")
        self.processes: list[Process] = []
        self.nodes: dict[str, Process] = {}
        self._revive: Revive | None = None
        self.scheduler: Process | None = None
        self.api_port = free_port()
        self.server = f"https://127.0.0.1:{self.api_port}"
        self._etcd_dir = _fast_dir("hcs-e2e-etcd-")
        admin = self.pki.client("admin", user="hcs-e2e-admin", groups=("system:masters",))
        self.admin_kubeconfig = self.kubeconfig(admin, "admin")
        self.api = Api(
            self.server,
            ca_file=self.pki.ca_file,
            cert_file=admin.cert_file,
            key_file=admin.key_file,
        )

    # -- identities ----------------------------------------------------------
    def kubeconfig(self, identity: Identity, stem: str) -> Path:
        return self.pki.kubeconfig(
            identity, server=self.server, path=self.root / f"{stem}.kubeconfig"
        )

    def service_account_kubeconfig(self, namespace: str, name: str) -> Path:
        """A kubeconfig authenticating as that ServiceAccount would (user and groups)."""
        user = f"system:serviceaccount:{namespace}:{name}"
        identity = self.pki.client(
            f"sa-{namespace}-{name}",
            user=user,
            groups=("system:serviceaccounts", f"system:serviceaccounts:{namespace}"),
        )
        return self.kubeconfig(identity, f"sa-{namespace}-{name}")

    # -- control plane ---------------------------------------------------------
    def _start(self, name: str, argv: list[str], **kwargs: Any) -> Process:
        process = Process(name, argv, logs=self.logs, **kwargs)
        self.processes.append(process)
        return process

    def start(self, *, controllers: str = CONTROLLERS) -> None:
        """etcd, kube-apiserver (ready), bootstrap objects, kube-controller-manager
        running ``controllers`` (its ``--controllers``)."""
        etcd_port, peer_port = free_port(), free_port()
        etcd = self._start(
            "etcd",
            [
                str(self.bins.etcd),
                "--name=e2e",
                f"--data-dir={self._etcd_dir}",
                f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-cluster=e2e=http://127.0.0.1:{peer_port}",
                "--log-level=warn",
            ],
        )
        serving = self.pki.serving(
            "apiserver",
            names=("127.0.0.1", "localhost", "kubernetes", "kubernetes.default.svc", "10.96.0.1"),
        )
        apiserver = self._start(
            "kube-apiserver",
            [
                self.bins["kube-apiserver"],
                f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.api_port}",
                f"--tls-cert-file={serving.cert_file}",
                f"--tls-private-key-file={serving.key_file}",
                f"--client-ca-file={self.pki.ca_file}",
                f"--service-account-key-file={self.pki.sa_pub_file}",
                f"--service-account-signing-key-file={self.pki.sa_key_file}",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-cluster-ip-range={SERVICE_RANGE}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                "--profiling=false",
                "--max-requests-inflight=1000",
                "--max-mutating-requests-inflight=500",
                f"--feature-gates={FEATURE_GATES}",
                "--v=1",
            ],
        )
        apiserver.wait_until(
            lambda: self.api.request("GET", "/readyz", timeout_s=2) is not None,
            what="ready (/readyz)",
            timeout_s=60,
        )
        if not etcd.alive:
            raise etcd.failure("died")
        self._bootstrap()
        cm = self.pki.client(
            "controller-manager", user="system:kube-controller-manager", groups=("system:masters",)
        )
        self._start(
            "kube-controller-manager",
            [
                self.bins["kube-controller-manager"],
                f"--kubeconfig={self.kubeconfig(cm, 'controller-manager')}",
                f"--service-account-private-key-file={self.pki.sa_key_file}",
                f"--root-ca-file={self.pki.ca_file}",
                "--leader-elect=false",
                f"--controllers={controllers}",
                "--secure-port=0",
                "--concurrent-deployment-syncs=10",
                "--concurrent-replicaset-syncs=10",
                "--kube-api-qps=300",
                "--kube-api-burst=600",
                "--v=1",
            ],
        )

    def _bootstrap(self) -> None:
        wait_for(  # the API server creates it shortly after /readyz
            lambda: self.api.get("/api/v1/namespaces/default"),
            what="namespace default",
            timeout_s=30,
        )
        self.api.apply(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "hcs-system"}}
        )
        for ns in ("default", "hcs-system"):
            self.ensure_default_service_account(ns)

    def ensure_default_service_account(self, namespace: str) -> None:
        try:
            self.api.create(
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}},
                namespace=namespace,
            )
        except ApiError as exc:
            if exc.status != 409:
                raise

    def add_runtime_classes(self, names: Iterable[str]) -> None:
        """A RuntimeClass per name, its handler of the same name."""
        for name in names:
            self.api.apply(
                {
                    "apiVersion": "node.k8s.io/v1",
                    "kind": "RuntimeClass",
                    "metadata": {"name": name},
                    "handler": name,
                }
            )

    def namespace(self, name: str, *, labels: dict[str, str] | None = None) -> str:
        self.api.create(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": name, "labels": labels or {}},
            }
        )
        self.ensure_default_service_account(name)
        wait_for(
            lambda: self.api.items(
                f"/api/v1/namespaces/{name}/configmaps?fieldSelector=metadata.name=kube-root-ca.crt"
            ),
            what=f"kube-root-ca.crt in namespace {name}",
            timeout_s=30,
        )
        return name

    # -- kube-scheduler ---------------------------------------------------------
    def scheduler_config(
        self, *, extender_url: str, kubeconfig: Path, extender_client: ExtenderClient | None = None
    ) -> dict[str, Any]:
        """The project's own configuration, with only the cluster-specific
        fields set: the extender's URL and, for its mutual TLS, the files of
        ``extender_client`` (the serving certificate names 127.0.0.1, the
        URL's host, so the project's serverName goes)."""
        for doc in yaml.safe_load_all(SCHEDULER_CONFIG.read_text()):
            if doc and doc.get("kind") == "ConfigMap":
                config: dict[str, Any] = yaml.safe_load(doc["data"]["scheduler-config.yaml"])
                break
        else:
            raise AssertionError(f"{SCHEDULER_CONFIG}: no ConfigMap with scheduler-config.yaml")
        config["clientConnection"] = {
            **(config.get("clientConnection") or {}),
            "kubeconfig": str(kubeconfig),
        }
        config["leaderElection"] = {"leaderElect": False}
        for extender in config.get("extenders") or []:
            extender["urlPrefix"] = extender_url
            if extender_client is not None:
                extender["tlsConfig"] = {
                    "certFile": str(extender_client.cert_file),
                    "keyFile": str(extender_client.key_file),
                    "caFile": str(extender_client.ca_file),
                }
        return config

    def start_scheduler(
        self,
        *,
        extender_url: str,
        kubeconfig: Path | None = None,
        extender_client: ExtenderClient | None = None,
    ) -> Process:
        if kubeconfig is None:
            ident = self.pki.client("scheduler", user="system:kube-scheduler")
            kubeconfig = self.kubeconfig(ident, "scheduler")
        config = self.scheduler_config(
            extender_url=extender_url, kubeconfig=kubeconfig, extender_client=extender_client
        )
        path = self.root / "kube-scheduler-config.yaml"
        path.write_text(yaml.safe_dump(config))
        self.scheduler = self._start(
            "kube-scheduler",
            [
                self.bins["kube-scheduler"],
                f"--config={path}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                # its secure port on, as in a cluster: delegated authentication reads
                # kube-system/extension-apiserver-authentication with its own RBAC
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                f"--cert-dir={self.root / 'kube-scheduler-certs'}",
                f"--feature-gates={FEATURE_GATES}",
                "--v=1",
            ],
        )
        return self.scheduler

    def restart_scheduler(self) -> Process:
        assert self.scheduler is not None
        argv = self.scheduler.argv
        self.scheduler.stop()
        self.processes.remove(self.scheduler)
        self.scheduler = self._start("kube-scheduler", argv)
        return self.scheduler

    # -- hollow nodes ------------------------------------------------------------
    def add_nodes(self, names: list[str], *, labels: dict[str, str] | None = None) -> None:
        """Start a hollow kubelet per name; wait until each is Ready and untainted."""
        for name in names:
            ident = self.pki.client(
                f"node-{name}", user=f"system:node:{name}", groups=("system:nodes",)
            )
            kubeconfig = self.kubeconfig(ident, f"node-{name}")
            tmp = self.root / "kubelets" / name
            tmp.mkdir(parents=True, exist_ok=True)
            argv = [
                self.bins["kubemark"],
                "--morph=kubelet",
                f"--name={name}",
                f"--kubeconfig={kubeconfig}",
                f"--kubelet-port={free_port()}",
                "--kubelet-read-only-port=0",
                "--use-host-image-service=false",
                "--max-pods=110",
                "--v=0",
            ]
            if labels:
                argv.append("--node-labels=" + ",".join(f"{k}={v}" for k, v in labels.items()))
            env = {**os.environ, "TMPDIR": str(tmp)}
            self.nodes[name] = self._start(f"kubelet-{name}", argv, env=env)
        if self._revive is None:
            self._revive = Revive(self.nodes, replaced=self._replaced)
            self._revive.start()
        for name in names:
            self.nodes[name].wait_until(
                lambda n=name: self.node_ready(n), what=f"node {name} Ready", timeout_s=90
            )

    def _replaced(self, old: Process, new: Process) -> None:
        self.processes[self.processes.index(old)] = new

    @property
    def revived(self) -> list[str]:
        """The hollow kubelets started again after kubemark's fake-OS race."""
        return list(self._revive.revived) if self._revive is not None else []

    def node_ready(self, name: str) -> bool:
        node = self.api.get(f"/api/v1/nodes/{name}")
        conditions = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
        taints = {t["key"] for t in node.get("spec", {}).get("taints") or []}
        return conditions.get("Ready") == "True" and NOT_READY_TAINT not in taints

    # -- tear-down -------------------------------------------------------------
    def dead(self) -> list[str]:
        return [p.name for p in self.processes if not p.alive]

    def why(self) -> str:
        """Each dead process, its exit status and last log lines (for failure messages)."""
        return why_dead(self.processes)

    def stop(self) -> None:
        if self._revive is not None:
            self._revive.stop()
        stop_all(list(reversed(self.processes)))
        shutil.rmtree(self._etcd_dir, ignore_errors=True)
        for node in self.nodes.values():  # kubemark's hollow kubelet ignores TMPDIR
            for folder in set(HOLLOW_ROOT.findall(node.log.read_text(errors="replace"))):
                shutil.rmtree(folder, ignore_errors=True)
