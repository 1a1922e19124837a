"""kvtier as the offload target of vLLM's own ``OffloadingConnector``.

:class:`KvtierOffloadingSpec` is an ``OffloadingSpec`` loaded by name::

    KVTransferConfig(
        kv_connector="OffloadingConnector",
        kv_role="kv_both",
        kv_connector_extra_config={
            "spec_name": "KvtierOffloadingSpec",
            "spec_module_path": "kvtier.vllm.offloading",
            "socket": "/path/to/node.sock",
        },
    )

Its scheduler side (:class:`KvtierOffloadingManager`) answers vLLM's
per-block lookups from the node daemon and pins each hit in the daemon's
arena until the worker has read it, so the daemon cannot evict it in
between. Its worker side (:class:`KvtierOffloadingWorker`) copies blocks
between vLLM's KV cache in host memory (vLLM's CPU platform) and the
daemon, layer by layer, on a background thread; every block read is
verified, and a block that fails is removed from the node.

vLLM's ``OffloadingConnector`` has no way to recompute a block whose load
failed (its worker asserts that every transfer succeeded), so under it the
scheduler side also reads every hit back and verifies it before promising
it to vLLM: a corrupt block is removed and is a miss. A load that still
fails on the worker stops the engine rather than serve unverified bytes.
:class:`KvtierOffloadingConnector`, a subclass of ``OffloadingConnector``,
adds the missing path: the worker's failed blocks go to vLLM as load
errors (``get_block_ids_with_load_errors``) and vLLM recomputes them
(with ``kv_load_failure_policy="recompute"``), so the lookup need not read
the blocks twice.

Keys are vLLM's block hashes (the first 16 bytes), in a namespace of the
model, dtype, vLLM version and platform, KV layout, block size and TP rank
(:func:`kvtier.vllm.config.namespace_of`); it is not the namespace of
``KvtierConnector``, whose KV layout may differ. If the daemon is down,
the engine runs as if nothing were cached (one warning) and connects again
when it answers.

See docs/vllm-offloading.md in the repository.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import vllm
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorWorkerMetadata
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingWorkerMetadata
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector
from vllm.platforms import current_platform
from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    LookupResult,
    OffloadingEvent,
    OffloadingManager,
    OffloadingSpec,
    OffloadingWorker,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
    TransferResult,
    get_offload_block_hash,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

import kvtier
from kvtier.vllm.clients import Clients
from kvtier.vllm.config import KvtierConfig, Shape, block_key
from kvtier.vllm.offload_events import KIND_MEDIUMS, TierEvents
from kvtier.vllm.logs import init_logger
from kvtier.vllm.stats import hit_source

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.kv_offload.config import OffloadingConfig
    from vllm.v1.outputs import KVConnectorOutput

logger = init_logger(__name__)  # in vLLM's logger tree (kvtier.vllm.logs)

__all__ = [
    "KvtierLoadStoreSpec",
    "KvtierOffloadingConnector",
    "KvtierOffloadingManager",
    "KvtierOffloadingSpec",
    "KvtierOffloadingWorker",
    "KvtierOffloadingWorkerMetadata",
    "KIND_MEDIUMS",
]

#: ``kv_connector_extra_config`` keys of kvtier (:class:`KvtierConfig`).
KVTIER_KEYS = ("socket", "instance", "timeout", "reconnect_interval")

#: Keys vLLM's ``OffloadingConnector`` reads for any spec.
_VLLM_KEYS = {
    "spec_name",
    "spec_module_path",
    "block_size",
    "blocks_per_chunk",
    "offload_prompt_only",
    "self_describing_kv_events",
    "canonical_layout",
}

#: Blocks a worker failed to load that the manager remembers.
FAILED_LIMIT = 1 << 16


class KvtierLoadStoreSpec(LoadStoreSpec):
    """The kvtier keys of the blocks of one load or store, in the order of
    vLLM's block IDs of the same transfer."""

    def __init__(self, keys: Sequence[int]) -> None:
        self.keys: list[int] = list(keys)

    def __repr__(self) -> str:
        return f"KvtierLoadStoreSpec({len(self.keys)} blocks)"


def _key(offload_key: OffloadKey) -> int:
    """The kvtier key of vLLM's offload key (its block hash)."""
    return block_key(get_offload_block_hash(offload_key))


