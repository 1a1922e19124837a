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
the node's arena at the end of the step.

If the daemon is down or goes away, the engine runs as if there were no
cache (one warning) and reconnects when it answers again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

import kvtier
from kvtier.vllm.clients import Clients, logger
from kvtier.vllm.config import KvtierConfig, Shape, block_key

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request


@dataclass
class Transfer:
    """Blocks of one request to load or save: ``keys[i]`` in vLLM block
    ``block_ids[i]``."""

    req_id: str
    salt: str | None
    keys: list[int]
    block_ids: list[int]


@dataclass
class KvtierConnectorMetadata(KVConnectorMetadata):
    """What the workers do this step."""

    loads: list[Transfer] = field(default_factory=list)
    saves: list[Transfer] = field(default_factory=list)


@dataclass
class _Request:
    """The scheduler's view of one request."""

    request: Request
    computed: int
    """Tokens vLLM had computed when it asked for external ones."""
    saved: int
    """Leading blocks the node holds or that are being saved."""
    block_ids: list[int] = field(default_factory=list)
    load: Transfer | None = None


def _shape(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig) -> Shape:
    """The namespace and block shape of this engine's KV blocks."""
    import vllm

    group = kv_cache_config.kv_cache_groups[0]
    spec = group.kv_cache_spec
    platform = type(vllm.platforms.current_platform).__name__
    return Shape(
        model=str(vllm_config.model_config.model),
        dtype=str(getattr(spec, "dtype", "")).removeprefix("torch."),
        layout=f"vllm {vllm.__version__} {platform} {type(spec).__name__} "
        f"heads={getattr(spec, 'num_kv_heads', 0)} head={getattr(spec, 'head_size', 0)}",
        block_size=spec.block_size,
        layers=len(group.layer_names),
        layer_bytes=spec.page_size_bytes,
    )


def _tp(vllm_config: VllmConfig) -> tuple[int, int]:
    size = vllm_config.parallel_config.tensor_parallel_size
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return get_tensor_model_parallel_rank(), size
    except (AssertionError, RuntimeError):
        # The scheduler has no TP group: it looks up rank 0's blocks.
        return 0, size


