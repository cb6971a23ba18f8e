"""NATS users and subject permissions per part (docs/architecture.md#nats-users), the source of
truth for ``deploy/``.

Every allow list is built from ``hcs_bus.subjects`` and ``hcs_bus.streams``
so a renamed subject renames its permission. What each part may do:

* agent (one user per node): publish its own ``hcs.fp.<node>`` and
  ``hcs.health.<node>`` (JetStream publish: the ack comes to its inbox),
  nothing else (no plans: an agent never asks for one); subscribe only its
  own inbox ``_INBOX_<nodetoken>.>``.
* scheduler: serve ``hcs.place``/``hcs.place.dry``/``hcs.release`` in queue
  group ``hcs-scheduler``, answering into the inboxes of the users that may
  ask (``ASKING``) and nowhere else, publish ``hcs.alloc.*`` and the
  shared pool's reclaim alerts on ``hcs.usage.*`` and the checkpoint requests
  before a reclaim on ``hcs.ckpt.request.>``,
  read/compare-and-set/watch KV ``hcs_alloc``, read KV ``hcs_ckpt``
  (resume-from at bind), replay ``HCS_FP``/``HCS_HEALTH``, dead-letter what
  it cannot decode, create/update the streams at start (``streams.init``).
* injector: request ``hcs.place`` (plans that pledge: only it) and
  ``hcs.place.dry`` (admission dry runs); nothing else.
* healer: replay/consume ``HCS_FP``, ``HCS_ALLOC``, ``HCS_HEALTH`` (durable
  ``hcs-healer-health``; and followed over the circuit breaker's window at
  the start of each leadership term), publish verdicts on ``hcs.health._healer_<node>``
  (a token no agent may publish; NATS has no partial-token wildcard, so the
  allow is ``hcs.health.*``) and ``hcs.ckpt.request.>``, read KV ``hcs_ckpt``,
  ``streams.init``.
* mirror (``scheduler.report.computenode_loop``): replay/consume ``HCS_FP``, ``HCS_HEALTH``;
  its metering (``scheduler.report.usage_service``) follows ``HCS_ALLOC`` and publishes
  usage alerts on ``hcs.usage.*``.
* sidecar (checkpoint reporter in training pods): one user per namespace,
  ``sidecar:<ns>`` (``sidecar_user``): put and read only KV ``hcs_ckpt`` keys
  ``<ns>.<job>.<run>``, announce ``hcs.ckpt.<ns>.<job>``, listen on
  ``hcs.ckpt.request.<ns>.<job>`` — never another namespace's. Its seed is
  made and kept by the auth Job like a service's and handed to the namespace
  only, as Secret ``hcs-checkpoint-nats`` (key ``seed.nk``) in it
  (``checkpoint_secrets``).
* operator (the ``hcs`` CLI, an administrator's credential, never on a
  node): the JetStream API, dry-run plans and releases, subscribe ``hcs.>``.

Answers go to inboxes only. No user has ``allow_responses``: nats-server
lets an ``allow_responses`` reply through to whatever reply subject the
request named, past the user's own publish deny rules (tested in
``tests/deploy/test_confused_deputy.py``), so a requester naming
``$JS.API.STREAM.PURGE.<stream>`` would have the scheduler purge it. The
scheduler may publish into its askers' inboxes instead (``_INBOX_INJECTOR.>``,
``_INBOX_OPERATOR.>``), and ``hcs_bus.bus.Bus.serve`` answers only an inbox.
Deny rules, which hold even if an allow list grows: every user but the
operator is denied stream purge, stream delete and message delete
(``GUARDED``; the scheduler included, so it cannot purge the ledger's delete
markers either), and every user but the scheduler is denied writes to KV
``hcs_alloc`` (the operator keeps the JetStream API: it administers).

Services get upper-case inbox prefixes (``_INBOX_SCHEDULER``): Kubernetes node
names are lower case, so no node's inbox can ever collide with a service's.

``python -m hcs_bus.permissions register`` (agent init container) makes the
node's nkey on the host and labels its Node with the public key;
``python -m hcs_bus.permissions render`` (the ``hcs-nats-auth`` Job) renders
the ``authorization`` block for every registered node plus the services.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys

from hcs_bus import streams, subjects, vocabulary

JS_API = "$JS.API"
NKEY_LABEL = vocabulary.NATS_NKEY_LABEL
SERVICES = ("scheduler", "injector", "healer", "mirror", "operator")
SIDECAR = "sidecar"  # users sidecar:<namespace>, one per namespace (sidecar_user)
FLEET = "fleet"  # dev only: the simulated fleet, one process playing every node
HEALER_DURABLE = "hcs-healer-health"


@dataclass(frozen=True)
class Permissions:
    """Allow lists (everything else is denied) and publish deny rules (which
    win over the allow list), duplicates removed in order."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    allow_responses: bool = False
    deny_publish: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "publish", tuple(dict.fromkeys(self.publish)))
        object.__setattr__(self, "subscribe", tuple(dict.fromkeys(self.subscribe)))
        object.__setattr__(self, "deny_publish", tuple(dict.fromkeys(self.deny_publish)))