def _shape(config: OffloadingConfig) -> Shape:
    """The namespace and block geometry, from what both the scheduler and
    the workers are told (so both compute the same)."""
    group = config.groups[0]
    layers = max(len(group.layer_names), 1)
    platform = type(current_platform).__name__
    return Shape(
        model=config.model.name,
        dtype=config.model.dtype,
        layout=f"vllm {vllm.__version__} {platform} OffloadingConnector "
        f"layout={config.kv_cache_layout} block_bytes={config.worker_kv_bytes_per_block}",
        block_size=group.tokens_per_block,
        layers=layers,
        layer_bytes=config.worker_kv_bytes_per_block // layers,
    )


def _unsupported(config: OffloadingConfig) -> str | None:
    """Why this engine's KV cache cannot be offloaded to kvtier, if so."""
    p = config.parallel
    if current_platform.device_type != "cpu":
        return f"a KV cache on {current_platform.device_type} (kvtier copies host memory)"
    if len(config.groups) != 1:
        return f"{len(config.groups)} KV cache groups (kvtier holds one)"
    if p.pp_size != 1 or p.pcp_size != 1 or p.dcp_size != 1:
        return "pipeline or context parallelism"
    layers = len(config.groups[0].layer_names)
    if layers == 0 or config.worker_kv_bytes_per_block <= 0 or config.worker_kv_bytes_per_block % layers:
        return f"{config.worker_kv_bytes_per_block} KV bytes per block over {layers} layers"
    return None


class KvtierOffloadingSpec(OffloadingSpec):
    """An ``OffloadingSpec`` whose offloaded medium is a kvtier node.

    Reads ``socket``, ``instance``, ``timeout`` and ``reconnect_interval``
    from ``kv_connector_extra_config`` (see :class:`KvtierConfig`). An
    offload chunk must be one vLLM block (``block_size``, if given, equal
    to vLLM's block size), and vLLM's canonical layout is not supported.
    A model this version cannot offload (more than one KV cache group,
    pipeline or context parallelism) runs without it, with a warning.
    """

    def __init__(self, config: OffloadingConfig) -> None:
        super().__init__(config)
        extra = dict(self.extra_config)
        self.kvtier_config = KvtierConfig.from_extra({k: extra[k] for k in KVTIER_KEYS if k in extra})
        ignored = sorted(set(extra) - set(KVTIER_KEYS) - _VLLM_KEYS)
        if ignored:
            logger.warning("kvtier offloading ignores kv_connector_extra_config keys %s", ignored)
        if self.blocks_per_chunk != 1:
            raise ValueError(
                f"kvtier offloads single vLLM blocks: drop 'block_size' / 'blocks_per_chunk' "
                f"from kv_connector_extra_config (got {self.blocks_per_chunk} blocks per chunk)"
            )
        if config.canonical_layout:
            raise ValueError("kvtier stores vLLM's KV pages as they are: 'canonical_layout' is not supported")
        self.shape = _shape(config)
        self.unsupported = _unsupported(config)
        if self.unsupported is not None:
            logger.warning("kvtier offloading: %s is not supported; running without it", self.unsupported)
        self.report_load_errors = False
        """Set by :class:`KvtierOffloadingConnector`: a failed load is
        reported as load errors, not as a failed transfer."""
        self._manager: KvtierOffloadingManager | None = None
        self._worker: KvtierOffloadingWorker | None = None

    def _clients(self, tp_rank: int, config: KvtierConfig | None = None) -> Clients | None:
        if self.unsupported is not None:
            return None
        return Clients(config or self.kvtier_config, self.shape, tp_rank, self.config.parallel.tp_size)

    def get_manager(self) -> OffloadingManager:
        """The scheduler side; it looks up TP rank 0's blocks."""
        if self._manager is None:
            self._manager = KvtierOffloadingManager(
                self._clients(0),
                self.shape,
                enable_events=self.kv_events_config.enable_kv_cache_events,
            )
            logger.info(
                "kvtier offloading (scheduler) on %s: %s, %d layers of %d bytes per block of %d tokens",
                self.kvtier_config.socket,
                self.shape.model,
                self.shape.layers,
                self.shape.layer_bytes,
                self.shape.block_size,
            )
        return self._manager

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        """The worker side of this rank, over vLLM's KV cache tensors."""
        if self._worker is None:
            rank = self.config.parallel.rank
            self._worker = KvtierOffloadingWorker(
                self._clients(rank),
                self.shape,
                kv_caches,
                report_load_errors=self.report_load_errors,
                # The scheduler found the blocks of a load in the node a
                # moment ago: a load tries the daemon even while stores
                # wait out the reconnect interval.
                load_clients=self._clients(rank, replace(self.kvtier_config, reconnect_interval=0.0)),
            )
        return self._worker


