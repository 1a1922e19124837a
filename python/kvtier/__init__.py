"""kvtier: KV-cache tiering for LLM serving engines.

This package is the engine side of a kvtier node: a :class:`Client` talks to
the node daemon (``kvtier serve``) over its Unix socket and moves block bytes
through the daemon's shared-memory arena. Copies between engine memory and
the arena run in Rust with the GIL released, layer by layer, with the
checksums computed in the same pass; every block read back is verified
before it is served, and a block that fails is reported as a miss.

Blocks meant to be shared across tensor-parallel sizes are stored as head
shards: :class:`HeadShards` gives each rank its shard keys and where they lie
in its memory.

Engine memory is named by ``(address, nbytes)`` pairs; :func:`region` makes
one from a contiguous CPU tensor (or anything with ``data_ptr()``,
``numel()`` and ``element_size()``).
"""

from __future__ import annotations

from typing import Any

from kvtier._native import (
    PROTOCOL_VERSION,
    Client,
    ConnectionBroken,
    DaemonUnavailable,
    HeadShards,
    KvtierError,
    Load,
)

__all__ = [
    "PROTOCOL_VERSION",
    "Client",
    "ConnectionBroken",
    "DaemonUnavailable",
    "HeadShards",
    "KvtierError",
    "Load",
    "region",
]


def region(tensor: Any) -> tuple[int, int]:
    """``(address, nbytes)`` of a contiguous CPU tensor's memory.

    Raises ``ValueError`` for a tensor that is not contiguous or not in host
    memory: the daemon's arena is host memory, and a strided view would put
    blocks where the engine does not read them.
    """
    device = getattr(tensor, "device", None)
    if device is not None and getattr(device, "type", "cpu") != "cpu":
        raise ValueError(f"tensor on {device}; kvtier copies host memory only")
    if hasattr(tensor, "is_contiguous") and not tensor.is_contiguous():
        raise ValueError("tensor is not contiguous")
    return int(tensor.data_ptr()), int(tensor.numel()) * int(tensor.element_size())