@dataclass(frozen=True)
class Credential:
    """How a user authenticates: an nkey public key, or user + password
    (a ``$NAME`` password is an environment reference resolved by nats-server)."""

    nkey: str | None = None
    password: str | None = None


# -- subject families ---------------------------------------------------------


def sidecar_user(namespace: str) -> str:
    """The NATS user of the checkpoint sidecars of ``namespace`` (a ``:`` no
    node name has, so it never collides with an agent user)."""
    subjects.ckpt_key(namespace, "x")  # SubjectError unless one plain token
    return f"{SIDECAR}:{namespace}"


def inbox_prefix(user: str) -> str:
    """The inbox prefix of a user: a node token for agents, a service (and a
    sidecar's namespace) in upper case, which no node token has."""
    if user.startswith(SIDECAR + ":"):
        return f"_INBOX_SIDECAR_{user.split(':', 1)[1].upper()}"
    token = user.upper() if user in (*SERVICES, FLEET) else subjects.node_token(user)
    return f"_INBOX_{token}"


def _inbox(user: str) -> str:
    return inbox_prefix(user) + ".>"


def stream_admin(names: Iterable[str]) -> list[str]:
    """What ``streams.init`` sends: stream info/create/update per stream."""
    return [f"{JS_API}.STREAM.{op}.{name}" for name in names for op in ("INFO", "CREATE", "UPDATE")]


def consuming(stream: str, *, durables: Sequence[str] = ()) -> list[str]:
    """Pull consumers (ephemeral or named durables) on a stream: create, fetch, ack."""
    out = [
        f"{JS_API}.STREAM.INFO.{stream}",
        f"{JS_API}.CONSUMER.CREATE.{stream}",
        f"{JS_API}.CONSUMER.CREATE.{stream}.>",
        f"{JS_API}.CONSUMER.INFO.{stream}.*",
        f"{JS_API}.CONSUMER.MSG.NEXT.{stream}.*",
        f"{JS_API}.CONSUMER.DELETE.{stream}.*",
        f"$JS.ACK.{stream}.>",
    ]
    out += [f"{JS_API}.CONSUMER.DURABLE.CREATE.{stream}.{d}" for d in durables]
    return out


def kv_reading(bucket: str) -> list[str]:
    stream = streams.kv_stream(bucket)
    return [
        f"{JS_API}.STREAM.INFO.{stream}",
        f"{JS_API}.DIRECT.GET.{stream}.{streams.kv_subject(bucket)}",
        f"{JS_API}.STREAM.MSG.GET.{stream}",
    ]