@dataclass
class _Pin:
    """A block the scheduler found, pinned in the daemon's arena."""

    load: kvtier.Load
    tier: str


_CORRUPT = "corrupt"
_DOWN = "down"


class KvtierOffloadingManager(OffloadingManager):
    """The scheduler side: which blocks the node holds, and the pins that
    keep them there until the worker has read them.

    ``lookup`` asks the daemon for one block and pins it (bringing it into
    host memory from a lower tier); with ``verify_on_lookup`` it also reads
    the block back and verifies it, removing it if it fails. Pins of a
    request's hits are held until ``complete_load``; those not loaded are
    released at the end of the scheduler step. Blocks being stored are
    ``HIT_PENDING`` until their store completes. ``clients`` is ``None``
    when this engine runs without kvtier (every lookup misses).
    """

    def __init__(self, clients: Clients | None, shape: Shape, *, enable_events: bool = False) -> None:
        self._clients = clients
        self._shape = shape
        self.verify_on_lookup = True
        """Read every hit back before promising it: vLLM's
        ``OffloadingConnector`` cannot recompute a failed load."""
        self._scratch: bytearray | None = None
        self._looked: dict[str, dict[OffloadKey, _Pin]] = {}
        self._loading: dict[str, dict[OffloadKey, _Pin]] = {}
        self._storing: dict[OffloadKey, int] = {}
        self._replace: set[str] = set()
        self._failed: OrderedDict[int, bool] = OrderedDict()
        self._events = TierEvents(enable_events)

    # ------------------------------------------------------------- lookups

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if self._clients is None:
            return LookupResult.MISS
        if key in self._storing:
            return LookupResult.HIT_PENDING
        pins = self._looked.setdefault(req_context.req_id, {})
        if key in pins:
            return LookupResult.HIT
        k = _key(key)
        if k in self._failed:
            # A worker failed to load it: a miss until this engine stores
            # it again. A corrupt one may have been pinned when the worker
            # removed it: removing is retried.
            if self._failed[k]:
                self._clients.call(None, "remove", _remover([k]), None)
            return LookupResult.MISS
        down: _Pin | str | None = _DOWN
        found = self._clients.call(None, "lookup", lambda c: self._pin(c, k), down)
        if found is _DOWN:
            # Nothing is known while the daemon is away.
            return LookupResult.MISS
        if found is None:
            self._saw(key, None)
            return LookupResult.MISS
        if found is _CORRUPT:
            logger.warning("kvtier: a block failed verification; removed it, vLLM computes it")
            # The blocks after it were written with it: this request
            # replaces the ones it computes (prepare_store).
            self._replace.add(req_context.req_id)
            self._saw(key, None)
            return LookupResult.MISS
        assert isinstance(found, _Pin)
        pins[key] = found
        self._saw(key, found.tier)
        return LookupResult.HIT

    def _pin(self, c: kvtier.Client, k: int) -> _Pin | str | None:
        """Pins block ``k`` if the node holds it (verified, with
        ``verify_on_lookup``); ``_CORRUPT`` if it failed verification."""
        tiers = c.lookup([k])
        if not tiers:
            return None
        load = c.load([k])
        if load.prefix_len == 0:
            load.release()
            return None
        verified = True
        try:
            if self.verify_on_lookup:
                if self._scratch is None:
                    self._scratch = bytearray(self._shape.layers * self._shape.layer_bytes)
                load.wait_layer(self._shape.layers - 1)
                verified = load.read_block(0, self._scratch)
        except BaseException:
            load.release()
            raise
        if not verified:
            # Unpinned first: the daemon does not remove a pinned block.
            load.release()
            c.remove([k])
            return _CORRUPT
        return _Pin(load, tiers[0])

    def get_load_source(self, key: OffloadKey, req_context: ReqContext) -> CacheHitSource:
        for pins in (self._loading.get(req_context.req_id), self._looked.get(req_context.req_id)):
            if pins is not None and key in pins and self._clients is not None:
                return hit_source(self._clients.kind_of(pins[key].tier))
        return CacheHitSource.EXTERNAL_UNSPECIFIED

    # --------------------------------------------------------------- loads

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        looked = self._looked.get(req_context.req_id, {})
        loading = self._loading.setdefault(req_context.req_id, {})
        for key in keys:
            pin = looked.pop(key, None)
            if pin is not None:
                old = loading.pop(key, None)
                if old is not None:
                    _release(old)
                loading[key] = pin
        return KvtierLoadStoreSpec([_key(k) for k in keys])

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        loading = self._loading.get(req_context.req_id)
        if loading is None:
            return
        for key in keys:
            pin = loading.pop(key, None)
            if pin is not None:
                _release(pin)
        if not loading:
            del self._loading[req_context.req_id]

    # -------------------------------------------------------------- stores

    def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        to_store = [] if self._clients is None else [k for k in keys if k not in self._storing]
        for k in to_store:
            self._storing[k] = 1
        if to_store and self._clients is not None:
            # Blocks stored beside a corrupt one, or that a worker failed
            # to load, are replaced by what this request computed rather
            # than kept as "already stored".
            if req_context.req_id in self._replace:
                replace = [_key(k) for k in to_store]
            else:
                replace = [_key(k) for k in to_store if _key(k) in self._failed]
            if replace:
                self._clients.call(None, "remove", _remover(replace), None)
        return PrepareStoreOutput(
            keys_to_store=to_store,
            store_spec=KvtierLoadStoreSpec([_key(k) for k in to_store]),
            evicted_keys=[],
        )

    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        for key in keys:
            self._storing.pop(key, None)
            self._failed.pop(_key(key), None)
        if not self._events.enabled or self._clients is None:
            return
        # What the node holds now is what the store did (a full or gone
        # daemon stores nothing).
        for key in keys:
            none: list[str] = []
            tiers = self._clients.call(None, "lookup", _looker(_key(key)), none)
            if tiers:
                self._saw(key, tiers[0], stored=True)

    def load_failed(self, keys: Iterable[int], corrupt: Collection[int] = ()) -> None:
        """Blocks a worker could not load (gone, or failed verification:
        ``corrupt``): misses for this engine until it stores them again, so
        a request vLLM recomputes does not load them again."""
        for k in keys:
            self._failed[k] = k in corrupt or self._failed.get(k, False)
            self._failed.move_to_end(k)
        while len(self._failed) > FAILED_LIMIT:
            self._failed.popitem(last=False)

    # ---------------------------------------------------------- lifecycle

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        """Releases the pins of hits vLLM did not load this step."""
        for pins in self._looked.values():
            for pin in pins.values():
                _release(pin)
        self._looked.clear()

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._replace.discard(req_context.req_id)
        for pin in self._looked.pop(req_context.req_id, {}).values():
            _release(pin)

    def reset_cache(self) -> None:
        """Forgets this engine's pins and stores in flight. The node's
        blocks stay: other engines may share them."""
        self.shutdown()
        logger.info("kvtier offloading: cache reset; blocks in the node are kept")

    def shutdown(self) -> None:
        for table in (self._looked, self._loading):
            for pins in table.values():
                for pin in pins.values():
                    _release(pin)
            table.clear()
        self._storing.clear()
        self._replace.clear()

    # -------------------------------------------------------------- events

    def take_events(self) -> Iterable[OffloadingEvent]:
        return self._events.take()

    def _saw(self, key: OffloadKey, tier: str | None, stored: bool = False) -> None:
        """Tells the events where the node holds ``key`` (``tier`` None:
        nowhere), by the kind of that tier."""
        kind = None
        if tier is not None and self._clients is not None:
            kind = self._clients.kind_of(tier)
        self._events.saw(key, kind, stored)


