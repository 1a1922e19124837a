"""A real ``kvtier serve`` for tests (this package's and an engine
integration's): started in a directory of the caller's, on loopback only,
stopped by the caller. Several of them form a cluster (docs/cluster.md)
through :func:`start_cluster`: one ``redis-server`` as the shared index,
one cluster secret, a peer server on each.

The binary is ``$KVTIER_BIN``, else ``target/release/kvtier`` or
``target/debug/kvtier`` of the checkout this package was installed from
(``$KVTIER_REPO``) or of the current directory. The index is
``redis-server`` from ``PATH``, or ``$KVTIER_REDIS_SERVER`` (e.g.
``valkey-server``); a missing one is a :class:`DaemonError` (tests fail on
it, they do not skip).
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TypeVar

#: How long a daemon may take to say it is ready.
START_TIMEOUT = 60.0


class DaemonError(RuntimeError):
    """The daemon (or a cluster's index server) could not be started."""


def kvtier_bin() -> Path:
    """The ``kvtier`` binary to run; :class:`DaemonError` if there is none."""
    env = os.environ.get("KVTIER_BIN")
    if env:
        candidates = [Path(env)]
    else:
        roots = [Path(os.environ.get("KVTIER_REPO", ".")), Path.cwd()]
        candidates = [r / "target" / p / "kvtier" for r in roots for p in ("release", "debug")]
    for c in candidates:
        if c.is_file():
            return c.resolve()
    raise DaemonError(f"no kvtier binary at {[str(c) for c in candidates]}: build it or set KVTIER_BIN")


@dataclass
class Daemon:
    """A running ``kvtier serve``; :meth:`stop` or :meth:`kill` it, and
    :meth:`restart` it on the same data directory and arena name."""

    proc: subprocess.Popen[str]
    socket: Path
    data: Path
    env: dict[str, str]
    """The ``KVTIER_*`` settings it was started with (its arena name included)."""
    log: list[str] = field(default_factory=list)

    def stop(self) -> None:
        """SIGTERM (a clean shutdown), and waits."""
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=60)

    def kill(self) -> None:
        """SIGKILL (a crash), and waits."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=60)

    def restart(self) -> Daemon:
        """A new daemon on this one's data directory and settings (stop or
        kill this one first)."""
        return start_daemon(self.data, self.env)

    def logged(self, name: str) -> str | None:
        """The value of the first ``name=value`` field the daemon has logged
        (``peer``, ``metrics``, ``admin_http``, ...), if any."""
        key = name + "="
        for line in self.log:
            for word in line.split():
                if word.startswith(key):
                    return word[len(key) :]
        return None

    def metrics(self) -> dict[str, float]:
        """The samples of the daemon's ``/metrics``, by name with labels
        (``kvtier_node_peer_hits_total``, ``kvtier_tier_hits{tier="g2"}``):
        from the metadata service's admin port, else from
        ``manager.metrics_addr``; :class:`DaemonError` if it serves
        neither."""
        addr = self.logged("admin_http")
        if addr is None or addr == "off":
            addr = self.logged("metrics")
        if addr is None or addr == "off":
            raise DaemonError("the daemon serves no /metrics (meta.enabled and manager.metrics_addr are off)")
        with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            name, _, value = line.rpartition(" ")
            if name and not line.startswith("#"):
                out[name] = float(value)
        return out


def start_daemon(data: Path, env: dict[str, str]) -> Daemon:
    """Starts ``kvtier serve --data-dir data`` with ``KVTIER_*`` settings
    ``env`` (on top of: a fresh arena name, psync disk I/O without fsync,
    no metadata service) and waits until it is ready. Its socket is
    ``KVTIER_MANAGER__SOCKET`` if ``env`` sets it, else ``data/node.sock``."""
    settings = dict(
        KVTIER_MEMORY__SHM_NAME=f"kvtier-test-{uuid.uuid4().hex[:12]}",
        KVTIER_DISK__IO_ENGINE="psync",
        KVTIER_DISK__SYNC="false",
        KVTIER_META__ENABLED="false",
        KVTIER_LOG="info",
    )
    settings.update(env)
    full = dict(os.environ)
    full.update(settings)
    proc = subprocess.Popen(
        [str(kvtier_bin()), "serve", "--data-dir", str(data)],
        env=full,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    sock = Path(settings["KVTIER_MANAGER__SOCKET"]) if settings.get("KVTIER_MANAGER__SOCKET") else data / "node.sock"
    daemon = Daemon(proc=proc, socket=sock, data=data, env=settings)
    assert proc.stderr is not None
    if not _wait_for_line(proc, proc.stderr, "kvtier serving", daemon.log):
        proc.kill()
        proc.wait(timeout=60)
        raise DaemonError("kvtier serve did not become ready:\n" + "\n".join(daemon.log))
    return daemon


def _wait_for_line(proc: subprocess.Popen[str], stream: IO[str], marker: str, log: list[str]) -> bool:
    """Drains ``stream`` into ``log`` on a thread of its own and waits up
    to :data:`START_TIMEOUT` for a line holding ``marker``; false if the
    stream ended (the process exited) or the time ran out first."""
    decided = threading.Event()
    found: list[str] = []

    def drain() -> None:
        for line in stream:
            log.append(line.rstrip("\n"))
            if not found and marker in line:
                found.append(line)
                decided.set()
        decided.set()

    threading.Thread(target=drain, daemon=True).start()
    decided.wait(START_TIMEOUT)
    return bool(found) and proc.poll() is None


T = TypeVar("T")

#: How often :func:`wait_until` asks again.
POLL_INTERVAL = 0.05


def wait_until(what: str, probe: Callable[[], T | None], timeout: float = START_TIMEOUT) -> T:
    """Calls ``probe`` until it gives a value other than ``None`` and
    returns that value; ``TimeoutError`` naming ``what`` after ``timeout``
    seconds. For what a daemon does in the background (a node publishing
    its blocks to the cluster), not for races."""
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got is not None:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f} s for {what}")
        time.sleep(POLL_INTERVAL)


def corrupt_arena_slots(shm_name: str) -> None:
    """Overwrites the data of every slot of the daemon's arena
    ``/dev/shm/<shm_name>`` (docs/memory-arena.md: the data offset is the
    u64 at byte 72 of the header), so that every block held there fails
    verification."""
    with open(Path("/dev/shm") / shm_name, "r+b") as f:
        f.seek(72)
        data_offset = int.from_bytes(f.read(8), "little")
        f.seek(0, 2)
        end = f.tell()
        f.seek(data_offset)
        f.write(bytes([0x5A]) * (end - data_offset))


# ------------------------------------------------------------------ clusters


@dataclass
class RedisServer:
    """A ``redis-server`` on a loopback port, persistence off, its files in
    a directory of the caller's: the index a cluster's daemons share.
    :meth:`stop` it after its daemons."""

    proc: subprocess.Popen[str]
    port: int
    log: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``, as ``meta.index`` takes it."""
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        """SIGTERM (it saves nothing: persistence is off), and waits."""
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=60)


