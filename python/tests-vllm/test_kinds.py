"""The connector shows a kvtier tier to vLLM by the kind of storage the
node says it is (``kvtier.Client.tiers``), not by its position: the
default layout (G2 memory, G3 disk, G4 remote) keeps its sources and media,
and a node whose remote store is G3 (no disk) has it shown as remote."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

from vllm.v1.kv_offload.base import Locality, Medium, OffloadKey
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvtier.vllm.events import EventTracker, KvtierWorkerMetadata
from kvtier.vllm.layouts import distance
from kvtier.vllm.offload_events import TierEvents
from kvtier.vllm.stats import hit_sources

DEFAULT = {"G2": "memory", "G3": "disk", "G4": "remote"}
NO_DISK = {"G2": "memory", "G3": "remote"}
BLOCK = 16


def kind_of(kinds: dict[str, str]) -> Callable[[str], str]:
    """``Clients.kind_of`` of a node with these tiers."""
    return lambda tier: kinds.get(tier, "unknown")


def test_hit_sources_follow_the_kind() -> None:
    tiers = ["G2", "G3", "G4"]
    assert hit_sources(tiers, kind_of(DEFAULT), BLOCK, 3 * BLOCK) == {
        CacheHitSource.HOST: BLOCK,
        CacheHitSource.DISK: BLOCK,
        CacheHitSource.EXTERNAL_UNSPECIFIED: BLOCK,
    }
    assert hit_sources(["G2", "G3"], kind_of(NO_DISK), BLOCK, 2 * BLOCK) == {
        CacheHitSource.HOST: BLOCK,
        CacheHitSource.EXTERNAL_UNSPECIFIED: BLOCK,
    }


def test_a_peer_tier_is_vllms_p2p_source() -> None:
    # A node with a cluster lists the peer tier after its own tiers.
    kinds = {**DEFAULT, "G5": "peer"}
    assert hit_sources(["G2", "G5", "G5"], kind_of(kinds), BLOCK, 3 * BLOCK) == {
        CacheHitSource.HOST: BLOCK,
        CacheHitSource.P2P: 2 * BLOCK,
    }
    events = TierEvents(True)
    key = OffloadKey(b"k")
    events.saw(key, "peer", stored=True)
    got = [(e.medium, e.locality, e.removed) for e in events.take()]
    assert got == [(Medium.CPU, Locality.REMOTE, False)]


def test_offloading_events_move_by_medium() -> None:
    events = TierEvents(True)
    key = OffloadKey(b"k")
    events.saw(key, "memory", stored=True)
    # Disk and remote are both STORAGE, told apart by locality.
    events.saw(key, "disk")
    events.saw(key, "remote")
    events.saw(key, "remote")
    events.saw(key, None)
    got = [(e.medium, e.locality, e.removed) for e in events.take()]
    assert got == [
        (Medium.CPU, Locality.LOCAL, False),
        (Medium.CPU, Locality.LOCAL, True),
        (Medium.STORAGE, Locality.LOCAL, False),
        (Medium.STORAGE, Locality.LOCAL, True),
        (Medium.STORAGE, Locality.REMOTE, False),
        (Medium.STORAGE, Locality.REMOTE, True),
    ]


def test_kv_events_use_the_kind_of_the_tier_found() -> None:
    for kinds in (DEFAULT, NO_DISK):
        tracker = EventTracker(BLOCK, kind_of(kinds))
        # A request of one block whose save this engine finished: stored
        # in host memory.
        request = SimpleNamespace(block_hashes=[bytes(32)], all_token_ids=list(range(BLOCK)), lora_request=None)
        tracker.saving(request, 0, [7])  # type: ignore[arg-type]
        tracker.worker_said(KvtierWorkerMetadata(stored=[7]))
        assert [(type(e).__name__, e.medium) for e in tracker.take()] == [("BlockStored", "CPU")]
        tracker.looked_up([7], ["G2"])
        assert tracker.take() == []
        # Found in G3: on disk by default, in the remote store without a
        # disk; vLLM's medium is STORAGE either way.
        tracker.looked_up([7], ["G3"])
        got = [(type(e).__name__, e.medium) for e in tracker.take()]
        assert got == [("BlockRemoved", "CPU"), ("BlockStored", "STORAGE")], kinds


def test_distance_is_the_position() -> None:
    assert sorted(["G4", "G2", "G3"], key=distance) == ["G2", "G3", "G4"]
    assert distance("G8") > distance("G4")