def _looker(k: int) -> Callable[[kvtier.Client], list[str]]:
    def lookup(c: kvtier.Client) -> list[str]:
        return c.lookup([k])

    return lookup


def _remover(keys: list[int]) -> Callable[[kvtier.Client], None]:
    def remove(c: kvtier.Client) -> None:
        c.remove(keys)

    return remove


def _release(pin: _Pin) -> None:
    try:
        pin.load.release()
    except kvtier.KvtierError as e:
        logger.debug("kvtier release failed: %s", e)


@dataclass
class _Done:
    """A finished transfer, and the vLLM blocks a load did not fill."""

    result: TransferResult
    failed_blocks: set[int] = field(default_factory=set)
    failed_keys: list[int] = field(default_factory=list)
    corrupt_keys: list[int] = field(default_factory=list)


class KvtierOffloadingWorker(OffloadingWorker):
    """The worker side: copies blocks between vLLM's KV cache tensors (host
    memory) and the daemon on one background thread (the copies release
    the GIL), one layer at a time, straight from and into vLLM's paged
    per-layer buffers.

    A load pins the blocks and reads each layer, verified; blocks the node
    no longer holds or that fail verification are not served: corrupt ones
    are removed from the node, and the load fails (a failed
    ``TransferResult``), or, with ``report_load_errors``, succeeds with
    those blocks left for :meth:`take_load_errors`. A store that the node
    refuses or that meets no daemon is a future miss, not a failure.
    """

    def __init__(
        self,
        clients: Clients | None,
        shape: Shape,
        kv_caches: CanonicalKVCaches,
        *,
        report_load_errors: bool = False,
        load_clients: Clients | None = None,
    ) -> None:
        self._clients = clients
        self._load_clients = load_clients if load_clients is not None else clients
        self._shape = shape
        self._report_load_errors = report_load_errors
        self._layers: list[tuple[int, int]] = []
        self._stride = 0
        if clients is not None:
            self._map(kv_caches)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvtier-offload")
        self._jobs: dict[int, Future[_Done]] = {}
        self._load_errors: set[int] = set()
        self._failed_keys: list[int] = []
        self._corrupt_keys: list[int] = []
        self._lock = threading.Lock()

    def _map(self, kv_caches: CanonicalKVCaches) -> None:
        """Each layer's ``(address, bytes)`` and the block stride, or a
        warning and no layers (every transfer a miss)."""
        shape = self._shape
        if len(kv_caches.group_data_refs) != 1 or len(kv_caches.group_data_refs[0]) != shape.layers:
            logger.warning("kvtier offloading: KV cache layers are not %d layers; running without it", shape.layers)
            return
        layers: list[tuple[int, int]] = []
        strides = set()
        for ref in kv_caches.group_data_refs[0]:
            t = kv_caches.tensors[ref.tensor_idx].tensor
            if t.device.type != "cpu" or t.dim() != 2 or t.stride(1) != 1 or ref.page_size_bytes != shape.layer_bytes:
                logger.warning(
                    "kvtier offloading needs host KV pages of %d bytes; got %s %s of %d bytes on %s: running uncached",
                    shape.layer_bytes,
                    tuple(t.shape),
                    t.dtype,
                    ref.page_size_bytes,
                    t.device,
                )
                return
            stride = t.stride(0) * t.element_size()
            strides.add(stride)
            layers.append((t.data_ptr(), stride * (t.shape[0] - 1) + ref.page_size_bytes))
        if len(strides) != 1:
            logger.warning("kvtier offloading: KV layers with different block strides %s; running without it", strides)
            return
        self._layers = layers
        self._stride = strides.pop()

    # --------------------------------------------------- OffloadingWorker

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        assert isinstance(dst_spec, KvtierLoadStoreSpec)
        ids = [int(b) for b in src_spec.block_ids]
        self._submit(job_id, self._store, job_id, dst_spec.keys, ids)
        return True

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec) -> bool:
        assert isinstance(src_spec, KvtierLoadStoreSpec)
        ids = [int(b) for b in dst_spec.block_ids]
        self._submit(job_id, self._load, job_id, src_spec.keys, ids)
        return True

    def get_finished(self) -> list[TransferResult]:
        out: list[TransferResult] = []
        with self._lock:
            for job_id, f in list(self._jobs.items()):
                if f.done():
                    del self._jobs[job_id]
                    done = f.result()
                    out.append(done.result)
                    self._load_errors |= done.failed_blocks
                    self._failed_keys.extend(done.failed_keys)
                    self._corrupt_keys.extend(done.corrupt_keys)
        return out

    def wait(self, job_ids: set[int]) -> None:
        with self._lock:
            futures = [self._jobs[j] for j in job_ids if j in self._jobs]
        for f in futures:
            f.exception()

    def take_load_errors(self) -> set[int]:
        """vLLM blocks of the loads returned by :meth:`get_finished` so far
        that were not filled (with ``report_load_errors``)."""
        with self._lock:
            errors, self._load_errors = self._load_errors, set()
        return errors

    def take_failed_keys(self) -> tuple[list[int], list[int]]:
        """Keys of those blocks, and of those among them that failed
        verification, for the scheduler (with ``report_load_errors``)."""
        with self._lock:
            keys, self._failed_keys = self._failed_keys, []
            corrupt, self._corrupt_keys = self._corrupt_keys, []
        return keys, corrupt

    def shutdown(self) -> None:
        """Waits for the transfers in flight."""
        self._pool.shutdown(wait=True)

    # ----------------------------------------------------------- transfers

    def _submit(self, job_id: int, f: Any, *args: Any) -> None:
        future = self._pool.submit(_guarded, job_id, f, *args)
        with self._lock:
            self._jobs[job_id] = future

    def _store(self, job_id: int, keys: list[int], block_ids: list[int]) -> _Done:
        began = time.perf_counter()
        if self._clients is None or not self._layers or not keys:
            return _Done(TransferResult(job_id, True))
        if len(keys) != len(block_ids):
            logger.warning("kvtier offloading: store of %d keys into %d blocks skipped", len(keys), len(block_ids))
            return _Done(TransferResult(job_id, True))
        layers, stride = self._layers, self._stride
        none: list[str] = []
        outcomes = self._clients.call(None, "store", lambda c: c.store_layers(keys, layers, block_ids, stride), none)
        stored = sum(1 for o in outcomes if o == "stored")
        nbytes = stored * self._shape.layers * self._shape.layer_bytes
        return _Done(TransferResult(job_id, True, nbytes, time.perf_counter() - began))

    def _load(self, job_id: int, keys: list[int], block_ids: list[int]) -> _Done:
        began = time.perf_counter()
        n = len(block_ids)
        bad: set[int] = set(range(n))
        corrupt: list[int] = []
        if self._load_clients is not None and self._layers and len(keys) == n:
            load = self._load_clients.call(None, "load", lambda c: c.load(keys), None)
            if load is None:
                # A connection that a restart of the daemon broke: once
                # more, on a new one.
                load = self._load_clients.call(None, "load", lambda c: c.load(keys), None)
            if load is not None:
                bad, corrupt = self._read(load, block_ids, keys)
        if corrupt:
            logger.warning("kvtier: %d blocks failed verification; removed them from the node", len(corrupt))
            self._clients_remove(corrupt)
        nbytes = (n - len(bad)) * self._shape.layers * self._shape.layer_bytes
        elapsed = time.perf_counter() - began
        if not bad:
            return _Done(TransferResult(job_id, True, nbytes, elapsed))
        failed = {block_ids[i] for i in bad}
        if self._report_load_errors:
            logger.warning("kvtier: %d of %d blocks were not loaded; vLLM computes them", len(bad), n)
            failed_keys = [keys[i] for i in sorted(bad) if i < len(keys)]
            return _Done(TransferResult(job_id, True, nbytes, elapsed), failed, failed_keys, corrupt)
        logger.error(
            "kvtier: %d of %d blocks of a load were not filled (gone or failed verification). vLLM's "
            "OffloadingConnector cannot recompute them; failing the transfer rather than serve them. "
            "KvtierOffloadingConnector recomputes them instead.",
            len(bad),
            n,
        )
        return _Done(TransferResult(job_id, False, nbytes, elapsed), failed)

    def _read(self, load: kvtier.Load, block_ids: list[int], keys: list[int]) -> tuple[set[int], list[int]]:
        """Reads every layer of the pinned blocks; the indices not filled,
        and the keys that failed verification."""
        n = len(block_ids)
        pinned = min(load.prefix_len, n)
        bad = set(range(pinned, n))
        corrupt: list[int] = []
        ids = block_ids[:pinned]
        try:
            for layer, region in enumerate(self._layers):
                load.wait_layer(layer)
                ok = load.read_layer(layer, region, ids, self._stride)
                for i, good in enumerate(ok):
                    if not good and i not in bad:
                        bad.add(i)
                        corrupt.append(keys[i])
        except kvtier.KvtierError as e:
            logger.warning("kvtier load failed: %s", e)
            bad = set(range(n))
        finally:
            try:
                load.release()
            except kvtier.KvtierError as e:
                logger.debug("kvtier release failed: %s", e)
        return bad, corrupt

    def _clients_remove(self, keys: list[int]) -> None:
        if self._load_clients is not None:
            self._load_clients.call(None, "remove", _remover(keys), None)


