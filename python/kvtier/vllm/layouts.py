"""How vLLM's blocks map onto the objects the node stores.

Two layouts (docs/vllm.md, "Tensor parallelism"):

- *rank blocks* (the default): each TP rank stores its own block of each
  vLLM block, in a namespace of its rank; only an engine of the same TP
  size reuses it.
- *head shards* (``shard_heads`` set): every block is stored as
  ``kv_heads / shard_heads`` objects of ``shard_heads`` KV heads each, in a
  namespace of no rank (docs/block-identity.md, head shards). A rank stores
  and loads the shards of its own heads, so an engine at any TP size whose
  ranks hold whole shards reuses them; ranks that hold the same heads
  (replicated KV heads) store each shard once.

Either way a rank's objects of one block lie side by side in its paged
buffer (vLLM's CPU layout keeps a block's heads contiguous per layer), so a
list of ``per_block`` objects per block is copied with one block stride:
object ``j`` of vLLM block ``b`` is "virtual block" ``b * per_block + j`` of
``object_bytes``.
"""

from __future__ import annotations

import kvtier

def distance(tier: str) -> int:
    """How far a tier is: the nearer, the smaller. The node orders its
    tiers nearest first, so a tier's label (``"G2"``, ``"G3"`` ...) is its
    distance; a block is as far away as its farthest object."""
    return int(tier.removeprefix("G"))


class RankBlocks:
    """Rank blocks: one stored object per vLLM block and rank."""

    per_block = 1
    """Objects of one vLLM block that this rank stores and loads."""
    rank_free = False
    """Whether the namespace leaves the TP rank and size out."""

    def lookup_keys(self, keys: list[int]) -> list[int]:
        """The objects whose presence makes each block a hit (any rank's)."""
        return keys

    def lookup_blocks(self, keys: list[int], tiers: list[str]) -> list[str]:
        """The tier of each leading block whose objects are all stored,
        from the tiers of the longest stored prefix of
        ``lookup_keys(keys)``."""
        return tiers

    def rank_keys(self, keys: list[int]) -> list[int]:
        """This rank's objects of each block, block by block."""
        return keys

    def rank_ids(self, block_ids: list[int]) -> list[int]:
        """The virtual block id of each of ``rank_keys``' objects."""
        return block_ids

    def blocks_of(self, objects: int) -> int:
        """Whole blocks among the first ``objects`` of ``rank_keys``."""
        return objects // self.per_block


class HeadShardBlocks(RankBlocks):
    """Head shards: ``shards.count()`` objects per block, this rank's
    ``per_block`` of them side by side in its buffer."""

    rank_free = True

    def __init__(self, shards: kvtier.HeadShards, tp_rank: int, tp_size: int) -> None:
        self._shards = shards
        self._rank = (tp_rank, tp_size)
        self.per_block = len(shards.for_rank(tp_rank, tp_size))

    def lookup_keys(self, keys: list[int]) -> list[int]:
        return self._shards.all_keys(keys)

    def lookup_blocks(self, keys: list[int], tiers: list[str]) -> list[str]:
        n = self._shards.count
        whole = self._shards.blocks_in_prefix(len(tiers))
        return [max(tiers[b * n : (b + 1) * n], key=distance) for b in range(whole)]

    def rank_keys(self, keys: list[int]) -> list[int]:
        return self._shards.rank_keys(keys, *self._rank)

    def rank_ids(self, block_ids: list[int]) -> list[int]:
        return self._shards.rank_block_ids(block_ids, *self._rank)

    def blocks_of(self, objects: int) -> int:
        return self._shards.blocks_in_prefix(objects, *self._rank)
