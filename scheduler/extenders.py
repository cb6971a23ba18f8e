"""The JSON of ``k8s.io/kube-scheduler/extender/v1`` (DESIGN §6).

Keys are the capitalised Go field names. The envelopes are ours and decoded
strictly (an unknown key is a 400); the Pod and Node objects inside are the
API's and decoded leniently. Node objects are kept as raw JSON so the
non-cache filter answer returns them byte for byte.
"""

from __future__ import annotations

import msgspec

from scheduler.pods import PodObject


class _Wire(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


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


class ExtenderArgs(_Wire):
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


class ExtenderBindingArgs(_Wire):
    pod_name: str = msgspec.field(name="PodName")
    pod_namespace: str = msgspec.field(name="PodNamespace")
    pod_uid: str = msgspec.field(name="PodUID")
    node: str = msgspec.field(name="Node")


class ExtenderBindingResult(_Wire):
    error: str = msgspec.field(default="", name="Error")


class MetaPod(_Wire):
    uid: str = msgspec.field(name="UID")


class MetaVictims(_Wire):
    pods: list[MetaPod] = msgspec.field(default_factory=list, name="Pods")
    pdb_violations: int = msgspec.field(default=0, name="NumPDBViolations")


class _PodUid(msgspec.Struct, frozen=True, kw_only=True):
    uid: str = ""


class _VictimPod(msgspec.Struct, frozen=True, kw_only=True):
    metadata: _PodUid = _PodUid()


class Victims(_Wire):
    pods: list[_VictimPod] = msgspec.field(default_factory=list, name="Pods")
    pdb_violations: int = msgspec.field(default=0, name="NumPDBViolations")


class ExtenderPreemptionArgs(_Wire):
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
FILTER_ARGS = msgspec.json.Decoder(ExtenderArgs)
BIND_ARGS = msgspec.json.Decoder(ExtenderBindingArgs)
PREEMPT_ARGS = msgspec.json.Decoder(ExtenderPreemptionArgs)
_NODE_NAME = msgspec.json.Decoder(NodeName)


def node_names(args: ExtenderArgs) -> list[str]:
    """The candidate node names, from NodeNames or from Nodes' metadata.name."""
    if args.node_names is not None:
        return args.node_names
    if args.nodes is None:
        return []
    return [_NODE_NAME.decode(raw).metadata.name for raw in args.nodes.items]
