"""KV events of the offloading routes (``OffloadingConnector`` with
:class:`kvtier.vllm.offloading.KvtierOffloadingSpec`, and the secondary
tier :class:`kvtier.vllm.tier.KvtierTier`): vLLM ``OffloadingEvent``\\ s for
the blocks an engine put in the node, as the engine sees them move between
kvtier's tiers.

A block is announced (stored) on the medium of the kind of tier it was
seen in (the node says each tier's kind): host memory (G2) is ``CPU``,
the node's disk (G3 by default) ``STORAGE``, a remote store (G4 by
default) remote ``STORAGE`` and another node of the cluster (the peer
tier, after the node's own) remote ``CPU``. When a later lookup finds it on a tier of
another medium, the move is a removal from the old medium and a store on
the new one; a block a lookup no longer finds is removed.
"""

from __future__ import annotations

from collections import OrderedDict

from vllm.v1.kv_offload.base import Locality, Medium, OffloadingEvent, OffloadKey

#: vLLM's medium and locality of the blocks in each kind of kvtier tier:
#: host memory, the node's disk, a remote store, another node (whose copy
#: a fetch lands in this node's host memory).
KIND_MEDIUMS: dict[str, tuple[Medium, Locality]] = {
    "memory": (Medium.CPU, Locality.LOCAL),
    "disk": (Medium.STORAGE, Locality.LOCAL),
    "remote": (Medium.STORAGE, Locality.REMOTE),
    "peer": (Medium.CPU, Locality.REMOTE),
}

#: Where a block of a tier of no known kind is said to be.
_ELSEWHERE: tuple[Medium, Locality | None] = (Medium.STORAGE, None)

#: Blocks whose ``BlockStored`` a log remembers (oldest forgotten).
ANNOUNCED_LIMIT = 1 << 18


class TierEvents:
    """The events of the blocks one engine announced; ``enabled`` False
    keeps nothing (vLLM drains events only when KV events are on).

    ``ownership`` is the ``OffloadingEvent.ownership`` of every event: a
    secondary tier sets it so that its ``CPU`` residencies are not mistaken
    for the primary tier's."""

    def __init__(self, enabled: bool, ownership: str | None = None) -> None:
        self._events: list[OffloadingEvent] | None = [] if enabled else None
        self._ownership = ownership
        # Where each announced block was said to be: (medium, locality).
        self._announced: OrderedDict[OffloadKey, tuple[Medium, Locality | None]] = OrderedDict()

    @property
    def enabled(self) -> bool:
        """Whether events are kept."""
        return self._events is not None

    def saw(self, key: OffloadKey, kind: str | None, stored: bool = False) -> None:
        """What the node was seen to hold of ``key``: the kind of tier it is
        in (``"memory"``, ``"disk"``, ``"remote"``, ``"peer"``; None: not
        held). Stores
        are announced for blocks this engine stored (``stored``), moves
        between media and removals for blocks it announced."""
        if self._events is None:
            return
        old = self._announced.get(key)
        if kind is None:
            if old is not None:
                del self._announced[key]
                self._event(key, old, removed=True)
            return
        if old is None and not stored:
            return
        where = KIND_MEDIUMS.get(kind, _ELSEWHERE)
        if old == where:
            self._announced.move_to_end(key)
            return
        if old is not None:
            self._event(key, old, removed=True)
        self._announced[key] = where
        self._announced.move_to_end(key)
        while len(self._announced) > ANNOUNCED_LIMIT:
            self._announced.popitem(last=False)
        self._event(key, where, removed=False)

    def take(self) -> list[OffloadingEvent]:
        """The events since the last call."""
        if not self._events:
            return []
        out, self._events = self._events, []
        return out

    def _event(self, key: OffloadKey, where: tuple[Medium, Locality | None], removed: bool) -> None:
        assert self._events is not None
        medium, locality = where
        self._events.append(
            OffloadingEvent(
                keys=[key],
                medium=medium,
                removed=removed,
                locality=locality,
                ownership=self._ownership,
                removal_expected=True,
            )
        )
