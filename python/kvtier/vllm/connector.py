"""``KvtierConnector``: vLLM's KV blocks kept in a kvtier node.

Scheduler side: a request's full prompt blocks are looked up in the node
by vLLM's own block hashes (the first 16 bytes, namespaced by model, dtype,
layout, block size, TP rank and size, and the request's ``cache_salt``), and
the stored prefix is offered to vLLM as external tokens. Blocks the node
does not hold are saved once vLLM has computed them.

Worker side: loads start before the forward and each layer is read into
vLLM's paged buffer when its attention asks for it, as the daemon reports
the layer ready; every block is verified, and a block that fails is
reported to vLLM (``get_block_ids_with_load_errors``) so it is recomputed.
Saves copy each block's layers straight from vLLM's per-layer buffers into
the node's arena on a background thread once the step's forward is done. A
finished request's blocks are freed at once when every worker reported its
saves done; blocks that saves are still copying stay allocated until they
are (``request_finished`` / ``get_finished``).

Hybrid models (several KV-cache groups: full attention beside sliding
windows) are served with vLLM's hybrid KV cache manager on
(``SupportsHMA``): each group is stored in a namespace of its own, and a
sliding window loads and is offered only the blocks of its window
(:mod:`kvtier.vllm.groups`).

vLLM learns which tier each loaded token came from
(``get_external_cache_hit_sources``: host memory, disk, or unspecified for
the remote tier), the worker's counters (``get_kv_connector_stats``), and
KV events for the blocks this engine stored and saw leave
(``take_events``).

If the daemon is down or goes away, the engine runs as if there were no
cache (one warning) and reconnects when it answers again.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorWorkerMetadata,
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

import kvtier
from kvtier.vllm.clients import Clients, logger
from kvtier.vllm.config import KvtierConfig, Shape
from kvtier.vllm.groups import Group, groups_of
from kvtier.vllm.layouts import HeadShardBlocks, RankBlocks
from kvtier.vllm.scheduler import KvtierConnectorMetadata, KvtierScheduler
from kvtier.vllm.stats import KvtierStats
from kvtier.vllm.worker import KvtierWorker

if TYPE_CHECKING:
    from collections.abc import Iterable

    from vllm.config import VllmConfig
    from vllm.distributed.kv_events import KVCacheEvent
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.metrics.cache_hit_source import CacheHitSource
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request


def _shape(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig, config: KvtierConfig, tp_size: int) -> Shape:
    """The namespace and stored-object shape of this engine's KV blocks
    (of its first KV-cache group; :func:`_group_shape` gives each group's).
    Head shards name the model's KV heads and the shard's bytes, so every
    TP size derives the same shape; rank blocks name the rank's. Its layers
    are the largest group's: vLLM pads every group to that size."""
    import vllm

    group = kv_cache_config.kv_cache_groups[0]
    spec = group.kv_cache_spec
    platform = type(vllm.platforms.current_platform).__name__
    rank_heads = int(getattr(spec, "num_kv_heads", 0))
    page_bytes = spec.page_size_bytes
    heads, layer_bytes = rank_heads, page_bytes
    if config.shard_heads is not None:
        heads = _total_kv_heads(vllm_config)
        layer_bytes = _shard_layer_bytes(page_bytes, rank_heads, config.shard_heads, heads, tp_size)
    return Shape(
        model=str(vllm_config.model_config.model),
        dtype=str(getattr(spec, "dtype", "")).removeprefix("torch."),
        layout=f"vllm {vllm.__version__} {platform} {type(spec).__name__} "
        f"heads={heads} head={getattr(spec, 'head_size', 0)}" + ("" if config.shard_heads is None else f" shard={config.shard_heads}"),
        block_size=spec.block_size,
        layers=max(len(g.layer_names) for g in kv_cache_config.kv_cache_groups),
        layer_bytes=layer_bytes,
    )


def _group_shape(shape: Shape, kv_cache_config: KVCacheConfig, group: int) -> Shape:
    """The namespace of one KV-cache group: a single group's is the
    engine's shape as it always was; each group of several has its index
    and its spec in the layout string, so groups never share keys."""
    groups = kv_cache_config.kv_cache_groups
    if len(groups) == 1:
        return shape
    spec = groups[group].kv_cache_spec
    window = getattr(spec, "sliding_window", None)
    tag = f" group={group}/{len(groups)} {type(spec).__name__}" + ("" if window is None else f" window={window}")
    return dataclasses.replace(shape, layout=shape.layout + tag)


def _total_kv_heads(vllm_config: VllmConfig) -> int:
    """The model's KV heads; one latent for MLA (whatever its config says
    of heads, every rank holds the one latent)."""
    model = vllm_config.model_config
    return 1 if model.use_mla else model.get_total_num_kv_heads()


def _shard_layer_bytes(page_bytes: int, rank_heads: int, shard_heads: int, heads: int, tp_size: int) -> int:
    """Bytes of one layer of one head shard; a ``shard_heads`` that does not
    divide this rank's heads is a configuration error."""
    if rank_heads <= 0 or rank_heads % shard_heads != 0 or page_bytes % rank_heads != 0:
        raise ValueError(
            f"kvtier connector: shard_heads={shard_heads} must divide the {rank_heads} KV heads each rank holds "
            f"({heads} KV heads at TP {tp_size})"
        )
    return page_bytes // rank_heads * shard_heads


def _layout(config: KvtierConfig, kv_heads: int, tp_rank: int, tp_size: int) -> RankBlocks:
    """Rank blocks, or head shards when `shard_heads` is set."""
    if config.shard_heads is None:
        return RankBlocks()
    shards = kvtier.HeadShards(kv_heads=kv_heads, shard_heads=config.shard_heads)
    return HeadShardBlocks(shards, tp_rank, tp_size)


def _tp(vllm_config: VllmConfig) -> tuple[int, int]:
    size = vllm_config.parallel_config.tensor_parallel_size
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return get_tensor_model_parallel_rank(), size
    except (AssertionError, RuntimeError):
        # The scheduler has no TP group: it looks up rank 0's blocks.
        return 0, size


def _startup_line(
    role: KVConnectorRole,
    tp_rank: int,
    tp_size: int,
    config: KvtierConfig,
    shape: Shape,
    layout: RankBlocks,
    groups: list[Group],
) -> str:
    """The start-up log line: the route, the daemon's socket and the block
    shape the daemon must hold, the layout, and the KV-cache groups."""
    objects = (
        "rank blocks"
        if config.shard_heads is None
        else f"head shards of {config.shard_heads} KV heads ({layout.per_block} per block on this rank)"
    )
    kinds = "; ".join(f"group {g.index}: {g.describe()}" for g in groups)
    return (
        f"kvtier connector (KvtierConnector, {role.name}, TP rank {tp_rank} of {tp_size}) on {config.socket}: "
        f"{shape.model}, {shape.dtype}, blocks of {shape.block_size} tokens, "
        f"{shape.layers} layers of {shape.layer_bytes} bytes per stored object, {objects}, "
        f"{len(groups)} KV-cache group{'s' if len(groups) != 1 else ''} ({kinds})"
    )


class KvtierConnector(KVConnectorBase_V1, SupportsHMA):
    """A ``KVConnectorBase_V1`` over a kvtier node daemon: the scheduler
    side is a :class:`KvtierScheduler`, the worker side a
    :class:`KvtierWorker`. It supports vLLM's hybrid KV cache manager
    (``SupportsHMA``): models with several KV-cache groups keep it on."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig,
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        config = KvtierConfig.from_extra(self._kv_transfer_config.kv_connector_extra_config)
        if vllm_config.model_config.use_mla and config.shard_heads is None:
            # The latent is the same on every rank: one stored copy serves
            # every rank of every TP size (head shards of the one latent).
            config = dataclasses.replace(config, shard_heads=1)
        tp_rank, tp_size = _tp(vllm_config)
        shape = _shape(vllm_config, kv_cache_config, config, tp_size)
        layout = _layout(config, _total_kv_heads(vllm_config), tp_rank, tp_size)
        groups, unsupported = groups_of(kv_cache_config)
        # Head shards belong to no rank: every TP size shares them.
        rank = (0, 1) if layout.rank_free else (tp_rank, tp_size)
        clients = [Clients(config, _group_shape(shape, kv_cache_config, g.index), *rank) for g in groups]
        # Host KV buffers are copied in place; a GPU's through host staging
        # (kvtier.device).
        import vllm.platforms

        device = vllm.platforms.current_platform.device_type
        self._enabled = device in ("cpu", "cuda") and unsupported is None
        if device not in ("cpu", "cuda"):
            logger.warning("kvtier connector: KV caches on %s are not supported; running without the cache", device)
        elif unsupported is not None:
            logger.warning("kvtier connector: %s; running without the cache", unsupported)
        workers = vllm_config.parallel_config.world_size
        self._scheduler = KvtierScheduler(shape, groups, clients, layout, workers)
        self._worker = KvtierWorker(shape, groups, clients, tp_rank, layout)
        logger.info("%s", _startup_line(role, tp_rank, tp_size, config, shape, layout, groups))

    # ---------------------------------------------------------------- scheduler

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        if not self._enabled:
            return 0, False
        return self._scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        self._scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def get_external_cache_hit_sources(self, request: Request, num_external_tokens: int) -> dict[CacheHitSource, int]:
        return self._scheduler.get_external_cache_hit_sources(request, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        return self._scheduler.build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        self._scheduler.update_connector_output(connector_output)

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return self._scheduler.request_finished(request)

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self._scheduler.request_finished(request)

    def take_events(self) -> Iterable[KVCacheEvent]:
        return self._scheduler.take_events()

    # ------------------------------------------------------------------- worker

    def _meta(self) -> KvtierConnectorMetadata | None:
        if not self.has_connector_metadata():
            return None
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvtierConnectorMetadata)
        return meta

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._worker.register_kv_caches(kv_caches)

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        if isinstance(kv_connector_metadata, KvtierConnectorMetadata):
            self._worker.handle_preemptions(kv_connector_metadata)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._meta()
        if meta is not None:
            self._worker.start_load_kv(meta)

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._worker.wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata, **kwargs: Any) -> None:
        # Saved whole after the forward (wait_for_save): a block is stored
        # with all its layers in one reserve and commit.
        return

    def wait_for_save(self) -> None:
        self._worker.wait_for_save(self._meta())

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.get_block_ids_with_load_errors()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return self._worker.get_finished(self._meta()) or None, None

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        return self._worker.take_worker_metadata()

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        return self._worker.take_stats()

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats | None:
        return KvtierStats(data=dict(data or {}))

    def shutdown(self) -> None:
        self._worker.shutdown()
