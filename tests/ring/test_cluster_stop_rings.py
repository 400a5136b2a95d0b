"""A `LocalCluster` that failed to start leaves another process's rings of the same cluster alone.

A second `railmq up` on a directory in use (its `.lock` file deleted, so the data directory's lock
was taken again) is refused by the actors' own directory locks; its `stop()` then unlinked every
shared-memory segment of the cluster's prefix, the running cluster's live rings among them. A
cluster that started and stops still takes every ring of its prefix with it, clients' too.
"""

from __future__ import annotations

from railmq.cluster import LocalCluster
from transport.ring import RingWriter
from transport.shm import list_segments


def test_a_cluster_that_never_started_unlinks_only_rings_nobody_holds(segments, tmp_path):
    live = segments.name("live")
    orphan = segments.name("orphan")
    writer = RingWriter.create(live, 4096)
    RingWriter.create(orphan, 4096).close()  # its creator gone: nobody holds it
    cluster = LocalCluster(nodes=1, data_dir=str(tmp_path / "data"))
    cluster.cluster_id = segments.cluster_id  # the same cluster, never started here
    try:
        cluster.stop()
        assert list_segments(segments.prefix) == [live], "the running cluster's ring is left, the orphan is gone"
    finally:
        writer.close()