class KvtierConnector(KVConnectorBase_V1):
    """A ``KVConnectorBase_V1`` over a kvtier node daemon."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig,
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config
        self._config = KvtierConfig.from_extra(extra)
        self._shape = _shape(vllm_config, kv_cache_config)
        tp_rank, tp_size = _tp(vllm_config)
        self._clients = Clients(self._config, self._shape, tp_rank, tp_size)
        # This version copies host KV buffers only (vLLM's CPU platform).
        import vllm.platforms

        self._enabled = vllm.platforms.current_platform.device_type == "cpu"
        if not self._enabled:
            logger.warning(
                "kvtier connector: KV caches on %s are not supported yet; running without the cache",
                vllm.platforms.current_platform.device_type,
            )
        # Scheduler side.
        self._requests: dict[str, _Request] = {}
        # Worker side.
        self._layers: list[torch.Tensor] = []
        self._layer_index: dict[str, int] = {}
        self._loading: list[tuple[Transfer, kvtier.Load, int]] = []
        self._load_errors: set[int] = set()
        self._corrupt: dict[str | None, set[int]] = {}
        self._stats = _Stats()
        logger.info(
            "kvtier connector (%s) on %s: %s, %d layers of %d bytes per block",
            role.name,
            self._config.socket,
            self._shape.model,
            self._shape.layers,
            self._shape.layer_bytes,
        )

    # ---------------------------------------------------------------- scheduler

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        if not self._enabled:
            return 0, False
        bs = self._shape.block_size
        # vLLM computes at least the last token itself.
        usable = min(len(request.block_hashes), (request.num_tokens - 1) // bs)
        keys = [block_key(h) for h in request.block_hashes[:usable]]
        salt = request.cache_salt
        none: list[str] = []
        tiers = self._clients.call(salt, "lookup", lambda c: c.lookup(keys), none) if keys else none
        hit = len(tiers)
        self._requests[request.request_id] = _Request(request=request, computed=num_computed_tokens, saved=hit)
        return max(hit * bs - num_computed_tokens, 0), False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        st = self._requests.get(request.request_id)
        if st is None or num_external_tokens == 0:
            return
        bs = self._shape.block_size
        first = st.computed // bs
        end = first + num_external_tokens // bs
        ids = blocks.get_block_ids()[0]
        st.load = Transfer(
            req_id=request.request_id,
            salt=request.cache_salt,
            keys=[block_key(h) for h in request.block_hashes[first:end]],
            block_ids=list(ids[first:end]),
        )

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = KvtierConnectorMetadata()
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            st = self._requests.get(new.req_id)
            if st is None:
                continue
            st.block_ids = list(new.block_ids[0])
            self._plan(st, new.num_computed_tokens + scheduled.get(new.req_id, 0), meta)
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            st = self._requests.get(req_id)
            if st is None:
                continue
            new_ids = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids and new_ids is not None:
                st.block_ids = list(new_ids[0])
            elif new_ids is not None:
                st.block_ids.extend(new_ids[0])
            self._plan(st, cached.num_computed_tokens[i] + scheduled.get(req_id, 0), meta)
        return meta

    def _plan(self, st: _Request, computed_after: int, meta: KvtierConnectorMetadata) -> None:
        """This step's load of the request, and the save of the prompt blocks
        it completes that the node does not hold."""
        if st.load is not None:
            meta.loads.append(st.load)
            st.load = None
        req = st.request
        bs = self._shape.block_size
        prompt_blocks = len(req.prompt_token_ids or ()) // bs
        full = min(computed_after // bs, len(req.block_hashes), prompt_blocks, len(st.block_ids))
        if full <= st.saved:
            return
        meta.saves.append(
            Transfer(
                req_id=req.request_id,
                salt=req.cache_salt,
                keys=[block_key(h) for h in req.block_hashes[st.saved : full]],
                block_ids=st.block_ids[st.saved : full],
            )
        )
        st.saved = full

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        # Saves finish within the step that scheduled them (wait_for_save),
        # so vLLM may free the blocks at once.
        self._requests.pop(request.request_id, None)
        return False, None

    # ------------------------------------------------------------------- worker

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        for name, t in kv_caches.items():
            per_block = t[0].numel() * t.element_size()
            if t.device.type != "cpu" or not t[0].is_contiguous() or per_block != self._shape.layer_bytes:
                # Device memory needs a staging copy this version does not
                # have: run without the cache rather than stop the engine.
                logger.warning(
                    "kvtier needs host KV blocks of %d contiguous bytes; layer %s is %s %s on %s: "
                    "running without the cache",
                    self._shape.layer_bytes,
                    name,
                    tuple(t.shape),
                    t.dtype,
                    t.device,
                )
                return
        self._layers = list(kv_caches.values())
        self._layer_index = {name: i for i, name in enumerate(kv_caches)}

    def _region(self, layer: int) -> tuple[int, int, int]:
        """(address, nbytes, block stride) of one layer's paged buffer."""
        t = self._layers[layer]
        stride = t.stride(0) * t.element_size()
        return t.data_ptr(), stride * t.shape[0], stride

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvtierConnectorMetadata)
        if not self._layers:
            # No usable KV buffers: every planned block is recomputed.
            for t in meta.loads:
                self._load_errors.update(t.block_ids)
            return
        for t in meta.loads:
            began = time.perf_counter()
            load = self._clients.call(t.salt, "load", _loader(t.keys), None)
            pinned = load.prefix_len if load is not None else 0
            # What the node no longer holds is recomputed.
            self._load_errors.update(t.block_ids[pinned:])
            if load is not None:
                self._loading.append((t, load, pinned))
            self._stats.load_started(began)

    def wait_for_layer_load(self, layer_name: str) -> None:
        layer = self._layer_index.get(layer_name)
        if layer is None or not self._loading:
            return
        self._read_layer(layer)
        if layer == len(self._layers) - 1:
            self._finish_loads()

    def _read_layer(self, layer: int) -> None:
        addr, nbytes, stride = self._region(layer)
        for t, load, pinned in self._loading:
            ids = t.block_ids[:pinned]
            try:
                load.wait_layer(layer)
                ok = load.read_layer(layer, (addr, nbytes), ids, stride)
            except kvtier.KvtierError as e:
                logger.warning("kvtier load of request %s failed at layer %d: %s", t.req_id, layer, e)
                ok = [False] * len(ids)
            for i, good in enumerate(ok):
                if not good:
                    self._load_errors.add(ids[i])
                    self._corrupt.setdefault(t.salt, set()).add(t.keys[i])

    def _finish_loads(self) -> None:
        for t, load, pinned in self._loading:
            try:
                load.release()
            except kvtier.KvtierError as e:
                logger.warning("kvtier release of request %s failed: %s", t.req_id, e)
            self._stats.loaded(pinned * self._shape.layers * self._shape.layer_bytes, pinned)
        self._loading.clear()
        # A block that failed verification is a miss for every reader:
        # remove it, so the next save of its key stores good bytes.
        for salt, keys in self._corrupt.items():
            logger.warning("kvtier: %d blocks failed verification; vLLM recomputes them", len(keys))
            self._clients.call(salt, "remove", _remover(sorted(keys)), None)
        self._corrupt.clear()

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata, **kwargs: Any) -> None:
        # Saved whole at the end of the step (wait_for_save): a block is
        # stored with all its layers in one reserve and commit.
        return

    def wait_for_save(self) -> None:
        if self._loading:
            # A forward that did not visit every layer: read the rest so no
            # slot stays pinned.
            for layer in range(len(self._layers)):
                self._read_layer(layer)
            self._finish_loads()
        if not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvtierConnectorMetadata)
        if not meta.saves or not self._layers:
            return
        regions = [self._region(i) for i in range(len(self._layers))]
        stride = regions[0][2]
        layers = [(addr, nbytes) for addr, nbytes, _ in regions]
        for t in meta.saves:
            began = time.perf_counter()
            none: list[str] = []
            outcomes = self._clients.call(t.salt, "store", _storer(t, layers, stride), none)
            stored = sum(o in ("stored", "already_stored") for o in outcomes)
            self._stats.saved(began, stored * self._shape.layers * self._shape.layer_bytes, stored)

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        self._stats.load_failed(len(errors))
        return errors

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        return self._stats.take()

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats | None:
        return KvtierStats(data=dict(data or {}))


