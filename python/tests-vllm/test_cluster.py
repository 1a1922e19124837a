"""Two nodes of one cluster (docs/cluster.md): an engine on node B is
served the prompts an engine on node A computed, from node A, and
generates what engine A generated.

Daemons A and B share one ``redis-server`` index and one cluster secret
(``kvtier.testing.start_cluster``); a missing ``redis-server`` fails the
test. The engines run one after the other in this process, each built
once.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from conftest import BLOCK_TOKENS, daemon_env
from engines import (
    PROMPTS,
    cached_by_source,
    connected,
    distinct_blocks,
    node_stats,
    run_all,
    shut_down_engines,
    usable_tokens,
)
from kvtier.testing import Daemon, DaemonError, start_cluster, wait_until

#: The share of engine B's full prompt blocks that must come from node A.
FROM_PEER = 0.9


def test_prompts_computed_on_node_a_are_loaded_from_it_by_node_b(tmp_path: Path, model_dir: Path) -> None:
    try:
        cluster = start_cluster(tmp_path / "cluster")
    except DaemonError as e:
        pytest.fail(str(e))
    try:
        a = cluster.start_member(tmp_path / "a", "node-a", daemon_env())
        b = cluster.start_member(tmp_path / "b", "node-b", daemon_env())
        computed = _engine_a(model_dir, a)
        blocks = distinct_blocks(PROMPTS)
        # A lists the blocks with the cluster's index in the background;
        # engine B asks only once they are listed.
        published = "kvtier_node_meta_published_total"
        wait_until(f"node A to publish {blocks} blocks", lambda: a.metrics().get(published, 0) >= blocks or None)

        llm = connected(model_dir, b.socket)
        before = cached_by_source(llm)
        served, cached = run_all(llm, PROMPTS)
        gained = {s: n - before.get(s, 0) for s, n in cached_by_source(llm).items()}
        assert served == computed

        # vLLM planned to take every full prompt block but the last token's
        # from a cache (it counts them so even when a load fails and they
        # are recomputed).
        assert cached == [usable_tokens(p) for p in PROMPTS]
        # vLLM's cache-hit sources (the connector's answer, by the kind of
        # tier B found each block in): each distinct block from a peer
        # once; the prefixes the batch's prompts share from the blocks
        # those loads filled (vLLM's own cache, "device"). They count what
        # the scheduler planned, not what arrived (a failed load is
        # recomputed): B's counters below say what did.
        assert gained.get("p2p", 0) >= FROM_PEER * blocks * BLOCK_TOKENS, (gained, cached)
        assert gained.get("p2p", 0) + gained.get("device", 0) == sum(cached), gained
        # B brought the blocks from A, verified, and its Loads served them
        # all (a block is brought once, then held in B's G2).
        stats = node_stats(b)
        assert stats["peer_hits"] >= FROM_PEER * blocks and stats["peer_misses"] == 0, stats
        assert stats["loaded"] >= stats["peer_hits"] and stats["load_misses"] == 0, stats
        # And A sent them.
        assert a.metrics()["kvtier_peer_blocks_sent_total"] >= stats["peer_hits"]
    finally:
        cluster.stop()


def _engine_a(model_dir: Path, a: Daemon) -> list[list[int]]:
    """The outputs of an engine on node A that computes every prompt (and
    stores its blocks through A); the engine is shut down before engine B
    is built (two in-process engines must not be alive at once)."""
    llm = connected(model_dir, a.socket)
    computed, _ = run_all(llm, PROMPTS)
    del llm
    gc.collect()
    shut_down_engines()
    assert node_stats(a)["committed"] == distinct_blocks(PROMPTS)
    return computed