def kv_reading_keys(bucket: str, *, keys: str) -> list[str]:
    """Direct gets of ``keys`` only (no ``STREAM.MSG.GET``, which reads any key)."""
    stream = streams.kv_stream(bucket)
    return [
        f"{JS_API}.STREAM.INFO.{stream}",
        f"{JS_API}.DIRECT.GET.{stream}.{streams.kv_subject(bucket, keys)}",
    ]


def kv_writing(bucket: str, *, keys: str = ">") -> list[str]:
    return [streams.kv_subject(bucket, keys)]


def following(stream: str) -> list[str]:
    """``hcs_bus.bus.Follower`` and ``KeyValue.watch``: an ordered push
    consumer, which answers the server's flow-control requests."""
    return [*consuming(stream), f"$JS.FC.{stream}.>"]


def kv_watching(bucket: str) -> list[str]:
    return following(streams.kv_stream(bucket))


def dead_letters(*patterns: str) -> list[str]:
    return [subjects.dlq(p) for p in patterns]


def _all_streams() -> list[str]:
    names = [streams.FP, streams.HEALTH, streams.ALLOC, streams.DLQ]
    return [*names, streams.kv_stream(streams.KV_ALLOC), streams.kv_stream(streams.KV_CKPT)]


# Who may ask the scheduler what (core request-reply); it answers into these
# users' inboxes and nowhere else.
ASKING: dict[str, tuple[str, ...]] = {
    subjects.PLACE: ("injector",),
    subjects.PLACE_DRY: ("injector", "operator"),
    subjects.RELEASE: ("operator",),
}

# Denied to every user but the operator: no part ever purges or deletes a
# stream or a stored message.
GUARDED = (
    f"{JS_API}.STREAM.PURGE.>",
    f"{JS_API}.STREAM.DELETE.>",
    f"{JS_API}.STREAM.MSG.DELETE.>",
)


def asks(user: str) -> list[str]:
    """The scheduler's request subjects ``user`` may publish."""
    return [subject for subject, askers in ASKING.items() if user in askers]


def _guarded(*, ledger_writer: bool = False) -> tuple[str, ...]:
    """Deny rules of a part: ``GUARDED``, and the ledger unless it writes it."""
    ledger = () if ledger_writer else (streams.kv_subject(streams.KV_ALLOC, ">"),)
    return (*GUARDED, *ledger)


# -- parts --------------------------------------------------------------------


def agent(node: str) -> Permissions:
    return Permissions(
        publish=(subjects.fp(node), subjects.health(node)),
        subscribe=(_inbox(node),),
        deny_publish=_guarded(),
    )


def _scheduler() -> Permissions:
    publish = [
        subjects.ALLOC_ALL,
        subjects.USAGE_ALL,  # reclaim alerts of the shared pool (the gang loop)
        subjects.CKPT_REQUEST_PREFIX + ">",  # checkpoint before a reclaim evicts
        *kv_reading(streams.KV_ALLOC),
        *kv_writing(streams.KV_ALLOC, keys="*"),
        *kv_watching(streams.KV_ALLOC),
        *kv_reading(streams.KV_CKPT),
        *following(streams.FP),
        *following(streams.HEALTH),
        *dead_letters(subjects.FP_ALL, subjects.HEALTH_ALL),
        *stream_admin(_all_streams()),
        *(_inbox(user) for askers in ASKING.values() for user in askers),  # answers
    ]
    subscribe = [
        *(f"{subject} {subjects.PLACE_QUEUE}" for subject in ASKING),
        _inbox("scheduler"),
    ]
    return Permissions(tuple(publish), tuple(subscribe), deny_publish=_guarded(ledger_writer=True))


def _injector() -> Permissions:
    return Permissions(tuple(asks("injector")), (_inbox("injector"),), deny_publish=_guarded())


