"""Development tooling, not shipped in the product image: the local control plane (real etcd,
kube-apiserver, kube-controller-manager and kube-scheduler as processes), its PKI, and the node
agent that plays the kubelet for the DRA driver. Tests, benchmarks and `tessera up` use it; the
extender and the driver never import it (enforced by the import contracts in pyproject.toml)."""
