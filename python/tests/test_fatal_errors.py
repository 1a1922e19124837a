"""Every error after which a connection is unusable (``ClientError::is_fatal``)
reaches Python as ``kvtier.DaemonUnavailable`` (``ConnectionBroken`` for
those where the daemon is still there), and ``kvtier.clients.Clients``
drops the connection, warns once and connects again.

The errors are real: a man in the middle (``mitm.Proxy``) in front of a
real daemon spoils one request, so that the daemon itself refuses it or
answers another id or type, or spoils the daemon's reply.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import mitm
import pytest
from conftest import TinyDaemon, start_tiny

import kvtier
from kvtier.clients import Clients

# Longer than the test: a retry that waits out the interval never comes.
NEVER = 3600.0
# The client's timeout where no reply is the fault (seconds to wait).
SHORT = 1.5
# Where a reply comes: ample for a loaded machine.
LONG = 30.0


@dataclass(frozen=True)
class Case:
    """A fault, the exception it raises and the one a later call on the
    same client raises."""

    fault: mitm.Fault
    raises: type[kvtier.DaemonUnavailable]
    message: str
    then: type[kvtier.DaemonUnavailable] = kvtier.ConnectionBroken
    then_message: str = "unusable after an earlier error"
    timeout: float = LONG


CLOSED = "the node daemon closed the connection"

FATAL = {
    "disconnected before the reply": Case(
        mitm.CLOSE_BEFORE_REPLY, kvtier.DaemonUnavailable, CLOSED, kvtier.DaemonUnavailable, CLOSED
    ),
    "disconnected inside the reply": Case(
        mitm.CLOSE_INSIDE_REPLY, kvtier.DaemonUnavailable, CLOSED, kvtier.DaemonUnavailable, CLOSED
    ),
    "timeout": Case(mitm.NO_REPLY, kvtier.DaemonUnavailable, "no answer from the node daemon", timeout=SHORT),
    "protocol: unknown type": Case(mitm.UNKNOWN_REPLY_TYPE, kvtier.ConnectionBroken, "sent an invalid frame"),
    "protocol: truncated": Case(mitm.TRUNCATED_REPLY, kvtier.ConnectionBroken, "sent an invalid frame"),
    "wrong request id": Case(
        mitm.OTHER_REQUEST_ID, kvtier.ConnectionBroken, r"answered request \d+ while request \d+ was in flight"
    ),
    "unexpected reply": Case(
        mitm.REPLY_OF_ANOTHER_TYPE, kvtier.ConnectionBroken, "unexpected message from the node daemon"
    ),
    "refused: BAD_FRAME": Case(mitm.UNDECODABLE_REQUEST, kvtier.ConnectionBroken, r"refused the request \(BAD_FRAME"),
    "refused: HANDSHAKE": Case(mitm.SECOND_HELLO, kvtier.ConnectionBroken, r"refused the request \(HANDSHAKE"),
}


@pytest.fixture
def proxy(daemon: TinyDaemon, tmp_path: Path) -> Iterator[mitm.Proxy]:
    p = mitm.Proxy(tmp_path / "mitm.sock", daemon.socket)
    yield p
    p.close()


@pytest.fixture(params=list(FATAL), ids=list(FATAL))
def case(request: pytest.FixtureRequest) -> Case:
    return FATAL[request.param]


def pool(
    d: TinyDaemon, proxy: mitm.Proxy, interval: float = NEVER, timeout: float = LONG
) -> tuple[Clients, list[kvtier.Client]]:
    """Clients through ``proxy``, and every client they connected."""
    made: list[kvtier.Client] = []

    def connect(tenant: str | None) -> kvtier.Client:
        c = d.client(socket=proxy.path, timeout=timeout)
        made.append(c)
        return c

    return Clients(str(proxy.path), interval, connect), made


def lookup(c: Clients) -> list[str] | None:
    return c.call(None, "lookup", lambda cl: cl.lookup([1]), None)


def messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


def test_a_fatal_error_raises_daemon_unavailable_and_breaks_the_connection(
    daemon: TinyDaemon, proxy: mitm.Proxy, case: Case
) -> None:
    c = daemon.client(socket=proxy.path, timeout=case.timeout)
    assert c.lookup([1]) == []
    proxy.arm(case.fault)
    with pytest.raises(kvtier.DaemonUnavailable, match=case.message) as first:
        c.lookup([1])
    assert type(first.value) is case.raises
    # Broken for good: the next call fails at once, without a request.
    sent = proxy.requests
    with pytest.raises(kvtier.DaemonUnavailable, match=case.then_message) as then:
        c.lookup([1])
    assert type(then.value) is case.then
    assert proxy.requests == sent
    # Another connection is served.
    assert daemon.client(socket=proxy.path).lookup([1]) == []
    assert proxy.faulted == 1


def test_clients_reconnect_after_a_fatal_error_with_one_warning(
    daemon: TinyDaemon, proxy: mitm.Proxy, case: Case, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kvtier.clients")
    clients, made = pool(daemon, proxy, timeout=case.timeout)
    assert lookup(clients) == []
    proxy.arm(case.fault)
    # The call that breaks the connection answers uncached...
    assert lookup(clients) is None
    assert clients.tenants() == []
    # ... and the next connects again at once (the interval is NEVER) and is served.
    assert lookup(clients) == []
    assert lookup(clients) == []
    assert len(made) == proxy.connections == 2
    assert made[0].session_id != made[1].session_id
    [warning] = messages(caplog, logging.WARNING)
    assert "unavailable" in warning and re.search(case.message, warning)
    assert any("is back" in m for m in messages(caplog, logging.INFO))


def test_a_connection_broken_outside_clients_is_replaced_on_its_next_call(
    daemon: TinyDaemon, proxy: mitm.Proxy, caplog: pytest.LogCaptureFixture
) -> None:
    """A connector's load handles its own errors (``kvtier.vllm``): the
    connection it broke fails its next call in ``Clients`` (``Broken``),
    which replaces it."""
    caplog.set_level(logging.INFO, logger="kvtier.clients")
    clients, made = pool(daemon, proxy)
    assert lookup(clients) == []
    proxy.arm(mitm.UNKNOWN_REPLY_TYPE)
    handled: list[kvtier.KvtierError] = []

    def load(c: kvtier.Client) -> str:
        try:
            c.lookup([1])
        except kvtier.KvtierError as e:
            handled.append(e)
        return "handled"

    assert clients.call(None, "load", load, None) == "handled"
    assert [type(e) for e in handled] == [kvtier.ConnectionBroken]
    assert len(made) == 1
    assert lookup(clients) is None
    [warning] = messages(caplog, logging.WARNING)
    assert "unusable after an earlier error" in warning
    assert lookup(clients) == []
    assert len(made) == 2


def test_a_daemon_that_breaks_every_connection_costs_one_warning_and_one_connect_per_interval(
    daemon: TinyDaemon, proxy: mitm.Proxy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kvtier.clients")
    clients, made = pool(daemon, proxy)
    assert lookup(clients) == []
    proxy.arm(mitm.UNKNOWN_REPLY_TYPE, times=None)
    # A connection that served calls breaks: connect again at once.
    assert lookup(clients) is None
    # The new one breaks on its first call: a failed connect, so the next
    # try waits out the interval.
    assert lookup(clients) is None
    for _ in range(3):
        assert lookup(clients) is None
    assert len(made) == 2
    assert proxy.faulted == 2
    assert len(messages(caplog, logging.WARNING)) == 1


def test_with_no_interval_every_call_connects_again_and_warns_once(
    daemon: TinyDaemon, proxy: mitm.Proxy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kvtier.clients")
    clients, made = pool(daemon, proxy, interval=0.0)
    assert lookup(clients) == []
    proxy.arm(mitm.OTHER_REQUEST_ID, times=None)
    for _ in range(5):
        assert lookup(clients) is None
    assert len(made) == 5
    assert proxy.faulted == 5
    assert len(messages(caplog, logging.WARNING)) == 1
    assert not any("is back" in m for m in messages(caplog, logging.INFO))
    proxy.disarm()
    assert lookup(clients) == []
    assert len(made) == 6
    assert [m for m in messages(caplog, logging.INFO) if "is back" in m] == [
        f"kvtier daemon at {proxy.path} is back"
    ]


def test_a_refusal_that_keeps_the_connection_keeps_it(
    daemon: TinyDaemon, proxy: mitm.Proxy, caplog: pytest.LogCaptureFixture
) -> None:
    """``Refused`` with ``UNEXPECTED`` (the daemon keeps the connection) is
    a plain ``KvtierError``: the client stays usable, and ``Clients`` keeps
    it."""
    c = daemon.client(socket=proxy.path)
    proxy.arm(mitm.REQUEST_AS_A_REPLY)
    with pytest.raises(kvtier.KvtierError, match=r"refused the request \(UNEXPECTED") as refused:
        c.lookup([1])
    assert not isinstance(refused.value, kvtier.DaemonUnavailable)
    assert c.lookup([1]) == []

    caplog.set_level(logging.INFO, logger="kvtier.clients")
    clients, made = pool(daemon, proxy)
    assert lookup(clients) == []
    proxy.arm(mitm.REQUEST_AS_A_REPLY, times=2)
    assert lookup(clients) is None
    assert lookup(clients) is None
    assert lookup(clients) == []
    assert len(made) == 1
    warnings = messages(caplog, logging.WARNING)
    assert len(warnings) == 2 and all("kvtier lookup failed" in w and "UNEXPECTED" in w for w in warnings)


def test_a_refused_handshake_is_not_retried(daemon: TinyDaemon, proxy: mitm.Proxy) -> None:
    """A refusal of ``Hello`` closes the connection (fatal for the client
    crate) but is a ``KvtierError``: connecting again would be refused the
    same way, so ``Clients`` stops trying."""
    with pytest.raises(kvtier.KvtierError, match="GEOMETRY_MISMATCH") as refused:
        daemon.client(socket=proxy.path, layers=3)
    assert not isinstance(refused.value, kvtier.DaemonUnavailable)

    attempts: list[str | None] = []

    def connect(tenant: str | None) -> kvtier.Client:
        attempts.append(tenant)
        return daemon.client(socket=proxy.path, layers=3)

    clients = Clients(str(proxy.path), 0.0, connect)
    for _ in range(3):
        assert lookup(clients) is None
    assert attempts == [None]
    assert clients.refused is not None and "GEOMETRY_MISMATCH" in clients.refused


def test_a_daemon_at_its_connection_cap_is_retried_not_refused_for_good(tmp_path: Path) -> None:
    """``BUSY`` (the daemon is at ``manager.max_connections``) refuses the
    handshake like a geometry mismatch, but it passes: ``Client(...)``
    raises ``DaemonUnavailable``, and ``Clients`` warns once and connects
    again after its interval, once a connection is free."""
    d = start_tiny(tmp_path / "data", KVTIER_MANAGER__MAX_CONNECTIONS="1")
    try:
        first = d.client()
        with pytest.raises(kvtier.DaemonUnavailable, match="BUSY"):
            d.client()
        clients = Clients(str(d.socket), 0.0, lambda tenant: d.client())
        assert lookup(clients) is None
        assert clients.refused is None, "BUSY is not a refusal for good"
        del first  # closes its connection; the daemon notices in its own time
        deadline = time.monotonic() + LONG
        while lookup(clients) is None:
            assert time.monotonic() < deadline, "no connection freed"
        assert clients.refused is None
    finally:
        d.stop()
