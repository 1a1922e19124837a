"""A real ``kvtier serve`` per test, on a tiny store in a temporary
directory: 2-layer blocks of 16 tokens (8 KiB per layer), 4 MiB of arena,
16 MiB of disk log, no metadata service.

The binary is ``$KVTIER_BIN``, else the checkout's release or debug build.
A missing binary fails the tests (it is not a reason to skip them).
"""

from __future__ import annotations

import os
import subprocess
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import kvtier

REPO = Path(__file__).resolve().parents[2]
LAYERS = 2
LAYER_BYTES = 8192
TOKENS = 16
START_TIMEOUT = 60.0


def kvtier_bin() -> Path:
    env = os.environ.get("KVTIER_BIN")
    candidates = [Path(env)] if env else [REPO / "target/release/kvtier", REPO / "target/debug/kvtier"]
    for c in candidates:
        if c.is_file():
            return c
    pytest.fail(f"no kvtier binary at {candidates}: build it (cargo build -p kvtier-cli) or set KVTIER_BIN")


@dataclass
class Daemon:
    """A running ``kvtier serve``."""

    proc: subprocess.Popen[str]
    socket: Path
    log: list[str]

    def client(self, **kw: object) -> kvtier.Client:
        args: dict[str, object] = dict(
            model="pytest",
            dtype="f32",
            layers=LAYERS,
            layer_bytes=LAYER_BYTES,
            block_size_tokens=TOKENS,
        )
        args.update(kw)
        return kvtier.Client(self.socket, **args)  # type: ignore[arg-type]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=60)


def start_daemon(data: Path) -> Daemon:
    env = dict(os.environ)
    env.update(
        KVTIER_GEOMETRY__PRESET="tiny",
        KVTIER_GEOMETRY__TOKENS_PER_BLOCK=str(TOKENS),
        KVTIER_MEMORY__CAPACITY="4MiB",
        KVTIER_MEMORY__SHM_NAME=f"kvtier-pytest-{uuid.uuid4().hex[:12]}",
        KVTIER_DISK__CAPACITY_PER_DIR="16MiB",
        KVTIER_DISK__REGION_SIZE="1MiB",
        KVTIER_DISK__IO_ENGINE="psync",
        KVTIER_DISK__SYNC="false",
        KVTIER_META__ENABLED="false",
        KVTIER_LOG="info",
    )
    proc = subprocess.Popen(
        [str(kvtier_bin()), "serve", "--data-dir", str(data)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    log: list[str] = []
    ready = threading.Event()

    def drain() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            log.append(line.rstrip("\n"))
            if "kvtier serving" in line:
                ready.set()

    threading.Thread(target=drain, daemon=True).start()
    if not ready.wait(START_TIMEOUT):
        proc.kill()
        pytest.fail("kvtier serve did not become ready:\n" + "\n".join(log))
    return Daemon(proc=proc, socket=data / "node.sock", log=log)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = start_daemon(tmp_path / "data")
    yield d
    d.stop()
