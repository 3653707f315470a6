"""Typed models of the kube-scheduler extender HTTP/JSON protocol (k8s.io/kube-scheduler extender/v1).

The Go types carry no json tags, so keys on the wire are the capitalised Go field names. The
scheduler decodes case-insensitively but always sends capitalised keys; these models accept
exactly what it sends and serialise with the same spelling. Pods and nodes nested inside stay
ordinary Kubernetes JSON; only the few fields the extender reads are typed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from json.encoder import encode_basestring_ascii
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# Scores an extender may return (MaxExtenderPriority); the scheduler multiplies them by 10 x weight.
MAX_EXTENDER_PRIORITY = 10


class _KubeObject(BaseModel):
    """Nested Kubernetes JSON: unknown fields are kept, so the raw object survives a round trip."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


class ObjectMeta(_KubeObject):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class WirePod(_KubeObject):
    metadata: ObjectMeta
    spec: dict[str, Any] = Field(default_factory=dict)
    status: dict[str, Any] = Field(default_factory=dict)

    def raw(self) -> dict[str, Any]:
        """The pod as plain Kubernetes JSON, the shape the demand functions read."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=False)


class WireNode(_KubeObject):
    """A node travels back unchanged, so its metadata stays raw JSON."""

    metadata: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))


class WireNodeList(_KubeObject):
    items: list[WireNode] = Field(default_factory=list)


class _Wire(BaseModel):
    """Extender envelope types: capitalised keys, unknown keys ignored (newer schedulers add some)."""

    model_config = ConfigDict(extra="ignore")


class ExtenderArgs(_Wire):
    Pod: WirePod
    Nodes: WireNodeList | None = None
    NodeNames: list[str] | None = None

    def candidate_names(self) -> list[str]:
        """Node names in the request, whichever nodeCacheCapable mode the scheduler uses."""
        if self.NodeNames is not None:
            return list(self.NodeNames)
        if self.Nodes is not None:
            return [node.name for node in self.Nodes.items]
        return []


class ExtenderFilterResult(_Wire):
    Nodes: WireNodeList | None = None
    NodeNames: list[str] | None = None
    FailedNodes: dict[str, str] = Field(default_factory=dict)
    FailedAndUnresolvableNodes: dict[str, str] = Field(default_factory=dict)
    Error: str = ""


class HostPriority(_Wire):
    Host: str
    Score: int = Field(ge=0, le=MAX_EXTENDER_PRIORITY)


def host_priorities_json(hosts: Iterable[str], scores: Mapping[str, int]) -> str:
    """A HostPriorityList as JSON: one `HostPriority` per host, in order, with its score.

    Written directly: a prioritize answer lists every candidate node (thousands), and building a
    validated model per node cost more than the scoring itself. Scores come from the extender's
    own ranking, already within 0..MAX_EXTENDER_PRIORITY.
    """
    # encode_basestring_ascii is json.dumps' own string encoder (quotes and escapes).
    return (
        "["
        + ",".join([f'{{"Host":{encode_basestring_ascii(host)},"Score":{scores[host]}}}' for host in hosts])
        + "]"
    )


class ExtenderBindingArgs(_Wire):
    PodName: str = Field(min_length=1)
    PodNamespace: str = Field(min_length=1)
    PodUID: str = ""
    Node: str = Field(min_length=1)


class ExtenderBindingResult(_Wire):
    Error: str = ""


class MetaPod(_Wire):
    UID: str = Field(min_length=1)


class MetaVictims(_Wire):
    Pods: list[MetaPod] = Field(default_factory=list)
    NumPDBViolations: int = 0


class Victims(_Wire):
    Pods: list[WirePod] = Field(default_factory=list)
    NumPDBViolations: int = 0


class ExtenderPreemptionArgs(_Wire):
    Pod: WirePod
    NodeNameToVictims: dict[str, Victims] | None = None  # nodeCacheCapable=false
    NodeNameToMetaVictims: dict[str, MetaVictims] | None = None  # nodeCacheCapable=true

    def victim_uids(self) -> dict[str, tuple[list[str], int]]:
        """Node -> (victim UIDs, PDB violations), whichever form the scheduler sent."""
        if self.NodeNameToMetaVictims is not None:
            return {
                node: ([p.UID for p in v.Pods], v.NumPDBViolations)
                for node, v in self.NodeNameToMetaVictims.items()
            }
        return {
            node: ([p.metadata.uid for p in v.Pods], v.NumPDBViolations)
            for node, v in (self.NodeNameToVictims or {}).items()
        }


class ExtenderPreemptionResult(_Wire):
    NodeNameToMetaVictims: dict[str, MetaVictims] = Field(default_factory=dict)


def filter_result(args: ExtenderArgs, passed: list[str], failed: dict[str, str]) -> ExtenderFilterResult:
    """Answer in the same mode the scheduler asked in: names back for names, node objects for a list.

    An empty pass list must still be a list (not null) for the NodeList mode; with names, null and
    [] both mean "no node passes".
    """
    if args.NodeNames is not None or args.Nodes is None:
        return ExtenderFilterResult(NodeNames=passed, FailedNodes=failed)
    keep = set(passed)
    items = [node for node in args.Nodes.items if node.name in keep]
    return ExtenderFilterResult(Nodes=args.Nodes.model_copy(update={"items": items}), FailedNodes=failed)
