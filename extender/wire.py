"""The kube-scheduler extender HTTP/JSON protocol (k8s.io/kube-scheduler extender/v1), decoded and
encoded with msgspec.

The Go types carry no json tags, so keys on the wire are the capitalised Go field names. The
scheduler decodes case-insensitively but always sends capitalised keys; these types accept exactly
what it sends (unknown keys ignored: newer schedulers add some) and serialise with the same
spelling.

Why msgspec and not pydantic here: a request names every candidate node (thousands), on every
scheduling cycle. msgspec decodes straight into these structs, validating types as it goes, with
no Python object per field it skips (measured on the benchmark's requests: docs/benchmarks.md,
"Wire codec"). Pods and nodes nested inside stay ordinary Kubernetes JSON:

- the pod is a plain dict (the shape the demand functions read), its metadata checked once;
- a NodeList keeps each node as its raw bytes (`msgspec.Raw`): a filter answer sends the passing
  nodes back byte for byte, so they are never decoded into dicts nor encoded again; only each
  node's name is decoded from them.

pydantic stays at the edges where users write objects (Queues, claim configurations).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Annotated, Any, NamedTuple, TypeVar

import msgspec

# Scores an extender may return (MaxExtenderPriority); the scheduler multiplies them by 10 x weight.
MAX_EXTENDER_PRIORITY = 10

WireError = msgspec.DecodeError  # malformed JSON, or JSON of the wrong shape (a ValidationError)
NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]


class _Wire(msgspec.Struct):
    """Extender envelope types: capitalised keys, unknown keys ignored."""


class PodRef(NamedTuple):
    namespace: str
    name: str
    uid: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def pod_ref(pod: Mapping[str, Any]) -> PodRef:
    """Namespace, name and UID of a wire pod; ValueError when its metadata is not an object of strings."""
    metadata = pod.get("metadata")
    if not isinstance(metadata, dict):
        raise ValueError("Pod.metadata: an object is required")
    fields = (metadata.get("namespace", ""), metadata.get("name", ""), metadata.get("uid", ""))
    if not all(isinstance(value, str) for value in fields):
        raise ValueError("Pod.metadata: namespace, name and uid must be strings")
    return PodRef(*fields)


class _NodeMeta(msgspec.Struct):
    name: str = ""


class _NodeName(msgspec.Struct):
    metadata: _NodeMeta


_NODE_NAME = msgspec.json.Decoder(_NodeName)


class WireNodeList(_Wire, dict=True, omit_defaults=True):
    """A NodeList as the scheduler sends it (nodeCacheCapable: false): each node kept as raw JSON."""

    items: list[msgspec.Raw] = msgspec.field(default_factory=list)
    apiVersion: str | None = None
    kind: str | None = None

    def __post_init__(self) -> None:
        try:
            self._names = [_NODE_NAME.decode(node).metadata.name for node in self.items]
        except msgspec.ValidationError as exc:
            raise ValueError(f"Nodes.items: {exc}") from exc

    def names(self) -> list[str]:
        return self._names

    def keeping(self, names: Iterable[str]) -> NodeListAnswer:
        """The same list with only the nodes named, in their order, byte for byte."""
        keep = set(names)
        kept = [(node, name) for node, name in zip(self.items, self._names, strict=True) if name in keep]
        answer = NodeListAnswer(items=[node for node, _ in kept], apiVersion=self.apiVersion, kind=self.kind)
        return answer.named([name for _, name in kept])


class NodeListAnswer(_Wire, dict=True, omit_defaults=True):
    """The NodeList of a filter answer: the request's raw nodes that passed (`names`: theirs)."""

    items: list[msgspec.Raw] = msgspec.field(default_factory=list)
    apiVersion: str | None = None
    kind: str | None = None

    def named(self, names: list[str]) -> NodeListAnswer:
        self.names = names  # not a field: never encoded
        return self


class ExtenderArgs(_Wire):
    Pod: dict[str, Any]
    Nodes: WireNodeList | None = None
    NodeNames: list[str] | None = None

    def __post_init__(self) -> None:
        pod_ref(self.Pod)  # raises (a validation error when decoding) for a pod without metadata

    @property
    def pod(self) -> PodRef:
        return pod_ref(self.Pod)

    def candidate_names(self) -> list[str]:
        """Node names in the request, whichever nodeCacheCapable mode the scheduler uses."""
        if self.NodeNames is not None:
            return self.NodeNames
        if self.Nodes is not None:
            return self.Nodes.names()
        return []


class ExtenderFilterResult(_Wire):
    Nodes: NodeListAnswer | None = None
    NodeNames: list[str] | None = None
    FailedNodes: dict[str, str] = msgspec.field(default_factory=dict)
    FailedAndUnresolvableNodes: dict[str, str] = msgspec.field(default_factory=dict)
    Error: str = ""


class HostPriority(_Wire):
    Host: str
    Score: Annotated[int, msgspec.Meta(ge=0, le=MAX_EXTENDER_PRIORITY)]


