"""The contract between Tessera's parts and the Kubernetes helpers they share.

A leaf package: it imports nothing of the project, and the extender, the DRA driver, the
simulator and the benchmarks all take these names and parsers from here, so the two services
(which never import each other) cannot drift apart on a driver name, a capacity name or the
meaning of a quantity.
"""
