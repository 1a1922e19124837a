"""Connections to the node daemon, one per namespace, that survive the
daemon going away: while it is down the connector works as if there were
no cache (one warning), and it connects again once the daemon answers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import kvtier
from kvtier.vllm.config import KvtierConfig, Shape, namespace_of

T = TypeVar("T")

# vLLM's logger when present (its format and level settings), else ours.
logger: Any
try:
    from vllm.logger import init_logger

    logger = init_logger(__name__)
except ImportError:  # pragma: no cover - kvtier without vLLM
    import logging

    logger = logging.getLogger(__name__)


class Clients:
    """Lazily connected :class:`kvtier.Client`s, one per tenant salt (each
    salt is its own namespace, so tenants never share blocks). Callable
    from several threads (the worker saves on its own)."""

    def __init__(self, config: KvtierConfig, shape: Shape, tp_rank: int, tp_size: int) -> None:
        self._config = config
        self._shape = shape
        self._tp = (tp_rank, tp_size)
        self._clients: dict[str | None, kvtier.Client] = {}
        self._down_since: float | None = None
        self._refused: str | None = None
        self._lock = threading.Lock()

    def call(self, salt: str | None, what: str, f: Callable[[kvtier.Client], T], default: T) -> T:
        """``f(client)``, or ``default`` while the daemon is down, refuses
        this engine, or the call fails (the failure is logged)."""
        with self._lock:
            client = self._client(salt)
        if client is None:
            return default
        try:
            return f(client)
        except kvtier.DaemonUnavailable as e:
            with self._lock:
                self._lost(e)
        except kvtier.KvtierError as e:
            logger.warning("kvtier %s failed: %s", what, e)
        return default

    def _client(self, salt: str | None) -> kvtier.Client | None:
        if self._refused is not None:
            return None
        c = self._clients.get(salt)
        if c is not None:
            return c
        if self._down_since is not None and time.monotonic() - self._down_since < self._config.reconnect_interval:
            return None
        ns = namespace_of(self._config, self._shape, salt, *self._tp)
        try:
            c = kvtier.Client(self._config.socket, **ns)
        except kvtier.DaemonUnavailable as e:
            self._lost(e)
            return None
        except kvtier.KvtierError as e:
            # A geometry the node does not hold: nothing will change that
            # while this engine runs.
            self._refused = str(e)
            logger.warning("kvtier refused this engine; running without it: %s", e)
            return None
        if self._down_since is not None:
            logger.info("kvtier daemon at %s is back", self._config.socket)
        self._down_since = None
        self._clients[salt] = c
        return c

    def _lost(self, e: Exception) -> None:
        if self._down_since is None:
            logger.warning(
                "kvtier daemon at %s unavailable (%s); running without the cache, retrying every %.0f s",
                self._config.socket,
                e,
                self._config.reconnect_interval,
            )
        self._clients.clear()
        self._down_since = time.monotonic()
