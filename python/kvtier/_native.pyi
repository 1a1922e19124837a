"""Type stubs of ``kvtier._native`` (the Rust half of the package)."""

from collections.abc import Sequence
from os import PathLike

from typing_extensions import Buffer

PROTOCOL_VERSION: str

class KvtierError(Exception):
    """A request the node daemon or the arena refused."""

class DaemonUnavailable(KvtierError):
    """The daemon cannot be reached, went away, or did not answer in time;
    the base of every error after which a client is unusable (connect
    again)."""

class ConnectionBroken(DaemonUnavailable):
    """The connection is unusable after a fatal error: the daemon broke the
    protocol, answered another request or with the wrong reply, refused in
    a way that closes the connection, or an earlier such error (or a
    timeout) left it broken. Connect again."""

class Client:
    """A connection to the node daemon for one namespace; thread-safe."""

    def __init__(
        self,
        socket: str | PathLike[str],
        *,
        model: str,
        dtype: str,
        layers: int,
        layer_bytes: int,
        block_size_tokens: int,
        layout_version: int = 1,
        tp_rank: int = 0,
        tp_size: int = 1,
        tenant_salt: bytes | None = None,
        instance: str | None = None,
        timeout: float = 10.0,
    ) -> None:
        """Connects; ``DaemonUnavailable`` when the daemon cannot be reached
        or an answer takes longer than ``timeout`` seconds, ``KvtierError``
        when it refuses this client (version, namespace, geometry). A first
        engine may wait longer than ``timeout`` for its answer while the
        daemon opens its node (a new disk tier is written through first):
        the daemon says so every second and each message restarts the wait."""
    @property
    def layers(self) -> int: ...
    @property
    def layer_bytes(self) -> int: ...
    @property
    def block_bytes(self) -> int: ...
    @property
    def session_id(self) -> int: ...
    @property
    def shm_name(self) -> str: ...
    @property
    def tiers(self) -> list[tuple[str, str]]:
        """The node's tiers, fastest first: ``(label, kind)`` pairs, e.g.
        ``[("G2", "memory"), ("G3", "disk")]``; kinds are ``"memory"``,
        ``"disk"``, ``"remote"``, ``"peer"`` (another node of the cluster,
        listed after the node's own tiers) and ``"device"``."""
    def lookup(self, keys: Sequence[int]) -> list[str]:
        """Tiers (labels of ``tiers``: ``"G2"``, ``"G3"`` ...) of the
        longest stored prefix."""
    def store_buffers(self, keys: Sequence[int], blocks: Sequence[Buffer]) -> list[str]:
        """Stores whole blocks; one outcome per block."""
    def store_layers(
        self,
        keys: Sequence[int],
        layers: Sequence[tuple[int, int]],
        block_ids: Sequence[int],
        block_stride: int,
    ) -> list[str]:
        """Stores blocks whose layers lie in per-layer buffers."""
    def load(self, keys: Sequence[int]) -> Load:
        """Pins the longest stored prefix in the arena for this client."""
    def remove(self, keys: Sequence[int]) -> None: ...
    def stats(self) -> dict[str, int]: ...

class Load:
    """Blocks pinned for one client; read as layers arrive, then release."""

    @property
    def prefix_len(self) -> int: ...
    def wait_layer(self, layer: int) -> None: ...
    def read_layer(
        self,
        layer: int,
        dst: tuple[int, int],
        block_ids: Sequence[int],
        block_stride: int,
    ) -> list[bool]:
        """Copies one layer of the first ``len(block_ids)`` blocks, verified."""
    def read_block(self, index: int, dst: Buffer) -> bool:
        """Copies one whole block, verified."""
    def release(self) -> None: ...

class HeadShards:
    """How a model's KV heads are cut into head shards: the objects a block
    is stored as, so that engines at any tensor-parallel size share it.

    Shard ``s`` holds heads ``[s * shard_heads, (s + 1) * shard_heads)`` of
    every layer. Clients storing shards connect with ``tp_rank=0,
    tp_size=1`` to a node whose ``layer_bytes`` is one shard's layer.
    """

    def __init__(self, kv_heads: int, shard_heads: int = 1) -> None: ...
    @staticmethod
    def for_tp_sizes(kv_heads: int, tp_sizes: Sequence[int]) -> HeadShards:
        """The largest shards every rank of each of ``tp_sizes`` holds whole."""
    @staticmethod
    def mla() -> HeadShards:
        """Latent attention: one shard that every rank holds (stored once)."""
    @property
    def kv_heads(self) -> int: ...
    @property
    def shard_heads(self) -> int: ...
    @property
    def count(self) -> int:
        """Shards per block."""
    def rank_heads(self, tp_rank: int, tp_size: int) -> range:
        """KV heads rank ``tp_rank`` of ``tp_size`` holds (replicated past ``kv_heads`` ranks)."""
    def for_rank(self, tp_rank: int, tp_size: int) -> range:
        """Shards rank ``tp_rank`` of ``tp_size`` stores and loads."""
    def key(self, block: int, shard: int) -> int:
        """Client key of one shard of the block the engine keys ``block``."""
    def all_keys(self, block_keys: Sequence[int]) -> list[int]:
        """Keys of every shard of each block, block-major (a scheduler's lookup)."""
    def rank_keys(self, block_keys: Sequence[int], tp_rank: int, tp_size: int) -> list[int]:
        """Keys of the rank's shards of each block, block-major."""
    def rank_block_ids(self, block_ids: Sequence[int], tp_rank: int, tp_size: int) -> list[int]:
        """Virtual block ids of the rank's shards, in ``rank_keys`` order:
        ``b * shards_per_rank + j``; use with ``block_stride`` = one shard's layer."""
    def blocks_in_prefix(self, prefix_len: int, tp_rank: int = 0, tp_size: int = 1) -> int:
        """Whole blocks in a stored prefix of ``prefix_len`` keys of ``rank_keys``."""
