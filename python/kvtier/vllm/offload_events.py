"""KV events of the offloading routes (``OffloadingConnector`` with
:class:`kvtier.vllm.offloading.KvtierOffloadingSpec`, and the secondary
tier :class:`kvtier.vllm.tier.KvtierTier`): vLLM ``OffloadingEvent``\\ s for
the blocks an engine put in the node, as the engine sees them move between
kvtier's tiers.

A block is announced (stored) on the medium of the tier it was seen in:
host memory (G2) is ``CPU``, the node's disk (G3) ``STORAGE`` and the
remote store (G4) remote ``STORAGE``. When a later lookup finds it on a
tier of another medium, the move is a removal from the old medium and a
store on the new one; a block a lookup no longer finds is removed.
"""

from __future__ import annotations

from collections import OrderedDict

from vllm.v1.kv_offload.base import Locality, Medium, OffloadingEvent, OffloadKey

#: vLLM's medium and locality of the blocks in each kvtier tier: host
#: memory (G2), the node's disk (G3), the remote store (G4).
TIER_MEDIUMS: dict[str, tuple[Medium, Locality]] = {
    "G2": (Medium.CPU, Locality.LOCAL),
    "G3": (Medium.STORAGE, Locality.LOCAL),
    "G4": (Medium.STORAGE, Locality.REMOTE),
}

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
        self._announced: OrderedDict[OffloadKey, str] = OrderedDict()

    @property
    def enabled(self) -> bool:
        """Whether events are kept."""
        return self._events is not None

    def saw(self, key: OffloadKey, tier: str | None, stored: bool = False) -> None:
        """What the node was seen to hold of ``key`` (``tier`` None: not
        held): stores are announced for blocks this engine stored
        (``stored``), moves between tiers and removals for blocks it
        announced."""
        if self._events is None:
            return
        old = self._announced.get(key)
        if tier is None:
            if old is not None:
                del self._announced[key]
                self._event(key, old, removed=True)
            return
        if old is None and not stored:
            return
        if old is not None and TIER_MEDIUMS.get(old) == TIER_MEDIUMS.get(tier):
            self._announced.move_to_end(key)
            return
        if old is not None:
            self._event(key, old, removed=True)
        self._announced[key] = tier
        self._announced.move_to_end(key)
        while len(self._announced) > ANNOUNCED_LIMIT:
            self._announced.popitem(last=False)
        self._event(key, tier, removed=False)

    def take(self) -> list[OffloadingEvent]:
        """The events since the last call."""
        if not self._events:
            return []
        out, self._events = self._events, []
        return out

    def _event(self, key: OffloadKey, tier: str, removed: bool) -> None:
        assert self._events is not None
        medium, locality = TIER_MEDIUMS.get(tier, (Medium.STORAGE, None))
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
