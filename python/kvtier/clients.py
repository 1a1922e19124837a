"""Connections to the node daemon, one per tenant, that survive the daemon
going away or misbehaving: while it is down every call answers as if the
node held nothing (one warning for the whole outage, and an info line when
a call is served again).

Every error after which a connection is unusable (``kvtier.DaemonUnavailable``
and its subclass ``kvtier.ConnectionBroken``: the daemon gone, no answer in
time, a protocol violation, a refusal that closes the connection) drops the
connection. A connection that had served calls and breaks is replaced on the
next call (the daemon may have restarted already); after a connect that
fails, or a new connection that breaks before serving a call, the next try
waits ``reconnect_interval`` seconds, so a daemon that breaks every
connection costs one connect per interval, not one per call. The engines'
connectors (``kvtier.vllm``, ``kvtier.sglang``) share it."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import kvtier

T = TypeVar("T")

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class _Connection:
    """A tenant's client, and whether a call on it was answered."""

    client: kvtier.Client
    served: bool = False


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
        self._clients: dict[str | None, _Connection] = {}
        # When a connect last failed, or a new connection broke (None: the
        # next call may connect).
        self._down_since: float | None = None
        # Warned since a call was last served (so that an outage warns once).
        self._down = False
        self._refused: str | None = None
        # The node's tiers, label -> kind, as the last connection announced.
        self._kinds: dict[str, str] = {}
        self._lock = threading.Lock()

    @property
    def refused(self) -> str | None:
        """Why the daemon refused this engine (its block shape), if it did."""
        return self._refused

    def kind_of(self, tier: str) -> str:
        """What storage ``tier`` (a label ``lookup`` answered, ``"G2"`` ...)
        is on the node: ``"memory"``, ``"disk"``, ``"remote"`` or ``"peer"``
        (another node of the cluster holds it), as the
        node announced it (:attr:`kvtier.Client.tiers`) to the last
        connection; ``"unknown"`` for a tier no connection announced (one
        looked up before a restart that changed the node's tiers)."""
        return self._kinds.get(tier, "unknown")

    def tenants(self) -> list[str | None]:
        """Tenants with a live connection."""
        with self._lock:
            return list(self._clients)

    def call(self, tenant: str | None, what: str, f: Callable[[kvtier.Client], T], default: T) -> T:
        """``f(client)``, or ``default`` while the daemon is down, refuses this
        engine, or the call fails (the failure is logged). A call that
        leaves the connection unusable (``kvtier.DaemonUnavailable``) drops
        it; the next call connects again."""
        with self._lock:
            conn = self._connection(tenant)
        if conn is None:
            return default
        try:
            result = f(conn.client)
        except kvtier.DaemonUnavailable as e:
            with self._lock:
                self._broke(tenant, conn, e)
            return default
        except kvtier.KvtierError as e:
            # Refused, but answered: the connection works.
            self._log.warning("kvtier %s failed: %s", what, e)
            self._served(conn)
            return default
        self._served(conn)
        return result

    def _connection(self, tenant: str | None) -> _Connection | None:
        if self._refused is not None:
            return None
        conn = self._clients.get(tenant)
        if conn is not None:
            return conn
        if self._down_since is not None and time.monotonic() - self._down_since < self._interval:
            return None
        try:
            client = self._connect(tenant)
        except kvtier.DaemonUnavailable as e:
            self._lost(e, retry_now=False)
            return None
        except kvtier.KvtierError as e:
            # A block shape the node does not hold: nothing changes that
            # while this engine runs.
            self._refused = str(e)
            self._log.warning("kvtier refused this engine's blocks; %s: %s", self._uncached, e)
            return None
        self._down_since = None
        self._kinds = dict(client.tiers)
        conn = _Connection(client)
        self._clients[tenant] = conn
        return conn

    def _served(self, conn: _Connection) -> None:
        """Notes that the daemon answered a call on ``conn``."""
        if conn.served:
            return
        with self._lock:
            conn.served = True
            if self._down:
                self._log.info("kvtier daemon at %s is back", self._socket)
                self._down = False

    def _broke(self, tenant: str | None, conn: _Connection, e: kvtier.DaemonUnavailable) -> None:
        """``conn`` is unusable after ``e``. A connection that had served
        calls is replaced at once; one that broke before serving any counts
        as a failed connect (the next one would likely break the same
        way)."""
        if self._clients.get(tenant) is not conn:
            # Already dropped: another call on it failed first.
            return
        self._lost(e, retry_now=conn.served)

    def _lost(self, e: Exception, *, retry_now: bool) -> None:
        """Forgets every connection (the daemon restarted or misbehaves:
        the others are likely broken too). ``retry_now``: the next call
        connects at once (a restarted daemon is back within one call);
        otherwise it waits out the interval."""
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
