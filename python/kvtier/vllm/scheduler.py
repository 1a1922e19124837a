"""The connector's scheduler side: which of a request's prompt blocks the
node holds, which to load into the blocks vLLM allocated, which to save
once computed, and when a finished request's blocks may be freed."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

from kvtier.vllm.clients import Clients, logger
from kvtier.vllm.config import Shape, block_key
from kvtier.vllm.events import EventTracker, KvtierWorkerMetadata
from kvtier.vllm.layouts import RankBlocks
from kvtier.vllm.stats import hit_sources

if TYPE_CHECKING:
    from vllm.distributed.kv_events import KVCacheEvent
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.metrics.cache_hit_source import CacheHitSource
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request


@dataclass
class Transfer:
    """Blocks of one request to load or save: ``keys[i]`` in vLLM block
    ``block_ids[i]``; for a load, ``tiers[i]`` is where the scheduler found
    it."""

    req_id: str
    salt: str | None
    keys: list[int]
    block_ids: list[int]
    tiers: list[str] = field(default_factory=list)


@dataclass
class KvtierConnectorMetadata(KVConnectorMetadata):
    """What the workers do this step."""

    loads: list[Transfer] = field(default_factory=list)
    saves: list[Transfer] = field(default_factory=list)
    preempted: set[str] = field(default_factory=set)
    """Requests whose blocks vLLM freed: their saves must end before the
    forward writes into those blocks."""
    delayed: set[str] = field(default_factory=set)
    """Finished requests whose blocks stay allocated until the workers
    report their saves done (``get_finished``)."""


@dataclass
class _Request:
    """The scheduler's view of one request."""

    request: Request
    computed: int
    """Tokens vLLM had computed when it asked for external ones."""
    tiers: list[str]
    """Tier of each block of the stored prefix the lookup found."""
    saved: int
    """Leading blocks the node holds or that are being saved."""
    block_ids: list[int] = field(default_factory=list)
    load: Transfer | None = None
    saving: list[int] = field(default_factory=list)
    """Keys whose saves were handed to the workers."""


class KvtierScheduler:
    """Lookups, load and save plans, and delayed frees of one engine."""

    def __init__(self, shape: Shape, clients: Clients, layout: RankBlocks) -> None:
        self._shape = shape
        self._clients = clients
        self._layout = layout
        self._requests: dict[str, _Request] = {}
        self._events = EventTracker(shape.block_size)
        self._delayed: set[str] = set()

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int, bool]:
        bs = self._shape.block_size
        # vLLM computes at least the last token itself.
        usable = min(len(request.block_hashes), (request.num_tokens - 1) // bs)
        keys = [block_key(h) for h in request.block_hashes[:usable]]
        tiers = self._lookup(request.cache_salt, keys)
        self._events.looked_up(keys, tiers)
        logger.debug(
            "kvtier lookup of request %s: %d of %d full blocks stored %s, %d tokens computed already",
            request.request_id,
            len(tiers),
            len(keys),
            {t: tiers.count(t) for t in set(tiers)},
            num_computed_tokens,
        )
        # A preempted request is looked up again: the saves it already
        # handed to the workers still hold its blocks at the end.
        before = self._requests.get(request.request_id)
        self._requests[request.request_id] = _Request(
            request=request,
            computed=num_computed_tokens,
            tiers=tiers,
            saved=len(tiers),
            saving=before.saving if before is not None else [],
        )
        return max(len(tiers) * bs - num_computed_tokens, 0), False

    def _lookup(self, salt: str | None, keys: list[int]) -> list[str]:
        """Tier of each leading block of ``keys`` the node holds whole."""
        if not keys:
            return []
        objects = self._layout.lookup_keys(keys)
        none: list[str] = []
        tiers = self._clients.call(salt, "lookup", lambda c: c.lookup(objects), none)
        return self._layout.lookup_blocks(keys, tiers)

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
            tiers=st.tiers[first:end],
        )

    def get_external_cache_hit_sources(self, request: Request, num_external_tokens: int) -> dict[CacheHitSource, int]:
        st = self._requests.get(request.request_id)
        tiers = st.tiers if st is not None else []
        return hit_sources(tiers, self._shape.block_size, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KvtierConnectorMetadata:
        meta = KvtierConnectorMetadata(
            preempted=set(scheduler_output.preempted_req_ids or ()),
            delayed=self._delayed,
        )
        self._delayed = set()
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
        keys = [block_key(h) for h in req.block_hashes[st.saved : full]]
        meta.saves.append(
            Transfer(req_id=req.request_id, salt=req.cache_salt, keys=keys, block_ids=st.block_ids[st.saved : full])
        )
        self._events.saving(req, st.saved, keys)
        st.saving.extend(keys)
        st.saved = full

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        meta = output.kv_connector_worker_meta
        if isinstance(meta, KvtierWorkerMetadata):
            self._events.worker_said(meta)

    def request_finished(self, request: Request) -> tuple[bool, dict[str, Any] | None]:
        """Blocks with saves handed to the workers stay allocated until the
        workers report the request's saves done (``get_finished``)."""
        st = self._requests.pop(request.request_id, None)
        if st is None or not st.saving:
            return False, None
        self._delayed.add(request.request_id)
        return True, None

    def take_events(self) -> Iterable[KVCacheEvent]:
        return self._events.take()
