"""A real ``kvtier serve`` for tests (this package's and an engine
integration's): started in a directory of the caller's, on loopback only,
stopped by the caller.

The binary is ``$KVTIER_BIN``, else ``target/release/kvtier`` or
``target/debug/kvtier`` of the checkout this package was installed from
(``$KVTIER_REPO``) or of the current directory.
"""

from __future__ import annotations

import os
import subprocess
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

#: How long a daemon may take to say it is ready.
START_TIMEOUT = 60.0


class DaemonError(RuntimeError):
    """The daemon could not be started."""


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


def start_daemon(data: Path, env: dict[str, str]) -> Daemon:
    """Starts ``kvtier serve --data-dir data`` with ``KVTIER_*`` settings
    ``env`` (on top of: a fresh arena name, psync disk I/O without fsync,
    no metadata service) and waits until it is ready."""
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
    daemon = Daemon(proc=proc, socket=data / "node.sock", data=data, env=settings)
    ready = threading.Event()

    def drain() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            daemon.log.append(line.rstrip("\n"))
            if "kvtier serving" in line:
                ready.set()

    threading.Thread(target=drain, daemon=True).start()
    if not ready.wait(START_TIMEOUT):
        proc.kill()
        raise DaemonError("kvtier serve did not become ready:\n" + "\n".join(daemon.log))
    return daemon


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
