"""vLLM KV events (``take_events``) for the blocks the connector put in the
node and saw leave it.

The scheduler side knows vLLM's full block hashes and tokens; the workers
know when a save finished and which blocks failed verification. Workers
report the keys (:class:`KvtierWorkerMetadata`), and :class:`EventTracker`
turns them into ``BlockStored`` / ``BlockRemoved`` with the medium of the
kind of tier the node says it is: ``CPU`` for host memory (G2), ``STORAGE``
for the node's disk and remote store (G3 and G4 by default). A block is
stored in G2 first; when a later lookup
finds it on another tier, its move is a ``BlockRemoved`` from the old
medium and a ``BlockStored`` on the new one, and a block a lookup no longer
finds is removed.

These events cover this engine's own blocks as this engine observes them.
The daemon's event stream (``manager.events_zmq_endpoint``) covers every
block of the node as it moves, for routers that follow the whole node.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVCacheEvent
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorWorkerMetadata
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

from kvtier.vllm.stats import KIND_MEDIUMS

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_utils import BlockHash
    from vllm.v1.request import Request

#: Blocks the tracker remembers having announced (oldest forgotten first).
ANNOUNCED_LIMIT = 1 << 18


@dataclass
class KvtierWorkerMetadata(KVConnectorWorkerMetadata):
    """What the workers tell the scheduler after a step: from rank 0, keys
    whose save finished (stored, or not stored) and keys it removed because
    they failed verification; from every rank, how many of each request's
    save transfers finished (summed over ranks)."""

    stored: list[int] = field(default_factory=list)
    not_stored: list[int] = field(default_factory=list)
    removed: list[int] = field(default_factory=list)
    saves_done: dict[str, int] = field(default_factory=dict)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        if isinstance(other, KvtierWorkerMetadata):
            self.stored.extend(other.stored)
            self.not_stored.extend(other.not_stored)
            self.removed.extend(other.removed)
            for req_id, n in other.saves_done.items():
                self.saves_done[req_id] = self.saves_done.get(req_id, 0) + n
        return self

    def __bool__(self) -> bool:
        return bool(self.stored or self.not_stored or self.removed or self.saves_done)


@dataclass
class _Block:
    """What a ``BlockStored`` says about one block."""

    block_hash: BlockHash
    parent: BlockHash | None
    token_ids: list[int]
    lora_name: str | None
    medium: str = "CPU"


class EventTracker:
    """The scheduler's record of blocks being saved and announced;
    ``kind_of`` says what storage each tier of the node is."""

    def __init__(self, block_size: int, kind_of: Callable[[str], str]) -> None:
        self._block_size = block_size
        self._kind_of = kind_of
        self._saving: dict[int, _Block] = {}
        self._announced: OrderedDict[int, _Block] = OrderedDict()
        self._events: list[KVCacheEvent] = []

    def saving(self, request: Request, first: int, keys: list[int]) -> None:
        """Blocks ``first..first+len(keys)`` of ``request`` are being saved."""
        bs = self._block_size
        lora = request.lora_request.name if request.lora_request else None
        for i, key in enumerate(keys, start=first):
            self._saving[key] = _Block(
                block_hash=request.block_hashes[i],
                parent=request.block_hashes[i - 1] if i > 0 else None,
                token_ids=list(request.all_token_ids[i * bs : (i + 1) * bs]),
                lora_name=lora,
            )

    def worker_said(self, meta: KvtierWorkerMetadata) -> None:
        """Stored and removed keys reported by the workers."""
        for key in meta.stored:
            block = self._saving.pop(key, None)
            if block is not None and key not in self._announced:
                self._announce(key, block)
        for key in meta.not_stored:
            self._saving.pop(key, None)
        for key in meta.removed:
            self._remove(key)

    def looked_up(self, keys: list[int], tiers: list[str]) -> None:
        """A lookup of ``keys`` found the first ``len(tiers)`` in these tiers."""
        for key, tier in zip(keys, tiers, strict=False):
            block = self._announced.get(key)
            medium = KIND_MEDIUMS.get(self._kind_of(tier), "STORAGE")
            if block is not None and block.medium != medium:
                self._remove(key)
                block.medium = medium
                self._announce(key, block)
        if len(tiers) < len(keys):
            self._remove(keys[len(tiers)])

    def take(self) -> list[KVCacheEvent]:
        out, self._events = self._events, []
        return out

    def _announce(self, key: int, block: _Block) -> None:
        self._announced[key] = block
        while len(self._announced) > ANNOUNCED_LIMIT:
            self._announced.popitem(last=False)
        self._events.append(
            BlockStored(
                block_hashes=[maybe_convert_block_hash(block.block_hash)],
                parent_block_hash=maybe_convert_block_hash(block.parent) if block.parent is not None else None,
                token_ids=block.token_ids,
                block_size=self._block_size,
                lora_id=None,
                medium=block.medium,
                lora_name=block.lora_name,
                group_idx=0,
            )
        )

    def _remove(self, key: int) -> None:
        block = self._announced.pop(key, None)
        if block is not None:
            self._events.append(
                BlockRemoved(
                    block_hashes=[maybe_convert_block_hash(block.block_hash)],
                    medium=block.medium,
                    group_idx=0,
                )
            )
