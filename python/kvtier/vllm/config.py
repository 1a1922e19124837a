"""The connector's settings (``kv_connector_extra_config``) and the
namespace its blocks live in."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class KvtierConfig:
    """``kv_connector_extra_config`` keys, all optional."""

    socket: str = "kvtier-data/node.sock"
    """The node daemon's Unix socket."""
    instance: str | None = None
    """The metadata-service instance of the blocks (docs/meta-api.md §10)."""
    timeout: float = 10.0
    """Seconds to wait for each reply of the daemon."""
    reconnect_interval: float = 5.0
    """Seconds between attempts to reach a daemon that went away."""
    shard_heads: int | None = None
    """KV heads per stored object: set, blocks are stored as head shards
    that engines of any TP size reuse (docs/vllm.md, "Tensor
    parallelism"); unset, each rank stores its own blocks."""

    @staticmethod
    def from_extra(extra: dict[str, Any] | None) -> KvtierConfig:
        extra = dict(extra or {})
        known = {"socket", "instance", "timeout", "reconnect_interval", "shard_heads"}
        unknown = sorted(set(extra) - known)
        if unknown:
            raise ValueError(f"unknown kvtier connector settings {unknown}; known: {sorted(known)}")
        return KvtierConfig(
            socket=str(extra.get("socket", KvtierConfig.socket)),
            instance=extra.get("instance"),
            timeout=float(extra.get("timeout", KvtierConfig.timeout)),
            reconnect_interval=float(extra.get("reconnect_interval", KvtierConfig.reconnect_interval)),
            shard_heads=_positive_int(extra, "shard_heads"),
        )


def _positive_int(extra: dict[str, Any], name: str) -> int | None:
    value = extra.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"kvtier connector setting {name} must be a positive integer, not {value!r}")
    return value


@dataclass(frozen=True)
class Shape:
    """What identifies vLLM's KV blocks beyond their hashes."""

    model: str
    dtype: str
    layout: str
    """vLLM version, platform and the KV spec: block bytes written by
    another layout are foreign."""
    block_size: int
    layers: int
    layer_bytes: int


def namespace_of(config: KvtierConfig, shape: Shape, salt: str | None, tp_rank: int, tp_size: int) -> dict[str, Any]:
    """The keyword arguments of :class:`kvtier.Client` for one tenant."""
    return dict(
        model=shape.model,
        dtype=shape.dtype,
        layout_version=zlib.crc32(shape.layout.encode()),
        block_size_tokens=shape.block_size,
        tp_rank=tp_rank,
        tp_size=tp_size,
        tenant_salt=salt.encode() if salt is not None else None,
        layers=shape.layers,
        layer_bytes=shape.layer_bytes,
        instance=config.instance,
        timeout=config.timeout,
    )


def block_key(block_hash: bytes | int) -> int:
    """A kvtier key (128 bits) from a vLLM block hash (bytes, or an int in
    older versions)."""
    if isinstance(block_hash, int):
        return block_hash & ((1 << 128) - 1)
    return int.from_bytes(bytes(block_hash)[:16], "little")
