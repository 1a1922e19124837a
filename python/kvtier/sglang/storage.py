"""``KvtierHiCacheStorage``: SGLang's HiCache storage tier (L3) in a kvtier
node.

SGLang loads it as its ``dynamic`` storage backend::

    --enable-hierarchical-cache --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
        "module_path": "kvtier.sglang", "class_name": "KvtierHiCacheStorage",
        "interface_v1": 1, "socket": "/var/lib/kvtier/node.sock"}'

With ``interface_v1`` SGLang calls the zero-copy ``batch_exists`` /
``batch_get_v1`` / ``batch_set_v1`` with host-pool slots: each page is
copied between the registered host pool and the node's arena in Rust, run
by run (:mod:`kvtier.sglang.layout`), checksummed in the same pass and
verified before it is served. Without it SGLang calls ``batch_get`` /
``batch_set`` with flat page tensors, which are copied whole. Both store
the same bytes under the same keys.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)

import kvtier
from kvtier.clients import Clients
from kvtier.sglang.config import KvtierStorageConfig, page_key, tenant_of
from kvtier.sglang.layout import PageLayout

logger = logging.getLogger(__name__)

#: Store outcomes after which the node holds the page: stored now, or stored
#: before (by this engine, another, or another TP rank of an MLA model). A
#: page another client is storing right now ("in_flight_elsewhere") is not
#: readable yet, so it is not acknowledged: SGLang backs it up again later,
#: and finds it stored then.
HELD = frozenset({"stored", "already_stored"})


@dataclass
class _Counters:
    """What this backend did since the last ``get_stats`` (SGLang's storage
    metrics) and since it started (:meth:`KvtierHiCacheStorage.counters`)."""

    prefetch_pages: list[int] = field(default_factory=list)
    backup_pages: list[int] = field(default_factory=list)
    prefetch_gbps: list[float] = field(default_factory=list)
    backup_gbps: list[float] = field(default_factory=list)
    totals: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            (
                "lookup_pages",
                "hit_pages",
                "loaded_pages",
                "load_failed_pages",
                "stored_pages",
                "dedup_pages",
                "store_failed_pages",
                "removed_pages",
            ),
            0,
        )
    )


class KvtierHiCacheStorage(HiCacheStorage):
    """SGLang ``HiCacheStorage`` over a kvtier node daemon.

    Every TP rank makes one; SGLang builds it with ``(storage_config,
    kwargs)`` and then registers its host KV pool. Keys are SGLang's page
    hashes (:func:`kvtier.sglang.config.page_key`); the namespace is the
    model, the pool's dtype, layout and shape, the page size, the pipeline
    stage, the TP rank and size (MHA; MLA pages are the same on every rank,
    so every rank uses rank 0 of 1 and a page is stored once) and the
    call's tenant. Thread-safe: SGLang's prefetch and backup threads call it
    at once.
    """

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: dict[str, Any] | None = None) -> None:
        """``kwargs``: what SGLang's factory passes a dynamic backend besides
        its config (nothing, in 0.5.23); unused."""
        self.config = KvtierStorageConfig.from_extra(storage_config.extra_config)
        if storage_config.should_split_heads:
            raise ValueError(
                "kvtier does not split heads across heterogeneous TP (tp_lcm_size); "
                "drop tp_lcm_size from the extra config"
            )
        if storage_config.dcp_size > 1:
            raise ValueError("kvtier does not store decode-context-parallel shards (dcp_size > 1)")
        self.storage_config = storage_config
        mla = storage_config.is_mla_model
        self._tp = (0, 1) if mla else (storage_config.tp_rank, storage_config.tp_size)
        self._layout: PageLayout | None = None
        self._clients: Clients | None = None
        self._counters = _Counters()
        self._known: OrderedDict[tuple[str | None, int], None] = OrderedDict()
        self._lock = threading.Lock()

    # ------------------------------------------------------------- host pools

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Takes SGLang's host KV pool; ``ValueError`` for one whose pages
        this backend cannot copy (SGLang then fails the attach)."""
        layout = PageLayout.of(mem_pool_host)
        super().register_mem_pool_host(mem_pool_host)
        self._layout = layout
        self._clients = Clients(
            self.config.socket,
            self.config.reconnect_interval,
            self._connect,
            log=logger,
            uncached="HiCache storage answers every call as a miss",
        )
        logger.info(
            "kvtier HiCache storage: %s pages of %d tokens, %d layers of %d bytes per block (rank %d of %d); "
            "the node needs [geometry] %s",
            layout.layout,
            layout.page_size,
            layout.runs,
            layout.run_bytes,
            *self._tp,
            " ".join(f"{k}={v}" for k, v in layout.node_geometry().items()),
        )

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """SGLang registers every host pool of a model again by name; kvtier
        stores the KV pool only, so a model with other pools (Mamba or
        sliding-window state, speculative drafts, indexers) is refused."""
        if str(host_pool_name) != "kv" or host_pool is not getattr(self, "mem_pool_host", None):
            raise ValueError(
                f"kvtier stores the KV host pool only; this model also has pool {str(host_pool_name)!r}"
            )
        super().register_mem_host_pool_v2(host_pool, host_pool_name)

    def _connect(self, tenant: str | None) -> kvtier.Client:
        layout = self._require_layout()
        sc = self.storage_config
        ns = layout.namespace_layout((sc.pp_rank, sc.pp_size), (sc.attn_cp_rank, sc.attn_cp_size))
        return kvtier.Client(
            self.config.socket,
            model=self.config.model or sc.model_name or "unknown",
            dtype=str(layout.dtype).removeprefix("torch."),
            layers=layout.runs,
            layer_bytes=layout.run_bytes,
            block_size_tokens=layout.page_size,
            layout_version=zlib.crc32(ns.encode()),
            tp_rank=self._tp[0],
            tp_size=self._tp[1],
            tenant_salt=None if tenant is None else tenant.encode(),
            instance=self.config.instance,
            timeout=self.config.timeout,
        )

    def _require_layout(self) -> PageLayout:
        if self._layout is None:
            raise RuntimeError("kvtier storage used before SGLang registered its host pool")
        return self._layout

    def _require_clients(self) -> Clients:
        if self._clients is None:
            raise RuntimeError("kvtier storage used before SGLang registered its host pool")
        return self._clients

    # ---------------------------------------------------------------- lookups

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_exists(self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None) -> int:
        """How many leading pages of ``keys`` the node holds (they are loaded
        into the node's DRAM tier if they were on disk or remote)."""
        if not keys:
            return 0
        ints = [page_key(k) for k in keys]
        none: list[str] = []
        tiers = self._require_clients().call(self._tenant(extra_info), "lookup", lambda c: c.lookup(ints), none)
        self._add(lookup_pages=len(keys), hit_pages=len(tiers))
        return len(tiers)

    # ------------------------------------------------------ zero-copy (v1) I/O

    def batch_get_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        """Reads the pages into the host pool at ``host_indices``; one
        verified hit per page (a page the node no longer holds, or one that
        fails its checksum, is ``False``)."""
        if not keys:
            return []
        layout = self._require_layout()
        ids = layout.block_ids(host_indices, len(keys))
        ints = [page_key(k) for k in keys]
        tenant = self._tenant(extra_info)
        began = time.perf_counter()
        ok, pinned = self._require_clients().call(
            tenant, "load", lambda c: self._read_runs(c, ints, ids), ([False] * len(keys), 0)
        )
        self._loaded(tenant, ints, ok, pinned, began)
        return ok

    def _read_runs(self, c: kvtier.Client, keys: list[int], ids: list[int]) -> tuple[list[bool], int]:
        """Verified hits of ``keys`` read run by run into the pool's pages
        ``ids``, and how many leading pages the node pinned."""
        layout = self._require_layout()
        load = c.load(keys)
        try:
            pinned = load.prefix_len
            ok = [True] * pinned
            for run, region in enumerate(layout.regions()):
                load.wait_layer(run)
                got = load.read_layer(run, region, ids[:pinned], layout.stride)
                ok = [a and b for a, b in zip(ok, got, strict=True)]
        finally:
            load.release()
        return ok + [False] * (len(keys) - pinned), pinned

    def batch_set_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        """Stores the pages at ``host_indices`` of the host pool; ``True``
        for each page the node holds afterwards."""
        if not keys:
            return []
        layout = self._require_layout()
        ids = layout.block_ids(host_indices, len(keys))
        ints = [page_key(k) for k in keys]
        regions = layout.regions()
        began = time.perf_counter()
        none: list[str] = []
        outcomes = self._require_clients().call(
            self._tenant(extra_info),
            "store",
            lambda c: c.store_layers(ints, regions, ids, layout.stride),
            none,
        )
        return self._stored(self._tenant(extra_info), ints, outcomes, began)

    # ------------------------------------------------- flat-page (legacy) I/O

    def get(
        self,
        key: str,
        target_location: Any | None = None,
        target_sizes: Any | None = None,
    ) -> torch.Tensor | None:
        got = self.batch_get([key], None if target_location is None else [target_location])
        return got[0] if isinstance(got, list) else None

    def batch_get(
        self,
        keys: list[str],
        target_locations: Any | None = None,
        target_sizes: Any | None = None,
    ) -> list[torch.Tensor | None] | int:
        """Reads each page whole into a flat page tensor (``target_locations``,
        else new ones like the pool's ``get_dummy_flat_data_page()``); the
        tensor, or ``None`` for a miss."""
        if not keys:
            return []
        layout = self._require_layout()
        targets: list[torch.Tensor] = (
            list(target_locations)
            if target_locations is not None
            else [self.mem_pool_host.get_dummy_flat_data_page() for _ in keys]
        )
        if len(targets) != len(keys):
            raise ValueError(f"{len(keys)} keys and {len(targets)} target pages")
        bufs = [_bytes_of(t, layout.block_bytes) for t in targets]
        ints = [page_key(k) for k in keys]
        began = time.perf_counter()
        ok, pinned = self._require_clients().call(
            None, "load", lambda c: self._read_blocks(c, ints, bufs), ([False] * len(keys), 0)
        )
        self._loaded(None, ints, ok, pinned, began)
        return [t if hit else None for t, hit in zip(targets, ok, strict=True)]

    def _read_blocks(self, c: kvtier.Client, keys: list[int], bufs: Sequence[Any]) -> tuple[list[bool], int]:
        """Verified hits of ``keys`` read whole into ``bufs``, and how many
        leading pages the node pinned."""
        load = c.load(keys)
        try:
            pinned = load.prefix_len
            if pinned:
                # read_block needs every run of the pinned pages resident.
                for run in range(self._require_layout().runs):
                    load.wait_layer(run)
            ok = [load.read_block(i, bufs[i]) for i in range(pinned)]
        finally:
            load.release()
        return ok + [False] * (len(keys) - pinned), pinned

    def set(
        self,
        key: str,
        value: Any | None = None,
        target_location: Any | None = None,
        target_sizes: Any | None = None,
    ) -> bool:
        return self.batch_set([key], None if value is None else [value])

    def batch_set(
        self,
        keys: list[str],
        values: Any | None = None,
        target_locations: Any | None = None,
        target_sizes: Any | None = None,
    ) -> bool:
        """Stores flat page tensors (``get_data_page(index, flat=True)``);
        whether the node holds every one afterwards."""
        if not keys:
            return True
        if values is None or len(values) != len(keys):
            raise ValueError("kvtier batch_set needs one flat page tensor per key")
        layout = self._require_layout()
        bufs = [_bytes_of(v, layout.block_bytes) for v in values]
        ints = [page_key(k) for k in keys]
        began = time.perf_counter()
        none: list[str] = []
        outcomes = self._require_clients().call(None, "store", lambda c: c.store_buffers(ints, bufs), none)
        return all(self._stored(None, ints, outcomes, began))

    # ------------------------------------------------------------ bookkeeping

    def _tenant(self, extra_info: HiCacheStorageExtraInfo | None) -> str | None:
        return tenant_of(extra_info, self.config.tenant_key)

    def _loaded(self, tenant: str | None, keys: list[int], ok: list[bool], pinned: int, began: float) -> None:
        hits = sum(ok)
        elapsed = max(time.perf_counter() - began, 1e-9)
        self._add(loaded_pages=hits)
        if self.storage_config.enable_storage_metrics:
            with self._lock:
                self._counters.prefetch_pages.append(hits)
                self._counters.prefetch_gbps.append(hits * self._require_layout().block_bytes / elapsed / 1e9)
        self._remember(tenant, [k for k, hit in zip(keys, ok, strict=True) if hit])
        # A page the node pinned but that failed its checksum (or the copy)
        # is a miss for every reader: remove it, so the next store of its
        # key writes good bytes.
        bad = [k for k, hit in zip(keys[:pinned], ok, strict=False) if not hit]
        if bad:
            logger.warning("kvtier: %d pages failed verification; SGLang recomputes them", len(bad))
            self._add(load_failed_pages=len(bad), removed_pages=len(bad))
            self._require_clients().call(tenant, "remove", lambda c: c.remove(bad), None)

    def _stored(self, tenant: str | None, keys: list[int], outcomes: list[str], began: float) -> list[bool]:
        ok = [o in HELD for o in outcomes] + [False] * (len(keys) - len(outcomes))
        fresh = sum(o == "stored" for o in outcomes)
        elapsed = max(time.perf_counter() - began, 1e-9)
        self._add(stored_pages=fresh, dedup_pages=sum(ok) - fresh, store_failed_pages=len(keys) - sum(ok))
        # Kept only for SGLang's collector, which drains them (get_stats).
        if self.storage_config.enable_storage_metrics:
            with self._lock:
                self._counters.backup_pages.append(sum(ok))
                self._counters.backup_gbps.append(fresh * self._require_layout().block_bytes / elapsed / 1e9)
        self._remember(tenant, [k for k, good in zip(keys, ok, strict=True) if good])
        return ok

    def _remember(self, tenant: str | None, keys: list[int]) -> None:
        """Keys ``clear()`` removes: the most recent ``clear_keys``."""
        cap = self.config.clear_keys
        with self._lock:
            for k in keys:
                self._known[(tenant, k)] = None
                self._known.move_to_end((tenant, k))
            while len(self._known) > cap:
                self._known.popitem(last=False)

    def _add(self, **counts: int) -> None:
        with self._lock:
            for k, v in counts.items():
                self._counters.totals[k] += v

    # ---------------------------------------------------------- housekeeping

    def clear(self) -> None:
        """Removes from the node the pages this engine stored or loaded (the
        most recent ``clear_keys``, in every tenant). Pages other engines
        stored stay: the node is shared, and its keys are content hashes."""
        with self._lock:
            known = list(self._known)
            self._known.clear()
        by_tenant: dict[str | None, list[int]] = {}
        for tenant, k in known:
            by_tenant.setdefault(tenant, []).append(k)
        clients = self._require_clients()
        for tenant, keys in by_tenant.items():
            # Batches below the daemon's default manager.max_batch (4096).
            for i in range(0, len(keys), 1024):
                clients.call(tenant, "remove", _remover(keys[i : i + 1024]), None)
        self._add(removed_pages=len(known))
        logger.info("kvtier: cleared %d pages this engine stored or loaded", len(known))

    def counters(self) -> dict[str, int]:
        """Pages looked up, hit, loaded, failed, stored, deduplicated and
        removed since the start."""
        with self._lock:
            return dict(self._counters.totals)

    def get_stats(self) -> Any:
        """SGLang's ``StorageMetrics`` since the last call (pages and GB/s
        of each prefetch and backup), when SGLang collects storage metrics;
        else ``None``."""
        if not self.storage_config.enable_storage_metrics:
            return None
        from sglang.srt.observability.metrics_collector import StorageMetrics

        m = StorageMetrics()
        with self._lock:
            c = self._counters
            m.prefetch_pgs.extend(c.prefetch_pages)
            m.backup_pgs.extend(c.backup_pages)
            m.prefetch_bandwidth.extend(c.prefetch_gbps)
            m.backup_bandwidth.extend(c.backup_gbps)
            c.prefetch_pages, c.backup_pages, c.prefetch_gbps, c.backup_gbps = [], [], [], []
        return m

    def close(self) -> None:
        """SGLang's detach: nothing to flush (every store is committed when
        its call returns); connections close with the object."""


def _remover(keys: list[int]) -> Callable[[kvtier.Client], None]:
    return lambda c: c.remove(keys)


def _bytes_of(t: Any, nbytes: int) -> Any:
    """A uint8 NumPy view of a flat page tensor's memory (no copy)."""
    if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError("kvtier copies contiguous host tensors only")
    if t.numel() * t.element_size() != nbytes:
        raise ValueError(f"a flat page of {t.numel() * t.element_size()} bytes; pages here are {nbytes}")
    return t.reshape(-1).view(torch.uint8).numpy()