def start_redis(directory: Path) -> RedisServer:
    """Starts ``redis-server`` (or ``$KVTIER_REDIS_SERVER``) on a free
    loopback port with its files in ``directory``, and waits until it
    accepts connections; :class:`DaemonError` if it is not installed or
    does not start. A port found free can be taken before the server binds
    it, so a server that exits at once is tried again on another."""
    binary = os.environ.get("KVTIER_REDIS_SERVER", "redis-server")
    path = shutil.which(binary)
    if path is None:
        raise DaemonError(
            f"{binary!r} not found: install it (apt-get install -y redis-server) "
            "or set KVTIER_REDIS_SERVER to a redis-server/valkey-server binary"
        )
    directory.mkdir(parents=True, exist_ok=True)
    log: list[str] = []
    for _ in range(3):
        port = _free_port()
        # Logs to stdout (no logfile): its "Ready to accept connections"
        # line is the readiness signal.
        proc = subprocess.Popen(
            [path, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(directory)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        log = []
        assert proc.stdout is not None
        if _wait_for_line(proc, proc.stdout, "Ready to accept connections", log):
            return RedisServer(proc=proc, port=port, log=log)
        proc.kill()
        proc.wait(timeout=60)
    raise DaemonError(f"{path} did not become ready:\n" + "\n".join(log))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def write_cluster_secret(path: Path) -> Path:
    """A fresh cluster secret (32 random bytes) in a new file ``path``,
    mode 0600 from its creation (``peer.secret_file`` refuses a file others
    can read); returns ``path``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_bytes(32))
    return path


@dataclass
class Cluster:
    """Daemons of one cluster (docs/cluster.md): one index, one secret, a
    name. :meth:`start_member` starts each; :meth:`stop` stops them all,
    then the index."""

    name: str
    redis: RedisServer
    secret: Path
    members: list[Daemon] = field(default_factory=list)

    def member_env(self, node: str) -> dict[str, str]:
        """The settings that make a daemon node ``node`` of this cluster:
        its name, a peer server on a free loopback port (published with its
        locations), the hosted metadata service over the shared index on
        free loopback ports with a small file pool, and long cluster-lookup
        and peer-load timeouts (a loaded test machine must not turn a hit
        into a miss)."""
        return dict(
            KVTIER_NODE=node,
            KVTIER_PEER__LISTEN="127.0.0.1:0",
            KVTIER_PEER__CLUSTER=self.name,
            KVTIER_PEER__SECRET_FILE=str(self.secret),
            KVTIER_PEER__LOOKUP_TIMEOUT_MS="10000",
            KVTIER_PEER__LOAD_TIMEOUT_MS="30000",
            KVTIER_META__ENABLED="true",
            KVTIER_META__INDEX=self.redis.url,
            KVTIER_META__BIND="127.0.0.1",
            KVTIER_META__RPC_PORT="0",
            KVTIER_META__HTTP_PORT="0",
            KVTIER_META__ADMIN_RPC_PORT="0",
            KVTIER_META__ADMIN_HTTP_PORT="0",
            KVTIER_META__POOL_CAPACITY="1MiB",
        )

    def start_member(self, data: Path, node: str, env: dict[str, str]) -> Daemon:
        """Starts node ``node`` of the cluster in ``data`` with ``env`` on
        top of :meth:`member_env` (``start_daemon``'s defaults below both)."""
        daemon = start_daemon(data, {**self.member_env(node), **env})
        self.members.append(daemon)
        return daemon

    def stop(self) -> None:
        """Stops every member still running (SIGTERM), then the index."""
        try:
            for daemon in self.members:
                daemon.stop()
        finally:
            self.redis.stop()


def start_cluster(directory: Path, name: str = "kvtier-test") -> Cluster:
    """A cluster called ``name`` with no members yet: a ``redis-server``
    and a fresh secret in ``directory`` (created)."""
    directory.mkdir(parents=True, exist_ok=True)
    secret = write_cluster_secret(directory / "cluster.secret")
    return Cluster(name=name, redis=start_redis(directory / "redis"), secret=secret)