def _guarded(job_id: int, f: Any, *args: Any) -> _Done:
    """``f(*args)``; a bug in it fails the job instead of losing it."""
    try:
        done: _Done = f(*args)
        return done
    except Exception as e:
        logger.exception("kvtier offloading transfer %d failed: %s", job_id, e)
        return _Done(TransferResult(job_id, False))


class KvtierOffloadingConnector(OffloadingConnector):
    """vLLM's ``OffloadingConnector`` with :class:`KvtierOffloadingSpec`,
    plus recompute of failed loads: blocks a load could not fill are
    reported to vLLM (``get_block_ids_with_load_errors``), which recomputes
    them with ``kv_load_failure_policy="recompute"`` (with ``"fail"`` it
    fails the request). Lookups then pin blocks without reading them
    back first. The keys of those blocks go to the scheduler with the
    workers' metadata, and are misses there until this engine stores them
    again, so the recomputed request does not load them again.

    Load it with ``kv_connector="KvtierOffloadingConnector"``,
    ``kv_connector_module_path="kvtier.vllm.offloading"`` and the same
    ``kv_connector_extra_config`` as the spec.
    """

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        if self.connector_worker is not None:
            spec = self.connector_worker.spec
            if not isinstance(spec, KvtierOffloadingSpec):
                raise ValueError(
                    "KvtierOffloadingConnector needs spec_name='KvtierOffloadingSpec' and "
                    "spec_module_path='kvtier.vllm.offloading' in kv_connector_extra_config"
                )
            spec.report_load_errors = True
        if self.connector_scheduler is not None:
            manager = self.connector_scheduler.manager
            if not isinstance(manager, KvtierOffloadingManager):
                raise ValueError("KvtierOffloadingConnector needs spec_name='KvtierOffloadingSpec'")
            manager.verify_on_lookup = False
        transfer = vllm_config.kv_transfer_config
        if transfer is not None and transfer.kv_load_failure_policy != "recompute":
            logger.warning(
                "kvtier: kv_load_failure_policy=%r fails requests whose blocks fail to load; "
                "'recompute' computes them instead",
                transfer.kv_load_failure_policy,
            )

    def _kvtier_worker(self) -> KvtierOffloadingWorker | None:
        worker = self.connector_worker.worker if self.connector_worker is not None else None
        return worker if isinstance(worker, KvtierOffloadingWorker) else None

    def get_block_ids_with_load_errors(self) -> set[int]:
        worker = self._kvtier_worker()
        return worker.take_load_errors() if worker is not None else set()

    def build_connector_worker_meta(self) -> OffloadingWorkerMetadata | None:
        meta = super().build_connector_worker_meta()
        worker = self._kvtier_worker()
        failed, corrupt = worker.take_failed_keys() if worker is not None else ([], [])
        if not failed:
            return meta
        base = meta if meta is not None else OffloadingWorkerMetadata()
        return KvtierOffloadingWorkerMetadata(
            completed_jobs=base.completed_jobs,
            transfer_stats=base.transfer_stats,
            failed_keys=failed,
            corrupt_keys=corrupt,
        )

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        meta = connector_output.kv_connector_worker_meta
        if isinstance(meta, KvtierOffloadingWorkerMetadata) and self.connector_scheduler is not None:
            manager = self.connector_scheduler.manager
            if isinstance(manager, KvtierOffloadingManager):
                manager.load_failed(meta.failed_keys, set(meta.corrupt_keys))
        super().update_connector_output(connector_output)


@dataclass
class KvtierOffloadingWorkerMetadata(OffloadingWorkerMetadata):
    """``OffloadingWorkerMetadata`` plus the keys of blocks the workers
    failed to load, and of those that failed verification
    (:meth:`KvtierOffloadingManager.load_failed`)."""

    failed_keys: list[int] = field(default_factory=list)
    corrupt_keys: list[int] = field(default_factory=list)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        merged = super().aggregate(other)
        assert isinstance(merged, OffloadingWorkerMetadata)
        return KvtierOffloadingWorkerMetadata(
            completed_jobs=merged.completed_jobs,
            transfer_stats=merged.transfer_stats,
            failed_keys=self.failed_keys + list(getattr(other, "failed_keys", [])),
            corrupt_keys=self.corrupt_keys + list(getattr(other, "corrupt_keys", [])),
        )