def _loader(keys: list[int]) -> Callable[[kvtier.Client], kvtier.Load | None]:
    def load(c: kvtier.Client) -> kvtier.Load | None:
        return c.load(keys)

    return load


def _remover(keys: list[int]) -> Callable[[kvtier.Client], None]:
    def remove(c: kvtier.Client) -> None:
        c.remove(keys)

    return remove


def _storer(t: Transfer, layers: list[tuple[int, int]], stride: int) -> Callable[[kvtier.Client], list[str]]:
    def store(c: kvtier.Client) -> list[str]:
        return c.store_layers(t.keys, layers, t.block_ids, stride)

    return store


@dataclass
class KvtierStats(KVConnectorStats):
    """Blocks and bytes loaded and saved, and the seconds spent, summed
    over workers and intervals."""

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


_STAT_KEYS = (
    "loaded_blocks",
    "loaded_bytes",
    "load_seconds",
    "load_failed_blocks",
    "saved_blocks",
    "saved_bytes",
    "save_seconds",
)


class _Stats:
    """The worker's counters since the last ``get_kv_connector_stats``."""

    def __init__(self) -> None:
        self._now = KvtierStats()

    def load_started(self, began: float) -> None:
        self._now.data["load_seconds"] += time.perf_counter() - began

    def loaded(self, nbytes: int, blocks: int) -> None:
        self._now.data["loaded_bytes"] += nbytes
        self._now.data["loaded_blocks"] += blocks

    def load_failed(self, blocks: int) -> None:
        self._now.data["load_failed_blocks"] += blocks

    def saved(self, began: float, nbytes: int, blocks: int) -> None:
        self._now.data["save_seconds"] += time.perf_counter() - began
        self._now.data["saved_bytes"] += nbytes
        self._now.data["saved_blocks"] += blocks

    def take(self) -> KvtierStats | None:
        if self._now.is_empty():
            return None
        out, self._now = self._now, KvtierStats()
        return out
