"""The bus a benchmark runs on (``--bus``): ``single`` (one nats-server, every
stream R1), ``cluster`` (three servers on loopback, every stream R3: the
production layout) or ``cluster-sync`` (the same with ``jetstream.sync_interval:
always``, an fsync before every acknowledgement)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from hcs_bus.natsserver import NatsCluster, NatsServer

KINDS = ("single", "cluster", "cluster-sync")


@dataclass(frozen=True)
class Started:
    kind: str
    url: str  # one URL, or the cluster's comma-separated list
    replicas: int  # of every stream and bucket


@contextlib.contextmanager
def started(kind: str) -> Iterator[Started]:
    """Start the bus of ``kind`` for the block, with temporary stores."""
    if kind == "single":
        server = NatsServer().start()
        try:
            yield Started(kind, server.url, 1)
        finally:
            server.cleanup()
        return
    if kind not in KINDS:
        raise ValueError(f"--bus is one of {', '.join(KINDS)}, not {kind!r}")
    cluster = NatsCluster(size=3, sync_always=kind == "cluster-sync").start()
    try:
        yield Started(kind, cluster.urls, 3)
    finally:
        cluster.cleanup()
