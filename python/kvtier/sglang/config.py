"""The backend's settings (``--hicache-storage-backend-extra-config``), the
kvtier key of an SGLang page key, and the tenant of a call."""

from __future__ import annotations

import hashlib
import string
from dataclasses import dataclass
from typing import Any

#: Keys SGLang itself reads from the extra config of a ``dynamic`` backend
#: (``backend_name``, ``module_path``, ``class_name``: which class to load;
#: ``interface_v1``: use the zero-copy ``batch_*_v1`` calls; ``tp_lcm_size``
#: is popped by SGLang before the backend sees the dict). They are allowed
#: beside this backend's own keys.
SGLANG_KEYS = frozenset({"backend_name", "module_path", "class_name", "interface_v1", "tp_lcm_size"})

_HEX = frozenset(string.hexdigits)


@dataclass(frozen=True)
class KvtierStorageConfig:
    """This backend's keys of the extra config, all optional."""

    socket: str = "kvtier-data/node.sock"
    """The node daemon's Unix socket."""
    instance: str | None = None
    """The metadata-service instance of the blocks (docs/meta-api.md §10)."""
    timeout: float = 10.0
    """Seconds to wait for each reply of the daemon."""
    reconnect_interval: float = 5.0
    """Seconds between attempts to reach a daemon that went away."""
    model: str | None = None
    """The model name of the namespace; default: SGLang's ``model_name``
    (the served model path, tagged by the host pool's format when it has
    one). Engines that should share pages must agree on it."""
    tenant_key: str = "cache_salt"
    """The key of a call's ``extra_info.extra_info`` dict that names its
    tenant: each value is its own namespace."""
    clear_keys: int = 65536
    """How many of the most recent pages this engine stored or loaded
    ``clear()`` can remove (the node has no per-namespace wipe, so the
    backend remembers the keys it saw)."""

    @staticmethod
    def from_extra(extra: dict[str, Any] | None) -> KvtierStorageConfig:
        """Reads the extra config; unknown keys are refused (``ValueError``),
        so a misspelt setting fails the start instead of being ignored."""
        extra = dict(extra or {})
        known = {"socket", "instance", "timeout", "reconnect_interval", "model", "tenant_key", "clear_keys"}
        unknown = sorted(set(extra) - known - SGLANG_KEYS)
        if unknown:
            raise ValueError(f"unknown kvtier storage settings {unknown}; known: {sorted(known)}")
        d = KvtierStorageConfig
        cfg = KvtierStorageConfig(
            socket=str(extra.get("socket", d.socket)),
            instance=None if extra.get("instance") is None else str(extra["instance"]),
            timeout=float(extra.get("timeout", d.timeout)),
            reconnect_interval=float(extra.get("reconnect_interval", d.reconnect_interval)),
            model=None if extra.get("model") is None else str(extra["model"]),
            tenant_key=str(extra.get("tenant_key", d.tenant_key)),
            clear_keys=int(extra.get("clear_keys", d.clear_keys)),
        )
        if cfg.timeout <= 0 or cfg.reconnect_interval < 0 or cfg.clear_keys < 0:
            raise ValueError("kvtier storage: timeout must be positive, reconnect_interval and clear_keys not negative")
        return cfg


def page_key(key: str) -> int:
    """The kvtier key (128 bits) of an SGLang page key.

    SGLang's page keys are hex SHA-256 digests chained over the prefix (and
    seeded by the request's ``extra_key`` and ``cache_salt``): their first
    32 hex digits (16 bytes) are the key. Any other string (a backend-side
    suffix, a short test key) is hashed with SHA-256 and its first 16 bytes
    taken, so distinct strings still get distinct keys.
    """
    if len(key) >= 32 and all(c in _HEX for c in key[:32]):
        return int(key[:32], 16)
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:16], "big")


def tenant_of(extra_info: Any, tenant_key: str) -> str | None:
    """The tenant named in a call's ``HiCacheStorageExtraInfo``, if any."""
    info = getattr(extra_info, "extra_info", None)
    if not isinstance(info, dict):
        return None
    salt = info.get(tenant_key)
    return None if salt is None else str(salt)
