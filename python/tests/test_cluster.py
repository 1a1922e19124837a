"""Two real daemons of one cluster (``kvtier.testing.start_cluster``: one
``redis-server``, one secret): a block stored through node A is found by
node B's lookup as B's peer tier, and B's load brings it from A, verified,
into B's own arena. A missing ``redis-server`` fails the test."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TINY_ENV, TinyDaemon, block, check_blocks

from kvtier.testing import Cluster, DaemonError, start_cluster, wait_until


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    try:
        c = start_cluster(tmp_path / "cluster")
    except DaemonError as e:
        pytest.fail(str(e))
    yield c
    c.stop()


def test_a_block_stored_on_node_a_is_loaded_through_node_b(tmp_path: Path, cluster: Cluster) -> None:
    assert stat.S_IMODE(cluster.secret.stat().st_mode) == 0o600
    assert cluster.secret.stat().st_size == 32
    a = TinyDaemon(cluster.start_member(tmp_path / "a", "node-a", TINY_ENV))
    b = TinyDaemon(cluster.start_member(tmp_path / "b", "node-b", TINY_ENV))
    for d in (a, b):
        assert d.daemon.logged("peer") not in (None, "off"), d.daemon.log

    keys = [11, 12, 13]
    assert a.client().store_buffers(keys, [block(k) for k in keys]) == ["stored"] * 3
    on_b = b.client()
    peer, kind = on_b.tiers[-1]
    assert kind == "peer", on_b.tiers
    # A publishes its blocks in the background (about a second).
    wait_until("node B to find node A's blocks", lambda: on_b.lookup(keys) == [peer] * 3 or None)
    assert b.daemon.metrics()["kvtier_node_cluster_hits_total"] >= 3

    load = on_b.load(keys)
    check_blocks(load, keys)
    load.release()
    # B holds its own copy now, brought from A.
    assert on_b.lookup(keys) == ["G2"] * 3
    stats = on_b.stats()
    assert (stats["peer_hits"], stats["peer_misses"]) == (3, 0), stats
    # Another tenant's client of B finds none of them, on any node.
    assert b.client(tenant_salt=b"another tenant").lookup(keys) == []