ClassT = TypeVar("ClassT", bound=Hashable)
# The JSON around each host of a prioritize answer, by score: the text after a host's name up to the
# next host's name, and after the last host's name.
# A score outside 0..10 is a KeyError, not an answer the scheduler would refuse.
_BETWEEN_HOSTS = {score: f'","Score":{score}}},{{"Host":"' for score in range(MAX_EXTENDER_PRIORITY + 1)}
_AFTER_LAST_HOST = {score: f'","Score":{score}}}]' for score in range(MAX_EXTENDER_PRIORITY + 1)}


def host_priorities_json(
    hosts: Sequence[str], classes: Sequence[ClassT], score_of: Mapping[ClassT, int]
) -> bytes:
    """A HostPriorityList as JSON: one `HostPriority` per host, in order, scored by its class
    (`classes[i]` is the class of `hosts[i]`, `score_of` the score of each class, 0..10).

    A prioritize answer lists every candidate node (thousands), and hosts fall in few classes
    (the extender's node kinds): the JSON between two hosts' names depends only on the first
    one's score, so it is one string per class, and the answer is the hosts' names and those
    strings joined in C, with no Python code and no object per host. This holds when no name
    needs escaping in JSON (a name with a quote, a backslash or a control character: never a
    node's, which is a DNS name), checked by encoding the names alone (a tenth of the answer's
    time); otherwise the answer is encoded as `HostPriority` structs.
    """
    if not hosts:
        return b"[]"
    if b"\\" in encode(hosts):
        return encode(list(map(HostPriority, hosts, map(score_of.__getitem__, classes))))
    between = {cls: _BETWEEN_HOSTS[score] for cls, score in score_of.items()}
    parts = [""] * (2 * len(hosts))
    parts[0::2] = hosts
    parts[1::2] = map(between.__getitem__, classes)
    parts[0] = '[{"Host":"' + hosts[0]
    parts[-1] = _AFTER_LAST_HOST[score_of[classes[-1]]]
    return "".join(parts).encode()


class ExtenderBindingArgs(_Wire):
    PodName: NonEmpty
    PodNamespace: NonEmpty
    Node: NonEmpty
    PodUID: str = ""


class ExtenderBindingResult(_Wire):
    Error: str = ""


class MetaPod(_Wire):
    UID: NonEmpty


class MetaVictims(_Wire):
    Pods: list[MetaPod] = msgspec.field(default_factory=list)
    NumPDBViolations: int = 0


class _VictimMeta(msgspec.Struct):
    uid: str = ""


class _VictimPod(msgspec.Struct):
    metadata: _VictimMeta


class Victims(_Wire):
    """Whole victim pods (nodeCacheCapable: false); only their UIDs are read."""

    Pods: list[_VictimPod] = msgspec.field(default_factory=list)
    NumPDBViolations: int = 0


class ExtenderPreemptionArgs(_Wire):
    Pod: dict[str, Any]
    NodeNameToVictims: dict[str, Victims] | None = None  # nodeCacheCapable=false
    NodeNameToMetaVictims: dict[str, MetaVictims] | None = None  # nodeCacheCapable=true

    def __post_init__(self) -> None:
        pod_ref(self.Pod)

    @property
    def pod(self) -> PodRef:
        return pod_ref(self.Pod)

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
    NodeNameToMetaVictims: dict[str, MetaVictims] = msgspec.field(default_factory=dict)


WireT = TypeVar("WireT", bound=_Wire)
_decoders: dict[type[Any], msgspec.json.Decoder[Any]] = {}
_ENCODER = msgspec.json.Encoder()


def decode(kind: type[WireT], body: bytes) -> WireT:
    """A request body as `kind`; WireError (with the path of the first problem) when it is not one."""
    decoder = _decoders.get(kind)
    if decoder is None:
        decoder = _decoders[kind] = msgspec.json.Decoder(kind)
    result: WireT = decoder.decode(body)
    return result


def encode(value: object) -> bytes:
    """JSON of an answer (structs, or plain lists and dicts)."""
    return _ENCODER.encode(value)


def filter_result(args: ExtenderArgs, passed: list[str], failed: dict[str, str]) -> ExtenderFilterResult:
    """Answer in the same mode the scheduler asked in: names back for names, node objects for a list.

    An empty pass list must still be a list (not null) for the NodeList mode; with names, null and
    [] both mean "no node passes".
    """
    if args.NodeNames is not None or args.Nodes is None:
        return ExtenderFilterResult(NodeNames=passed, FailedNodes=failed)
    return ExtenderFilterResult(Nodes=args.Nodes.keeping(passed), FailedNodes=failed)


def passed_names(result: ExtenderFilterResult) -> list[str]:
    """The nodes a filter answer passes, whichever mode it is in."""
    if result.NodeNames is not None:
        return result.NodeNames
    return result.Nodes.names if result.Nodes is not None else []
