"""The connector's counters (``get_kv_connector_stats``) and the mapping from
kvtier's tiers to vLLM's cache-hit sources and KV-event media, by the kind
of storage each tier is (the node announces its tiers' kinds: a node
without a disk has its remote store at G3)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
from vllm.v1.metrics.cache_hit_source import CacheHitSource

#: vLLM's name for where a block was found, by the kind of the kvtier tier
#: it was in: host memory, local disk, a remote store, which vLLM has no
#: name for, and another node of the cluster (its peer-to-peer source).
KIND_SOURCES: dict[str, CacheHitSource] = {
    "memory": CacheHitSource.HOST,
    "disk": CacheHitSource.DISK,
    "remote": CacheHitSource.EXTERNAL_UNSPECIFIED,
    "peer": CacheHitSource.P2P,
}

#: vLLM's KV-event medium of each kind of tier (a peer holds its blocks in
#: its host memory or on its disk: the medium of the copy it serves from
#: is not known up front; CPU, where a fetch lands them).
KIND_MEDIUMS: dict[str, str] = {"memory": "CPU", "disk": "STORAGE", "remote": "STORAGE", "peer": "CPU"}


def hit_source(kind: str) -> CacheHitSource:
    """vLLM's cache-hit source of a block in a tier of this kind."""
    return KIND_SOURCES.get(kind, CacheHitSource.EXTERNAL_UNSPECIFIED)

_STAT_KEYS = (
    "loaded_blocks",
    "loaded_blocks_g2",
    "loaded_blocks_g3",
    "loaded_blocks_g4",
    "loaded_bytes",
    "load_seconds",
    "load_failed_blocks",
    "saved_blocks",
    "saved_bytes",
    "save_seconds",
)


@dataclass
class KvtierStats(KVConnectorStats):
    """Blocks and bytes loaded (in total and by the tier the scheduler found
    them in) and saved, and the seconds spent, summed over workers and
    intervals."""

    def __post_init__(self) -> None:
        for k in _STAT_KEYS:
            self.data.setdefault(k, 0)

    def reset(self) -> None:
        self.data = {k: 0 for k in _STAT_KEYS}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for k in _STAT_KEYS:
            self.data[k] = self.data.get(k, 0) + other.data.get(k, 0)
        return self

    def reduce(self) -> dict[str, int | float]:
        return {k: self.data.get(k, 0) for k in _STAT_KEYS}

    def is_empty(self) -> bool:
        return not any(self.data.get(k, 0) for k in _STAT_KEYS)


class WorkerStats:
    """The worker's counters since the last ``take``; saves count from the
    save thread, so every update holds a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._now = KvtierStats()

    def add(self, **counts: Any) -> None:
        with self._lock:
            for k, v in counts.items():
                self._now.data[k] += v

    def load_started(self, began: float) -> None:
        self.add(load_seconds=time.perf_counter() - began)

    def loaded(self, block_bytes: int, tiers: list[str]) -> None:
        """Blocks loaded from these tiers, counted by position (``G2``,
        ``G3``, ``G4``: what ``loaded_blocks_g2`` ... count)."""
        counts = {f"loaded_blocks_{t.lower()}": tiers.count(t) for t in set(tiers)}
        known = {k: n for k, n in counts.items() if k in _STAT_KEYS}
        self.add(loaded_blocks=len(tiers), loaded_bytes=len(tiers) * block_bytes, **known)

    def saved(self, began: float, nbytes: int, blocks: int) -> None:
        self.add(save_seconds=time.perf_counter() - began, saved_bytes=nbytes, saved_blocks=blocks)

    def take(self) -> KvtierStats | None:
        with self._lock:
            if self._now.is_empty():
                return None
            out, self._now = self._now, KvtierStats()
            return out


def hit_sources(
    tiers: list[str], kind_of: Callable[[str], str], block_size: int, num_external_tokens: int
) -> dict[CacheHitSource, int]:
    """``num_external_tokens`` split by the kind of tier of the blocks they
    come from (the last blocks of ``tiers``, which are the blocks loaded;
    ``kind_of`` says what each tier is)."""
    if num_external_tokens <= 0:
        return {}
    blocks = -(-num_external_tokens // block_size)
    out: dict[CacheHitSource, int] = {}
    left = num_external_tokens
    # The loaded blocks end the stored prefix; a partial first block (the
    # tokens vLLM already had) counts toward its own tier.
    for tier in reversed(tiers[len(tiers) - blocks :]):
        n = min(block_size, left)
        source = hit_source(kind_of(tier))
        out[source] = out.get(source, 0) + n
        left -= n
    if left > 0:
        out[CacheHitSource.EXTERNAL_UNSPECIFIED] = out.get(CacheHitSource.EXTERNAL_UNSPECIFIED, 0) + left
    return out