def _healer() -> Permissions:
    publish = [
        subjects.HEALTH_ALL,
        subjects.CKPT_REQUEST_PREFIX + ">",
        *consuming(streams.FP),
        *consuming(streams.ALLOC),
        *consuming(streams.HEALTH, durables=(HEALER_DURABLE,)),
        f"$JS.FC.{streams.HEALTH}.>",  # the breaker's window, replayed at each term's start
        *kv_reading(streams.KV_CKPT),
        *dead_letters(subjects.FP_ALL, subjects.HEALTH_ALL, subjects.ALLOC_ALL),
        *stream_admin(_all_streams()),
    ]
    return Permissions(tuple(publish), (_inbox("healer"),), deny_publish=_guarded())


def _mirror() -> Permissions:
    publish = [
        *consuming(streams.FP),
        *consuming(streams.HEALTH),
        *following(streams.ALLOC),
        subjects.USAGE_ALL,
        *dead_letters(subjects.FP_ALL, subjects.HEALTH_ALL, subjects.ALLOC_ALL),
    ]
    return Permissions(tuple(publish), (_inbox("mirror"),), deny_publish=_guarded())


def sidecar(namespace: str) -> Permissions:
    """The sidecars of one namespace: its keys and subjects only (keys
    ``<ns>.*.*``: a job and a run token; subjects ``<ns>.*``: one job token, so
    ``hcs.ckpt.<ns>.*`` never matches a request subject)."""
    user = sidecar_user(namespace)
    mine, keys = f"{namespace}.*", f"{namespace}.*.*"
    publish = [
        subjects.CKPT_PREFIX + mine,
        *kv_reading_keys(streams.KV_CKPT, keys=keys),
        *kv_writing(streams.KV_CKPT, keys=keys),
    ]
    subscribe = [subjects.CKPT_REQUEST_PREFIX + mine, _inbox(user)]
    return Permissions(tuple(publish), tuple(subscribe), deny_publish=_guarded())


def _operator() -> Permissions:
    publish = [
        *asks("operator"),
        subjects.CKPT_REQUEST_PREFIX + ">",
        f"{JS_API}.>",
        "$JS.ACK.>",
        "$JS.FC.>",
    ]
    ledger = (streams.kv_subject(streams.KV_ALLOC, ">"),)
    return Permissions(tuple(publish), ("hcs.>", _inbox("operator")), deny_publish=ledger)


def _fleet() -> Permissions:
    publish = (subjects.FP_ALL, subjects.HEALTH_ALL)
    return Permissions(publish, (_inbox(FLEET),), deny_publish=_guarded())


def service(name: str) -> Permissions:
    """The permissions of one service user (see ``SERVICES``)."""
    makers = {
        "scheduler": _scheduler,
        "injector": _injector,
        "healer": _healer,
        "mirror": _mirror,
        "operator": _operator,
        FLEET: _fleet,
    }
    if name not in makers:
        raise KeyError(f"no NATS service user {name!r}; known: {', '.join(SERVICES)}")
    return makers[name]()


# -- the authorization block --------------------------------------------------


def nats_authorization(
    nodes: Iterable[str],
    credentials: Mapping[str, Credential],
    *,
    namespaces: Iterable[str] = (),
    simulated_fleet: bool = False,
) -> dict[str, Any]:
    """The ``authorization`` block: one user per node, per service and per
    namespace whose sidecars report checkpoints (``sidecar:<ns>``).

    ``credentials`` maps a node name, a service name or a sidecar user to its
    credential; every user must have one (a user without is an error).
    ``simulated_fleet`` adds the dev-only user ``fleet`` (publishes for any
    node, verdicts included: never in production).
    """
    users: list[dict[str, Any]] = []
    for name in (*SERVICES, FLEET) if simulated_fleet else SERVICES:
        users.append(_user(name, service(name), credentials))
    for namespace in sorted(set(namespaces)):
        users.append(_user(sidecar_user(namespace), sidecar(namespace), credentials))
    for node in sorted(set(nodes)):
        users.append(_user(node, agent(node), credentials))
    return {"users": users}


