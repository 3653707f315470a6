"""The picture's store (`extender.picture.store`): a newer resourceVersion is never overwritten,
a relist drops what is gone, readiness waits for every kind.
"""

from __future__ import annotations

from extender.picture.cluster import ClusterPicture
from tests import extender_objects as objects
from tests.unit.extender.pictures import CLASS, synced_picture, two_nodes, with_rv


def test_an_older_version_never_overwrites_a_newer_one() -> None:
    picture = synced_picture(two_nodes())
    spec = objects.claim_spec(CLASS)
    picture.apply(
        "ResourceClaim", "ADDED", with_rv(objects.claim("ns", "c", spec, [("b", "gpu-2", None)]), 7)
    )
    picture.apply("ResourceClaim", "MODIFIED", with_rv(objects.claim("ns", "c", spec), 5))
    assert picture.node_gpus("b").free_milli == (1000, 1000, 0, 1000)


def test_relist_drops_what_is_gone_and_readiness_needs_every_kind() -> None:
    picture = ClusterPicture()
    picture.replace("ResourceSlice", [objects.gpu_slice("a", 2)])
    assert not picture.ready()
    assert picture.node_gpus("a").free_milli == (1000, 1000)
    picture.replace("ResourceSlice", [])
    assert picture.node_gpus("a").free_milli == ()
