"""The JSON of ``k8s.io/kube-scheduler/extender/v1`` (docs/architecture.md#kubernetes-wire-facts).

Keys are the capitalised Go field names. kube-scheduler owns these
documents, so what it sends (``ExtenderArgs``, ``ExtenderBindingArgs``,
``ExtenderPreemptionArgs`` and all inside them) is decoded leniently: a field
a newer kube-scheduler adds is ignored, a field of the wrong type is a 400.
What HCS owns inside them (the ``hcs.io/plan`` annotation) stays strict, and
so do the answers we write (a test decodes them strictly). Node objects are
kept as raw JSON so the non-cache filter answer returns them byte for byte.
Untyped JSON floats (quantities written as bare numbers) are read as their
text, so ``1e400`` reaches the quantity parser and is refused by name, not
lost as an out-of-range number.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

from scheduler.plan.pods import PodObject


class _Wire(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """An answer HCS writes."""


class _Sent(msgspec.Struct, kw_only=True):
    """Sent by kube-scheduler: unknown fields are a newer version's, ignored."""


class _NodeMeta(msgspec.Struct, frozen=True, kw_only=True):
    name: str = ""


class NodeName(msgspec.Struct, frozen=True, kw_only=True):
    metadata: _NodeMeta = _NodeMeta()


class NodeList(
    msgspec.Struct, kw_only=True, omit_defaults=True, rename={"api_version": "apiVersion"}
):
    """A core/v1 NodeList; ``items`` stay raw JSON."""

    items: list[msgspec.Raw]
    metadata: dict[str, object] | None = None
    kind: str | None = None
    api_version: str | None = None


class ExtenderArgs(_Sent):
    pod: PodObject = msgspec.field(name="Pod")
    nodes: NodeList | None = msgspec.field(default=None, name="Nodes")
    node_names: list[str] | None = msgspec.field(default=None, name="NodeNames")


class ExtenderFilterResult(_Wire):
    nodes: NodeList | None = msgspec.field(default=None, name="Nodes")
    node_names: list[str] | None = msgspec.field(default=None, name="NodeNames")
    failed: dict[str, str] = msgspec.field(default_factory=dict, name="FailedNodes")
    unresolvable: dict[str, str] = msgspec.field(
        default_factory=dict, name="FailedAndUnresolvableNodes"
    )
    error: str = msgspec.field(default="", name="Error")


class HostPriority(_Wire):
    host: str = msgspec.field(name="Host")
    score: int = msgspec.field(name="Score")


class ExtenderBindingArgs(_Sent):
    pod_name: str = msgspec.field(name="PodName")
    pod_namespace: str = msgspec.field(name="PodNamespace")
    pod_uid: str = msgspec.field(name="PodUID")
    node: str = msgspec.field(name="Node")


class ExtenderBindingResult(_Wire):
    error: str = msgspec.field(default="", name="Error")


class MetaPod(_Sent):
    uid: str = msgspec.field(name="UID")


class MetaVictims(_Sent):
    pods: list[MetaPod] = msgspec.field(default_factory=list, name="Pods")
    pdb_violations: int = msgspec.field(default=0, name="NumPDBViolations")


class _PodUid(msgspec.Struct, frozen=True, kw_only=True):
    uid: str = ""


class _VictimPod(msgspec.Struct, frozen=True, kw_only=True):
    metadata: _PodUid = _PodUid()


class Victims(_Sent):
    pods: list[_VictimPod] = msgspec.field(default_factory=list, name="Pods")
    pdb_violations: int = msgspec.field(default=0, name="NumPDBViolations")


class ExtenderPreemptionArgs(_Sent):
    pod: PodObject = msgspec.field(name="Pod")
    victims: dict[str, Victims] | None = msgspec.field(default=None, name="NodeNameToVictims")
    meta_victims: dict[str, MetaVictims] | None = msgspec.field(
        default=None, name="NodeNameToMetaVictims"
    )

    def candidates(self) -> dict[str, MetaVictims]:
        """Victims per candidate node as UIDs, whichever form was sent."""
        if self.meta_victims is not None:
            return self.meta_victims
        out: dict[str, MetaVictims] = {}
        for node, victims in (self.victims or {}).items():
            pods = [MetaPod(uid=p.metadata.uid) for p in victims.pods]
            out[node] = MetaVictims(pods=pods, pdb_violations=victims.pdb_violations)
        return out


class ExtenderPreemptionResult(_Wire):
    meta_victims: dict[str, MetaVictims] = msgspec.field(
        default_factory=dict, name="NodeNameToMetaVictims"
    )


ENCODER = msgspec.json.Encoder()
FILTER_ARGS = msgspec.json.Decoder(ExtenderArgs, float_hook=str)
BIND_ARGS = msgspec.json.Decoder(ExtenderBindingArgs)
PREEMPT_ARGS = msgspec.json.Decoder(ExtenderPreemptionArgs, float_hook=str)
_NODE_NAME = msgspec.json.Decoder(NodeName)

T = TypeVar("T")


def decode(decoder: msgspec.json.Decoder[T], body: bytes) -> T:
    """``decoder.decode(body)``; every undecodable body is a ``msgspec.DecodeError``
    (invalid UTF-8 and nesting too deep escape msgspec's own errors)."""
    try:
        return decoder.decode(body)
    except (UnicodeDecodeError, RecursionError) as exc:
        raise msgspec.DecodeError(f"undecodable JSON: {exc}") from exc


def node_names(args: ExtenderArgs) -> list[str]:
    """The candidate node names, from NodeNames or from Nodes' metadata.name."""
    if args.node_names is not None:
        return args.node_names
    if args.nodes is None:
        return []
    return raw_node_names(args.nodes.items)


def raw_node_names(items: list[msgspec.Raw]) -> list[str]:
    return [decode(_NODE_NAME, raw).metadata.name for raw in items]
