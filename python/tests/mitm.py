"""A man in the middle between clients and a real ``kvtier serve``, to make
the daemon's side of a connection fail in chosen ways.

The proxy listens on a Unix socket of its own, connects each client it
accepts to the daemon's socket, and relays the node protocol's frames both
ways (docs/node-protocol.md §1: a ``u32`` little-endian length, then the
type byte and the body). A :class:`Fault` armed with :meth:`Proxy.arm`
rewrites the next request a client sends after its ``Hello`` (so that the
daemon itself answers something else: a refusal, a reply of another type
or to another request id) or the daemon's reply to it (so that the client
gets a frame the daemon never sends, part of one, or nothing). Everything
else is the daemon's own bytes, so the proxy follows the protocol's
versions without knowing them: it relies only on the frame header, on
requests and replies beginning with their ``u64`` request id, and on a few
type codes (§3).

One request at a time per connection (the blocking client's way): the
reply a fault rewrites is the first frame the daemon sends after the
faulted request.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

#: Message types (docs/node-protocol.md §3).
LOOKUP = 0x10
REMOVE = 0x1B
ACK = 0x1E
#: A type byte no version of the protocol uses.
UNKNOWN_TYPE = 0xEE

_HEADER = struct.Struct("<IB")


def frame(ftype: int, body: bytes) -> bytes:
    """The bytes of a frame of type ``ftype``."""
    return _HEADER.pack(len(body) + 1, ftype) + body


@dataclass(frozen=True)
class Frame:
    """One frame as it came: its type, its body and its bytes."""

    type: int
    body: bytes

    @property
    def raw(self) -> bytes:
        return frame(self.type, self.body)


@dataclass(frozen=True)
class Reply:
    """What the client gets instead of the daemon's reply: ``data`` (the
    reply rewritten, part of it, or nothing), then, with ``close``, the end
    of the connection."""

    data: bytes
    close: bool = False


@dataclass(frozen=True)
class Fault:
    """How to spoil one request: ``request(frame, hello)`` rewrites the
    request (``hello`` is the connection's ``Hello``) into the bytes the
    daemon gets, and ``reply(frame)`` says what the client gets for the
    daemon's reply. Either may be ``None``: passed as it is."""

    request: Callable[[Frame, Frame], bytes] | None = None
    reply: Callable[[Frame], Reply] | None = None


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    """``n`` bytes, or ``None`` if the stream ends (or fails) first."""
    out = bytearray()
    while len(out) < n:
        try:
            chunk = sock.recv(n - len(out))
        except OSError:
            return None
        if not chunk:
            return None
        out += chunk
    return bytes(out)


def _read_frame(sock: socket.socket) -> Frame | None:
    header = _recv_exact(sock, _HEADER.size)
    if header is None:
        return None
    length, ftype = _HEADER.unpack(header)
    body = _recv_exact(sock, length - 1) if length > 1 else b""
    if body is None:
        return None
    return Frame(ftype, body)


def _shut(*socks: socket.socket) -> None:
    """Ends both directions of each socket (waking any thread reading it)."""
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


@dataclass
class _Link:
    """One client's connection and its connection to the daemon."""

    client: socket.socket
    daemon: socket.socket
    # Faults of requests sent on and not yet answered, oldest first.
    pending: deque[Fault] = field(default_factory=deque)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Proxy:
    """Relays connections at ``path`` to the daemon's socket ``upstream``;
    :meth:`close` it."""

    def __init__(self, path: Path, upstream: Path) -> None:
        self.path = path
        self._upstream = upstream
        self._lock = threading.Lock()
        self._fault: Fault | None = None
        self._times: int | None = 0
        self._links: list[_Link] = []
        self._threads: list[threading.Thread] = []
        self.connections = 0
        """Clients accepted so far."""
        self.requests = 0
        """Requests relayed so far (``Hello``s not counted)."""
        self.faulted = 0
        """Requests spoilt so far."""
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen()
        self._start(self._accept)

    def arm(self, fault: Fault, times: int | None = 1) -> None:
        """Spoils the next ``times`` requests of any connection (``None``:
        every one until :meth:`disarm`)."""
        with self._lock:
            self._fault = fault
            self._times = times

    def disarm(self) -> None:
        """Relays everything as it is from now on."""
        with self._lock:
            self._fault = None
            self._times = 0

    def close(self) -> None:
        """Stops accepting, ends every connection, and waits for the relays."""
        _shut(self._listener)
        # The accept thread first: no link is added after it ends.
        self._join(self._threads[:1])
        self._listener.close()
        links = list(self._links)
        for link in links:
            _shut(link.client, link.daemon)
        self._join(self._threads[1:])
        for link in links:
            link.client.close()
            link.daemon.close()

    @staticmethod
    def _join(threads: list[threading.Thread]) -> None:
        for t in threads:
            t.join(timeout=10)
            if t.is_alive():
                raise RuntimeError(f"proxy thread {t.name} did not end")

    def _start(self, target: Callable[..., None], *args: object) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(t)
        t.start()

    def _take(self) -> Fault | None:
        """The fault for the next request, if one is armed."""
        with self._lock:
            self.requests += 1
            if self._fault is None or self._times == 0:
                return None
            if self._times is not None:
                self._times -= 1
            self.faulted += 1
            return self._fault

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            daemon = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                daemon.connect(str(self._upstream))
            except OSError:
                # The daemon is gone: so is this connection.
                client.close()
                daemon.close()
                continue
            link = _Link(client, daemon)
            with self._lock:
                self.connections += 1
                self._links.append(link)
            self._start(self._requests, link)
            self._start(self._replies, link)

    def _requests(self, link: _Link) -> None:
        """Client to daemon: the ``Hello`` as it is, then each request,
        spoilt if a fault is armed."""
        hello = _read_frame(link.client)
        if hello is None:
            _shut(link.client, link.daemon)
            return
        link.daemon.sendall(hello.raw)
        while (request := _read_frame(link.client)) is not None:
            fault = self._take()
            data = request.raw
            if fault is not None:
                if fault.request is not None:
                    data = fault.request(request, hello)
                if fault.reply is not None:
                    with link.lock:
                        link.pending.append(fault)
            try:
                link.daemon.sendall(data)
            except OSError:
                break
        _shut(link.client, link.daemon)

    def _replies(self, link: _Link) -> None:
        """Daemon to client: each frame as it is, or as the fault of the
        request it answers says."""
        while (reply := _read_frame(link.daemon)) is not None:
            with link.lock:
                fault = link.pending.popleft() if link.pending else None
            out = Reply(reply.raw) if fault is None or fault.reply is None else fault.reply(reply)
            try:
                link.client.sendall(out.data)
            except OSError:
                break
            if out.close:
                break
        _shut(link.client, link.daemon)


def _with_request_id_plus(body: bytes, n: int) -> bytes:
    rid = int.from_bytes(body[:8], "little")
    return (rid + n).to_bytes(8, "little") + body[8:]


# The faults the tests use. Each names the client error it causes
# (crates/client/src/error.rs).

#: ``Disconnected``: the connection ends where the reply was due.
CLOSE_BEFORE_REPLY = Fault(reply=lambda r: Reply(b"", close=True))
#: ``Disconnected``: the connection ends inside the reply's frame.
CLOSE_INSIDE_REPLY = Fault(reply=lambda r: Reply(r.raw[:-1], close=True))
#: ``Timeout``: no reply comes, and the connection stays open.
NO_REPLY = Fault(reply=lambda r: Reply(b""))
#: ``Protocol``: the reply's type byte is one no version uses.
UNKNOWN_REPLY_TYPE = Fault(reply=lambda r: Reply(frame(UNKNOWN_TYPE, r.body)))
#: ``Protocol``: the reply's body ends inside its request id.
TRUNCATED_REPLY = Fault(reply=lambda r: Reply(frame(r.type, r.body[:3])))
#: ``WrongRequestId``: the daemon answers the request under another id.
OTHER_REQUEST_ID = Fault(request=lambda r, hello: frame(r.type, _with_request_id_plus(r.body, 1000)))
#: ``Unexpected``: a ``Lookup`` sent on as a ``Remove`` of the same keys,
#: which the daemon answers with an ``Ack``.
REPLY_OF_ANOTHER_TYPE = Fault(request=lambda r, hello: frame(REMOVE if r.type == LOOKUP else r.type, r.body))
#: ``Refused`` with ``BAD_FRAME`` (closes): the daemon cannot decode the request.
UNDECODABLE_REQUEST = Fault(request=lambda r, hello: frame(UNKNOWN_TYPE, r.body))
#: ``Refused`` with ``HANDSHAKE`` (closes): the connection's ``Hello`` again.
SECOND_HELLO = Fault(request=lambda r, hello: hello.raw)
#: ``Refused`` with ``UNEXPECTED``, which keeps the connection: the request
#: sent on as a reply (an ``Ack`` of its id).
REQUEST_AS_A_REPLY = Fault(request=lambda r, hello: frame(ACK, r.body[:8]))