def _user(name: str, perms: Permissions, credentials: Mapping[str, Credential]) -> dict[str, Any]:
    cred = credentials.get(name)
    if cred is None or not (cred.nkey or cred.password):
        raise KeyError(f"no NATS credential for {name!r}")
    user: dict[str, Any] = (
        {"nkey": cred.nkey}
        if cred.nkey
        else {
            "user": name,
            "password": cred.password,
        }
    )
    publish: dict[str, Any] = {"allow": list(perms.publish)}
    if perms.deny_publish:
        publish["deny"] = list(perms.deny_publish)
    rules: dict[str, Any] = {"publish": publish, "subscribe": {"allow": list(perms.subscribe)}}
    if perms.allow_responses:
        rules["allow_responses"] = True
    user["permissions"] = rules
    return user


def render_nats_conf(authorization: Mapping[str, Any]) -> str:
    """nats.conf syntax of an ``authorization`` block (strings quoted, so
    ``$KV.x`` is literal; a bare ``$NAME`` password is an env reference)."""
    lines = ["authorization {", "  users = ["]
    for user in authorization["users"]:
        lines.append("    " + _value(user) + ",")
    lines += ["  ]", "}", ""]
    return "\n".join(lines)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        if value.startswith("$") and value[1:].replace("_", "").isalnum():
            return value
        return json.dumps(value)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"cannot render {value!r} into nats.conf")


# -- nkeys (Ed25519 user keys, through the nkeys package) --------------------


def new_user_seed() -> str:
    """A fresh user nkey seed (``SU…``), as ``nk -gen user`` prints it."""
    return nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER).decode()


def public_key(seed: str) -> str:
    """The ``U…`` public key of a user seed; ValueError when it is not one."""
    text = seed.strip().encode()
    try:
        raw = base64.b32decode(text + b"=" * (-len(text) % 8))
        if nkeys.crc16_checksum(raw[:-2]) != raw[-2:]:
            raise ValueError("checksum mismatch")
        public = nkeys.from_seed(text).public_key.decode()
    except (nkeys.NkeysError, ValueError, binascii.Error) as exc:
        raise ValueError(f"not a valid nkey seed: {exc!r}") from exc
    if not public.startswith("U"):
        raise ValueError("not a valid nkey seed: it is not a user key")
    return public


