"""vLLM's KV-cache groups as the connector stores them (docs/vllm.md,
"Hybrid models").

With vLLM's hybrid KV cache manager a model whose layers differ in what
they keep (full attention beside sliding-window attention, as gpt-oss,
Gemma 2 and Gemma 3 have) has several KV-cache groups. Each group has its
own layers and its own vLLM block per token block: the same block hash
names one block of every group, with different bytes. A sliding-window
group drops the blocks that have left its window (vLLM puts its null block
in their place), so it holds, and needs, only the last window's blocks of a
prefix.

kvtier stores each group in a namespace of its own (the group's index is in
the layout string, so keys never collide across groups), with the daemon's
one block shape: the largest group's layers (vLLM pads groups to one size;
a smaller group's store repeats its last layer in the padding) of vLLM's
page bytes, which vLLM makes the same for every group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec

#: vLLM's null block: the block a group holds in place of one it dropped
#: (the block pool's first block, never handed to a request).
NULL_BLOCK_ID = 0


@dataclass(frozen=True)
class Group:
    """One KV-cache group: its layers, and how much of a prefix it keeps."""

    index: int
    layer_names: tuple[str, ...]
    window: int | None
    """Tokens of a sliding window; ``None`` for full attention."""
    retained: int = 0
    """Tokens vLLM keeps behind the window (``extra_retained_tokens``)."""

    def first_needed(self, end: int, block_size: int) -> int:
        """The first block vLLM keeps for attention once ``end`` blocks are
        computed (vLLM's ``get_num_skipped_tokens``): 0 for full attention,
        the window's first block for a sliding window."""
        if self.window is None:
            return 0
        skipped = max(0, end * block_size - self.window + 1 - self.retained)
        return min(skipped // block_size, end)

    def describe(self) -> str:
        """The group in a log line: its kind and layer count."""
        kind = "full attention" if self.window is None else f"sliding window of {self.window} tokens"
        return f"{kind}: {len(self.layer_names)} layers"


def groups_of(kv_cache_config: KVCacheConfig) -> tuple[list[Group], str | None]:
    """The engine's groups, and why kvtier cannot serve them (``None`` when
    it can): every group must be full or sliding-window attention with the
    same page bytes."""
    groups: list[Group] = []
    pages: set[int] = set()
    for i, g in enumerate(kv_cache_config.kv_cache_groups):
        spec = g.kv_cache_spec
        window, why = _window_of(spec)
        if why is not None:
            return [], f"KV-cache group {i} is {why}"
        groups.append(Group(i, tuple(g.layer_names), window, int(getattr(spec, "extra_retained_tokens", 0) or 0)))
        pages.add(spec.page_size_bytes)
    if len(pages) > 1:
        return [], f"the KV-cache groups' pages differ in size ({sorted(pages)} bytes)"
    return groups, None


def _window_of(spec: KVCacheSpec) -> tuple[int | None, str | None]:
    """(sliding window, None) for a group kvtier serves; (None, what it is)
    for one it does not."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, RSWASpec, SlidingWindowSpec

    if isinstance(spec, SlidingWindowSpec):
        return spec.sliding_window, None
    # RSWA drops the middle of a prefix: neither a prefix nor a window.
    if isinstance(spec, FullAttentionSpec) and not isinstance(spec, RSWASpec):
        return None, None
    return None, f"{type(spec).__name__} (state or local attention, not a prefix of token blocks)"


def primary(groups: list[Group]) -> int:
    """The group whose stores stand for the block in KV events and tiers:
    the first full-attention group (it holds every block of a prefix)."""
    return next((g.index for g in groups if g.window is None), 0)
