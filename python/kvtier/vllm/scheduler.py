"""The connector's scheduler side: which of a request's prompt blocks the
node holds in every KV-cache group, which to load into the blocks vLLM
allocated, which to save once computed, and when a finished request's
blocks may be freed."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

from kvtier.vllm.clients import Clients, logger
from kvtier.vllm.config import Shape, block_key
from kvtier.vllm.events import EventTracker, KvtierWorkerMetadata
from kvtier.vllm.groups import NULL_BLOCK_ID, Group, primary
from kvtier.vllm.layouts import RankBlocks, distance
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
    """Blocks of one request and KV-cache group to load or save:
    ``keys[i]`` in vLLM block ``block_ids[i]``; for a load, ``tiers[i]`` is
    where the scheduler found it."""

    req_id: str
    salt: str | None
    keys: list[int]
    block_ids: list[int]
    tiers: list[str] = field(default_factory=list)
    group: int = 0


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
    finished: set[str] = field(default_factory=set)
    """Finished requests whose saves every worker reported done: vLLM
    freed their blocks at once; the workers forget their saves."""


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
    block_ids: list[list[int]] = field(default_factory=list)
    """vLLM's blocks of the request, per KV-cache group."""
    loads: list[Transfer] = field(default_factory=list)
    saving: list[int] = field(default_factory=list)
    """Keys whose saves were handed to the workers."""


