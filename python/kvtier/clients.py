"""Connections to the node daemon, one per tenant, that survive the daemon
going away: while it is down every call answers as if the node held
nothing (one warning). A connection that breaks is replaced on the next
call (the daemon may have restarted already); after a connect that fails,
the next try waits ``reconnect_interval`` seconds. The engines' connectors (``kvtier.vllm``,
``kvtier.sglang``) share it."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import kvtier

T = TypeVar("T")

logger = logging.getLogger(__name__)


class Clients:
    """Lazily connected :class:`kvtier.Client`s, one per tenant (``None``:
    requests without one). ``connect(tenant)`` makes one. Callable from
    several threads at once (an engine's forward, save, prefetch and backup
    threads).

    ``log`` is the engine's logger (its format and level settings), and
    ``uncached`` says in its warnings what the engine does meanwhile."""

    def __init__(
        self,
        socket: str,
        reconnect_interval: float,
        connect: Callable[[str | None], kvtier.Client],
        *,
        log: logging.Logger | None = None,
        uncached: str = "running without the cache",
    ) -> None:
        self._socket = socket
        self._interval = reconnect_interval
        self._connect = connect
        self._log = log or logger
        self._uncached = uncached
        self._clients: dict[str | None, kvtier.Client] = {}
        # When a connect last failed (None: the next call may connect).
        self._down_since: float | None = None
        # Down since the last warning (so that an outage warns once).
        self._down = False
        self._refused: str | None = None
        self._lock = threading.Lock()

    @property
    def refused(self) -> str | None:
        """Why the daemon refused this engine (its block shape), if it did."""
        return self._refused

    def tenants(self) -> list[str | None]:
        """Tenants with a live connection."""
        with self._lock:
            return list(self._clients)

    def call(self, tenant: str | None, what: str, f: Callable[[kvtier.Client], T], default: T) -> T:
        """``f(client)``, or ``default`` while the daemon is down, refuses this
        engine, or the call fails (the failure is logged)."""
        with self._lock:
            client = self._client(tenant)
        if client is None:
            return default
        try:
            return f(client)
        except kvtier.DaemonUnavailable as e:
            with self._lock:
                self._lost(e, retry_now=True)
        except kvtier.KvtierError as e:
            self._log.warning("kvtier %s failed: %s", what, e)
        return default

    def _client(self, tenant: str | None) -> kvtier.Client | None:
        if self._refused is not None:
            return None
        c = self._clients.get(tenant)
        if c is not None:
            return c
        if self._down_since is not None and time.monotonic() - self._down_since < self._interval:
            return None
        try:
            c = self._connect(tenant)
        except kvtier.DaemonUnavailable as e:
            self._lost(e, retry_now=False)
            return None
        except kvtier.KvtierError as e:
            # A block shape the node does not hold: nothing changes that
            # while this engine runs.
            self._refused = str(e)
            self._log.warning("kvtier refused this engine's blocks; %s: %s", self._uncached, e)
            return None
        if self._down:
            self._log.info("kvtier daemon at %s is back", self._socket)
        self._down = False
        self._down_since = None
        self._clients[tenant] = c
        return c

    def _lost(self, e: Exception, *, retry_now: bool) -> None:
        """Forgets every connection. ``retry_now``: a connection broke, so
        the next call connects at once (a restarted daemon is back within
        one call); otherwise a connect failed and the next waits out the
        interval."""
        if not self._down:
            self._log.warning(
                "kvtier daemon at %s unavailable (%s); %s, retrying every %g s",
                self._socket,
                e,
                self._uncached,
                self._interval,
            )
        self._down = True
        self._clients.clear()
        self._down_since = None if retry_now else time.monotonic()
