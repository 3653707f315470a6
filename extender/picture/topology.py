"""The topology domains of the picture's nodes, per level, kept exact as nodes and their labels
change (`extender.policy.topology` says what levels, domains and asks are).

One `DomainMap` per level (node name -> its domain's path), updated from the store's Node watch:
a node added, relabelled or removed changes its entry in each level's map (a relist too: the
store announces it node by node).
The gang planners read them at admission (`extender.verbs.admit_gang`) and the filter reads the
required level's map to keep a reserved gang's members inside its domain.

They are not the inventory's `PictureConfig.domains`: that map is part of every node's kind, and a
rack map there would split the few kinds of a large cluster into one per rack, so the filter's
per-kind memos would stop merging nodes. The domain rule is a step after the per-kind verdicts,
node by node, and only for members of a gang with a required level.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import count
from typing import Any

from contract.kube import mapping, meta
from extender.picture.store import ObjectStore, Stored
from extender.policy.placement import DomainMap
from extender.policy.topology import Level, Topology, TopologyAsk, read_ask

# Every picture's topology versions, in the order they were taken.
_VERSIONS = count()


class TopologyDomains:
    def __init__(self, store: ObjectStore, topology: Topology) -> None:
        self.topology = topology
        self._maps: dict[str, dict[str, str]] = {level.name: {} for level in topology.levels}
        # Level -> domain -> its nodes: the filter splits a request's names by one (in C).
        self._nodes: dict[str, dict[str, set[str]]] = {level.name: {} for level in topology.levels}
        # Moves whenever a node's domain at some level changes (added, relabelled, removed): a
        # plan read off the maps at one version holds while it has not moved. Drawn from one
        # count for the process, so no two pictures' maps share a version (memos outside a
        # picture tell them apart).
        self.version = next(_VERSIONS)
        # (A relist announces every node gone and every node listed: no handler of its own.)
        store.subscribe("Node", self._node_changed)

    def domains(self, level: str) -> DomainMap:
        """Node -> its domain at the level named (empty for a level the cluster lacks)."""
        return self._maps.get(level, {})

    def nodes_in(self, level: str, domain: str) -> set[str]:
        return self._nodes.get(level, {}).get(domain, set())

    def ask(self, pod: Mapping[str, Any], podgroup: Mapping[str, Any] | None) -> TopologyAsk:
        return read_ask(self.topology, pod, podgroup)

    def _set(self, name: str, labels: Mapping[str, Any], level: Level) -> None:
        domain = self.topology.domain_of(labels, level)
        domains, nodes = self._maps[level.name], self._nodes[level.name]
        old = domains.pop(name, None)
        if old != domain:
            self.version = next(_VERSIONS)
        if old is not None:
            nodes[old].discard(name)
            if not nodes[old]:
                del nodes[old]
        if domain is not None:
            domains[name] = domain
            nodes.setdefault(domain, set()).add(name)

    def _node_changed(self, key: str, old: Stored | None, new: Stored | None) -> None:
        labels = mapping(meta(new).get("labels")) if new is not None else {}
        for level in self.topology.levels:
            self._set(key, labels, level)
