"""Queue tenancy: which namespaces' pods may use a queue. Pure: plain data in, a reason out.

A Queue may name the namespaces whose pods use it (`spec.namespaces`) and select more by their
labels (`spec.namespaceSelector`, a Kubernetes label selector: `matchLabels` and
`matchExpressions` with In, NotIn, Exists, DoesNotExist). A namespace may use the queue when it is
named *or* selected. A queue with neither field is open to every namespace: a cluster with one
team, or Queues written before tenancy existed, keep working unchanged - the price is that the
admin restricts a queue explicitly, and until then a pod's queue label is taken at its word. An
empty list and no selector (`namespaces: []`) opens the queue to no namespace (a queue being
retired); an empty selector (`namespaceSelector: {}`) selects every namespace, as in Kubernetes.

Restrictions hold for a whole subtree: pods run in leaf queues, so a parent's list or selector
restricts its descendants, and a pod's namespace must be admitted by its queue and by every
ancestor. A child can narrow what its parent allows, never widen it: a Queue created under
`team-y` (creating Queues is a cluster-admin right) cannot open team-y's quota to other teams.
Parent `research` takes namespaces labelled `org=research`; its child `nlp` takes `nlp-dev` and
`nlp-prod`: a pod of `nlp-dev` may use `nlp` only if `nlp-dev` carries `org=research` too.

`tenancy_refusal` is the one decision: '' (may use it) or why not, naming the queue and the
namespace. The pod webhook refuses the pod with it, the filter refuses every node with it (the
webhook may be bypassed), the accounting counts such a pending pod as no demand of the queue, the
gate controller keeps such a pod gated, and the Namespace webhook refuses a default-queue label
naming a queue the namespace may not use. A queue that does not
exist, or whose ancestry is broken, is not judged here: admission refuses it with its own reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

Operator = Literal["In", "NotIn", "Exists", "DoesNotExist"]
# Set on every Namespace by the API server: a selector can pick namespaces by name with it, and a
# namespace the picture has not seen yet is judged by its name alone.
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
# Names shown in a refusal before "and N more" (the list itself may be long).
SHOWN_NAMES = 8


@dataclass(frozen=True)
class LabelRequirement:
    """One requirement of a label selector (`matchLabels` entries are In with one value)."""

    key: str
    operator: Operator
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        inside = self.key in labels and labels[self.key] in self.values
        return inside if self.operator == "In" else not inside

    def describe(self) -> str:
        if self.operator == "Exists":
            return self.key
        if self.operator == "DoesNotExist":
            return f"!{self.key}"
        if self.operator == "In" and len(self.values) == 1:
            return f"{self.key}={self.values[0]}"
        word = "in" if self.operator == "In" else "notin"
        return f"{self.key} {word} ({','.join(self.values)})"


@dataclass(frozen=True)
class NamespaceSelector:
    """A label selector over Namespaces: every requirement must hold (none: every namespace)."""

    requirements: tuple[LabelRequirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(requirement.matches(labels) for requirement in self.requirements)

    def describe(self) -> str:
        """The selector as kubectl's `-l` would take it."""
        return ",".join(requirement.describe() for requirement in self.requirements)


@dataclass(frozen=True)
class Tenancy:
    """Which namespaces may use one queue (both None: any)."""

    namespaces: frozenset[str] | None = None
    selector: NamespaceSelector | None = None

    @property
    def open(self) -> bool:
        return self.namespaces is None and self.selector is None

    def admits(self, namespace: str, labels: Mapping[str, str]) -> bool:
        if self.open or namespace in (self.namespaces or ()):
            return True
        return self.selector is not None and self.selector.matches(labels)

    def describe(self) -> str:
        """Whom the queue takes, for a refusal: "namespaces a, b or namespaces labelled team=y"
        ('' for a queue that takes no namespace)."""
        parts = []
        if self.namespaces:
            names = sorted(self.namespaces)
            shown = ", ".join(names[:SHOWN_NAMES])
            more = f" and {len(names) - SHOWN_NAMES} more" if len(names) > SHOWN_NAMES else ""
            parts.append(f"namespace{'s' if len(names) > 1 else ''} {shown}{more}")
        if self.selector is not None:
            parts.append(f"namespaces labelled {self.selector.describe()}")
        return " or ".join(parts)


OPEN = Tenancy()


class TenantQueue(Protocol):
    """What tenancy reads of a queue (`extender.policy.fairness.QueueSpec` is one)."""

    @property
    def parent(self) -> str | None: ...

    @property
    def tenancy(self) -> Tenancy: ...


def selector_labels(namespace: str, labels: Mapping[str, object] | None) -> dict[str, str]:
    """A Namespace's labels as a selector reads them; None (not seen yet): its name label alone."""
    found = {str(key): str(value) for key, value in (labels or {}).items()}
    found.setdefault(NAMESPACE_NAME_LABEL, namespace)
    return found


def tenancy_refusal(
    queues: Mapping[str, TenantQueue], queue: str, namespace: str, labels: Mapping[str, str]
) -> str:
    """Why pods of `namespace` (with Namespace `labels`) may not use `queue` ('' when they may).

    The queue and each ancestor must admit the namespace; the first that does not is named.
    An unknown queue, or a chain that breaks (unknown parent, cycle), stops the walk: the
    admission rule refuses those queues for what they are.
    """
    seen: set[str] = set()
    name: str | None = queue
    while name is not None and name in queues and name not in seen:
        seen.add(name)
        spec = queues[name]
        if not spec.tenancy.admits(namespace, labels):
            whose = "it" if name == queue else f"its ancestor queue '{name}'"
            whom = spec.tenancy.describe()
            takes = "takes pods of no namespace" if not whom else f"takes only pods of {whom}"
            return f"namespace '{namespace}' may not use queue '{queue}': {whose} {takes}"
        name = spec.parent
    return ""
