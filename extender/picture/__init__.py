"""The extender's live picture of the cluster, in parts with one job each (see cluster.py)."""
