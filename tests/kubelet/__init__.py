"""A kubelet's side of DRA for tests: built from the kubelet's own ``.proto`` files only."""