class KvtierScheduler:
    """Lookups, and load and save plans, of one engine; ``clients[g]`` serve
    KV-cache group ``groups[g]``."""

    def __init__(
        self, shape: Shape, groups: list[Group], clients: list[Clients], layout: RankBlocks, workers: int
    ) -> None:
        self._shape = shape
        self._workers = workers
        self._groups = groups
        self._clients = clients
        self._primary = primary(groups)
        self._layout = layout
        self._requests: dict[str, _Request] = {}
        self._events = EventTracker(shape.block_size, clients[self._primary].kind_of)
        self._finished: set[str] = set()
        self._delayed: set[str] = set()
        self._handed: dict[str, int] = {}
        """Save transfers handed to each worker, per request."""
        self._done: dict[str, int] = {}
        """Save transfers the workers reported finished, summed over them."""

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int, bool]:
        bs = self._shape.block_size
        # vLLM computes at least the last token itself.
        usable = min(len(request.block_hashes), (request.num_tokens - 1) // bs)
        keys = [block_key(h) for h in request.block_hashes[:usable]]
        tiers, held = self._hit(request.cache_salt, keys)
        self._events.looked_up(keys, held)
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

    def _hit(self, salt: str | None, keys: list[int]) -> tuple[list[str], list[str]]:
        """Tier of each block of the longest prefix of ``keys`` that every
        group can serve, and the stored prefix of the primary group (what
        KV events report). Full-attention groups hold all the hit's
        blocks, sliding windows the blocks of their window at its end (a
        block a window has dropped is never offered). A block is as far as
        its farthest group's copy."""
        end = len(keys)
        found: list[dict[int, str]] = []
        held: list[str] | None = None
        for g in self._groups:
            if g.window is None:
                tiers = self._lookup(g.index, salt, keys[:end])
                held = tiers if g.index == self._primary else held
                end = len(tiers)
                found.append(dict(enumerate(tiers)))
        windows = [g for g in self._groups if g.window is not None]
        for g in windows:
            first = g.first_needed(end, self._shape.block_size)
            tiers = self._lookup(g.index, salt, keys[first:end])
            if len(tiers) < end - first:
                hit = self._window_prefixes(salt, keys[:end], windows, found)
                return hit, hit if held is None else held
            found.append({first + i: t for i, t in enumerate(tiers)})
        hit = _farthest(found, end)
        return hit, hit if held is None else held

    def _window_prefixes(
        self, salt: str | None, keys: list[int], windows: list[Group], found: list[dict[int, str]]
    ) -> list[str]:
        """The hit when some window misses at the full groups' end: the
        prefix every window group holds from its first block (whose window
        at any end it therefore holds)."""
        end = len(keys)
        for g in windows:
            tiers = self._lookup(g.index, salt, keys[:end])
            end = len(tiers)
            found.append(dict(enumerate(tiers)))
        return _farthest(found, end)

    def _lookup(self, group: int, salt: str | None, keys: list[int]) -> list[str]:
        """Tier of each leading block of ``keys`` the node holds whole in
        ``group``'s namespace."""
        if not keys:
            return []
        objects = self._layout.lookup_keys(keys)
        none: list[str] = []
        tiers = self._clients[group].call(salt, "lookup", lambda c: c.lookup(objects), none)
        return self._layout.lookup_blocks(keys, tiers)

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        st = self._requests.get(request.request_id)
        if st is None or num_external_tokens == 0:
            return
        bs = self._shape.block_size
        first = st.computed // bs
        end = first + num_external_tokens // bs
        keys = [block_key(h) for h in request.block_hashes[:end]]
        # A group loads the blocks vLLM allocated: a sliding window's
        # dropped blocks are vLLM's null block, and not loaded.
        st.loads = []
        for g, ids in enumerate(blocks.get_block_ids()):
            take = [i for i in range(first, min(end, len(ids))) if ids[i] != NULL_BLOCK_ID]
            if take:
                st.loads.append(
                    Transfer(
                        req_id=request.request_id,
                        salt=request.cache_salt,
                        keys=[keys[i] for i in take],
                        block_ids=[ids[i] for i in take],
                        tiers=[st.tiers[i] for i in take],
                        group=g,
                    )
                )

    def get_external_cache_hit_sources(self, request: Request, num_external_tokens: int) -> dict[CacheHitSource, int]:
        st = self._requests.get(request.request_id)
        tiers = st.tiers if st is not None else []
        kind_of = self._clients[self._primary].kind_of
        return hit_sources(tiers, kind_of, self._shape.block_size, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KvtierConnectorMetadata:
        meta = KvtierConnectorMetadata(
            preempted=set(scheduler_output.preempted_req_ids or ()),
            delayed=self._delayed,
            finished=self._finished,
        )
        self._delayed, self._finished = set(), set()
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            st = self._requests.get(new.req_id)
            if st is None:
                continue
            st.block_ids = [list(ids) for ids in new.block_ids]
            self._plan(st, new.num_computed_tokens + scheduled.get(new.req_id, 0), meta)
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            st = self._requests.get(req_id)
            if st is None:
                continue
            new_ids = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids and new_ids is not None:
                st.block_ids = [list(ids) for ids in new_ids]
            elif new_ids is not None:
                for have, ids in zip(st.block_ids, new_ids):
                    have.extend(ids)
            self._plan(st, cached.num_computed_tokens[i] + scheduled.get(req_id, 0), meta)
        return meta

    def _plan(self, st: _Request, computed_after: int, meta: KvtierConnectorMetadata) -> None:
        """This step's load of the request, and the save of the prompt blocks
        it completes that the node does not hold."""
        meta.loads.extend(st.loads)
        st.loads = []
        req = st.request
        bs = self._shape.block_size
        prompt_blocks = len(req.prompt_token_ids or ()) // bs
        full = min(computed_after // bs, len(req.block_hashes), prompt_blocks, *map(len, st.block_ids))
        if full <= st.saved:
            return
        keys = [block_key(h) for h in req.block_hashes[st.saved : full]]
        # Sliding windows last: the workers wait for their saves before the
        # next forward, and saves run in order, so by then every save of
        # the step is done (and reported, so the request's blocks are
        # freed as soon as it finishes).
        for g in sorted(range(len(st.block_ids)), key=lambda g: self._groups[g].window is not None):
            ids = st.block_ids[g]
            # A sliding window may hold vLLM's null block for some of them.
            take = [i for i in range(st.saved, full) if ids[i] != NULL_BLOCK_ID]
            if take:
                meta.saves.append(
                    Transfer(
                        req_id=req.request_id,
                        salt=req.cache_salt,
                        keys=[keys[i - st.saved] for i in take],
                        block_ids=[ids[i] for i in take],
                        group=g,
                    )
                )
                self._handed[req.request_id] = self._handed.get(req.request_id, 0) + 1
        self._events.saving(req, st.saved, keys)
        st.saving.extend(keys)
        st.saved = full

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        meta = output.kv_connector_worker_meta
        if isinstance(meta, KvtierWorkerMetadata):
            self._events.worker_said(meta)
            for req_id, n in meta.saves_done.items():
                if req_id in self._handed:
                    self._done[req_id] = self._done.get(req_id, 0) + n

    def request_finished(self, request: Request) -> tuple[bool, dict[str, Any] | None]:
        """A finished request's blocks are freed at once when every worker
        reported its saves done (the usual case: a prompt's saves start in
        its prefill step), so ``LLM.reset_prefix_cache()`` succeeds right
        after ``generate``; blocks that saves are still copying stay
        allocated until the workers report them done (``get_finished``)."""
        req_id = request.request_id
        self._requests.pop(req_id, None)
        handed, done = self._handed.pop(req_id, 0), self._done.pop(req_id, 0)
        if handed == 0:
            return False, None
        if done >= handed * self._workers:
            self._finished.add(req_id)
            return False, None
        self._delayed.add(req_id)
        return True, None

    def take_events(self) -> Iterable[KVCacheEvent]:
        return self._events.take()


def _farthest(found: list[dict[int, str]], end: int) -> list[str]:
    """The tier of each of the first ``end`` blocks: the farthest of the
    tiers the groups' lookups found it in."""
    return [max((f[i] for f in found if i in f), key=distance, default="G2") for i in range(end)]
