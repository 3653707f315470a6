"""Readers of plain Kubernetes JSON that every part needs: object keys, a pod's claims, and one
way to turn a pydantic validation error into the message a user reads on an object or a 4xx."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError


# Called for nearly every field read from Kubernetes JSON. Objects decoded from JSON are plain
# dicts and lists, so those are tested first: an ABC isinstance check costs several times more.
def mapping(value: object) -> Mapping[str, Any]:
    return value if type(value) is dict or isinstance(value, Mapping) else {}


def sequence(value: object) -> Sequence[Any]:
    return value if type(value) is list or isinstance(value, list | tuple) else ()


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return mapping(obj.get("metadata"))


def object_key(obj: Mapping[str, Any]) -> str:
    """`namespace/name` for a namespaced object, `name` for a cluster-scoped one."""
    metadata = meta(obj)
    namespace = metadata.get("namespace")
    return f"{namespace}/{metadata.get('name')}" if namespace else str(metadata.get("name"))


def controller_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """The owner reference marked `controller: true` (empty when there is none)."""
    for owner in sequence(meta(obj).get("ownerReferences")):
        if mapping(owner).get("controller") is True:
            return mapping(owner)
    return {}


def validation_problems(error: ValidationError, root: str, limit: int | None = None) -> str:
    """`field.path: message; ...` for each problem (at most `limit`), `root` for the object itself."""
    return "; ".join(
        f"{'.'.join(str(part) for part in item['loc']) or root}: {item['msg']}"
        for item in error.errors()[:limit]
    )


@dataclass(frozen=True)
class ClaimRef:
    """One claim of a pod, in the pod's namespace: its name once known, and the template it comes from."""

    claim: str | None
    template: str | None


def pod_claim_refs(pod: Mapping[str, Any]) -> list[ClaimRef]:
    """The claims a pod uses. A template's generated claim is named in `status.resourceClaimStatuses`
    once the resourceclaim controller made it; until then only the template is known."""
    generated = {
        str(mapping(s).get("name")): mapping(s).get("resourceClaimName")
        for s in sequence(mapping(pod.get("status")).get("resourceClaimStatuses"))
    }
    refs: list[ClaimRef] = []
    for ref in sequence(mapping(pod.get("spec")).get("resourceClaims")):
        ref = mapping(ref)
        claim = ref.get("resourceClaimName") or generated.get(str(ref.get("name")))
        template = ref.get("resourceClaimTemplateName")
        if claim or template:
            refs.append(ClaimRef(str(claim) if claim else None, str(template) if template else None))
    return refs