def ensure_seed(path: Path) -> str:
    """The seed in ``path``, made (mode 0600) when missing; returns the public key."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(new_user_seed() + "\n")
    return public_key(path.read_text())


# -- command line: register (agent init) and render (auth Job) ---------------


def registered_nodes(node_list: Mapping[str, Any]) -> dict[str, Credential]:
    """Nodes of a ``kubectl get nodes -o json`` list that registered an nkey."""
    out: dict[str, Credential] = {}
    for item in node_list.get("items") or []:
        meta = item.get("metadata") or {}
        key = (meta.get("labels") or {}).get(NKEY_LABEL)
        if key and str(key).startswith("U"):
            out[str(meta["name"])] = Credential(nkey=str(key))
    return out


def listed_namespaces(namespace_list: Mapping[str, Any]) -> list[str]:
    """Names in a ``kubectl get namespaces -o json`` list (the Job lists those
    labelled ``hcs.io/checkpoints``: their sidecars get ``sidecar:<ns>``)."""
    items = namespace_list.get("items") or []
    return sorted({str((i.get("metadata") or {}).get("name")) for i in items} - {"None"})


def service_credentials(seeds_dir: Path, *, names: Sequence[str]) -> dict[str, Credential]:
    """Each service's seed in ``<dir>/<service>.nk`` (``sidecar:ml``:
    ``sidecar-ml.nk``), made when missing."""
    return {
        name: Credential(nkey=ensure_seed(seeds_dir / f"{name.replace(':', '-')}.nk"))
        for name in names
    }


def checkpoint_secrets(seeds_dir: Path, *, namespaces: Iterable[str]) -> dict[str, Any]:
    """A ``v1`` List of the Secrets ``hcs-checkpoint-nats`` (key ``seed.nk``),
    one in each namespace of ``namespaces``, holding the seed of its user
    ``sidecar:<ns>`` from ``seeds_dir`` (``service_credentials`` made it)."""
    items = []
    for namespace in sorted(set(namespaces)):
        path = seeds_dir / f"{sidecar_user(namespace).replace(':', '-')}.nk"
        seed = path.read_text().strip()
        items.append(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "Opaque",
                "metadata": {
                    "name": vocabulary.CHECKPOINT_SECRET,
                    "namespace": namespace,
                    "labels": {"app.kubernetes.io/part-of": "hcs"},
                    "annotations": {NKEY_LABEL: public_key(seed)},
                },
                "data": {
                    vocabulary.CHECKPOINT_SEED_KEY: base64.b64encode(
                        (seed + "\n").encode()
                    ).decode()
                },
            }
        )
    return {"apiVersion": "v1", "kind": "List", "items": items}


def _render(args: argparse.Namespace) -> int:
    node_list = json.loads(Path(args.nodes_json).read_text())
    nodes = registered_nodes(node_list)
    listed = json.loads(Path(args.namespaces_json).read_text()) if args.namespaces_json else {}
    namespaces = sorted({*args.sidecar_namespace, *listed_namespaces(listed)})
    names = (*SERVICES, FLEET) if args.simulated_fleet else SERVICES
    names = (*names, *(sidecar_user(ns) for ns in namespaces))
    creds = {**nodes, **service_credentials(Path(args.seeds_dir), names=names)}
    auth = nats_authorization(
        nodes, creds, namespaces=namespaces, simulated_fleet=args.simulated_fleet
    )
    text = render_nats_conf(auth)
    Path(args.out).write_text(text)
    if args.checkpoint_secrets_out:
        found = checkpoint_secrets(Path(args.seeds_dir), namespaces=namespaces)
        Path(args.checkpoint_secrets_out).write_text(json.dumps(found))
    print(f"rendered {len(nodes)} agent users and {len(names)} services into {args.out}")
    return 0


async def _register(args: argparse.Namespace) -> int:
    from hcs_bus import kube as kube_module
    from hcs_bus import settings as settings_module

    public = ensure_seed(Path(args.seed_file))
    kube = await kube_module.connect(settings_module.load().kube)
    if kube is None:
        print("no cluster configured: seed made, node not labelled", file=sys.stderr)
        return 0
    try:
        await kube.patch_node_labels(args.node, {NKEY_LABEL: public})
    finally:
        await kube.close()
    print(f"node {args.node} registered nkey {public}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hcs_bus.permissions")
    sub = parser.add_subparsers(dest="command", required=True)
    reg = sub.add_parser("register", help="make this node's nkey and label its Node")
    reg.add_argument("--node", default=os.environ.get("NODE_NAME"), required=False)
    reg.add_argument("--seed-file", default="/var/lib/hcs/nats/agent.nk")
    ren = sub.add_parser("render", help="render the authorization block")
    ren.add_argument("--nodes-json", required=True, help="kubectl get nodes -o json")
    ren.add_argument("--seeds-dir", required=True, help="service seeds (<service>.nk)")
    ren.add_argument("--out", required=True)
    ren.add_argument("--simulated-fleet", action="store_true", help="add user fleet (dev)")
    ren.add_argument(
        "--sidecar-namespace",
        action="append",
        default=[],
        help="a namespace whose checkpoint sidecars get user sidecar:<ns> (repeatable)",
    )
    ren.add_argument(
        "--namespaces-json", help="kubectl get namespaces -o json: each a sidecar user"
    )
    ren.add_argument(
        "--checkpoint-secrets-out",
        help="write here a v1 List of Secrets hcs-checkpoint-nats, one per sidecar namespace",
    )
    args = parser.parse_args(argv)
    if args.command == "render":
        return _render(args)
    if not args.node:
        parser.error("register: --node or $NODE_NAME is required")
    return asyncio.run(_register(args))


if __name__ == "__main__":
    sys.exit(main())
