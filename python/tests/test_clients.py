"""``kvtier.clients.Clients``: connections that survive the daemon going
away, against a real daemon killed and restarted."""

from __future__ import annotations

from conftest import TinyDaemon

import kvtier
from kvtier.clients import Clients

# Longer than the test: a retry that waits out the interval never comes.
NEVER = 3600.0


def pool(d: TinyDaemon) -> tuple[Clients, list[str | None]]:
    """Clients over ``d`` and the log of connect attempts."""
    attempts: list[str | None] = []

    def connect(tenant: str | None) -> kvtier.Client:
        attempts.append(tenant)
        return d.client()

    return Clients(str(d.socket), NEVER, connect), attempts


def lookup(c: Clients) -> list[str] | None:
    return c.call(None, "lookup", lambda cl: cl.lookup([1]), None)


def test_a_broken_connection_is_replaced_on_the_next_call(daemon: TinyDaemon) -> None:
    clients, attempts = pool(daemon)
    assert lookup(clients) == []
    daemon.daemon.kill()
    daemon.daemon = daemon.daemon.restart()
    # The first call finds the old connection broken and answers uncached.
    assert lookup(clients) is None
    # The next one connects at once, without waiting out the interval: the
    # daemon may be back already, as here.
    assert lookup(clients) == []
    assert len(attempts) == 2


def test_a_failed_connect_waits_out_the_interval(daemon: TinyDaemon) -> None:
    clients, attempts = pool(daemon)
    assert lookup(clients) == []
    daemon.daemon.kill()
    assert lookup(clients) is None  # the connection broke
    assert lookup(clients) is None  # one connect attempt, refused
    assert len(attempts) == 2
    daemon.daemon = daemon.daemon.restart()
    # Back, but the interval after a failed connect has not passed.
    assert lookup(clients) is None
    assert len(attempts) == 2



def test_tier_kinds_are_the_nodes_once_connected(daemon: TinyDaemon) -> None:
    """``kind_of`` answers what the node announced to the last connection;
    before one, nothing is known."""
    clients, _ = pool(daemon)
    assert clients.kind_of("G2") == "unknown"
    assert lookup(clients) == []
    assert [clients.kind_of(t) for t in ("G2", "G3", "G4")] == ["memory", "disk", "unknown"]
