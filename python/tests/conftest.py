"""A real ``kvtier serve`` per test, on a tiny store in a temporary
directory: 2-layer blocks of 16 tokens (8 KiB per layer), 4 MiB of arena,
16 MiB of disk log, no metadata service (``kvtier.testing``).

A missing binary fails the tests (it is not a reason to skip them).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import kvtier
from kvtier.testing import Daemon, DaemonError, start_daemon

LAYERS = 2
LAYER_BYTES = 8192
TOKENS = 16
BLOCK = LAYERS * LAYER_BYTES
#: The tiny store every test daemon has.
TINY_ENV = dict(
    KVTIER_GEOMETRY__PRESET="tiny",
    KVTIER_GEOMETRY__TOKENS_PER_BLOCK=str(TOKENS),
    KVTIER_MEMORY__CAPACITY="4MiB",
    KVTIER_DISK__CAPACITY_PER_DIR="16MiB",
    KVTIER_DISK__REGION_SIZE="1MiB",
)


def block(key: int) -> bytes:
    """Bytes that differ per key and per position."""
    seed = (key * 0x9E3779B97F4A7C15) & 0xFFFFFFFF
    return bytes(((seed >> (i % 24)) + i * 31) & 0xFF for i in range(BLOCK))


def check_blocks(load: kvtier.Load, keys: list[int]) -> None:
    """Waits for every layer of ``load`` and checks that its first blocks
    are ``block(k)`` of ``keys``, verified."""
    assert load.prefix_len == len(keys)
    load.wait_layer(LAYERS - 1)
    for i, k in enumerate(keys):
        out = bytearray(BLOCK)
        assert load.read_block(i, out)
        assert bytes(out) == block(k)


class TinyDaemon:
    """The daemon and a way to connect to it."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.socket = daemon.socket

    def client(self, socket: Path | None = None, **kw: object) -> kvtier.Client:
        """A client of the test namespace, through ``socket`` if given
        (a proxy's), else at the daemon's."""
        args: dict[str, object] = dict(
            model="pytest",
            dtype="f32",
            layers=LAYERS,
            layer_bytes=LAYER_BYTES,
            block_size_tokens=TOKENS,
        )
        args.update(kw)
        return kvtier.Client(socket or self.socket, **args)  # type: ignore[arg-type]

    def stop(self) -> None:
        self.daemon.stop()


def start_tiny(data: Path, **settings: str) -> TinyDaemon:
    """The tiny daemon in ``data``, with ``KVTIER_*`` ``settings`` on top;
    a daemon that does not start fails the test."""
    try:
        return TinyDaemon(start_daemon(data, TINY_ENV | settings))
    except DaemonError as e:
        pytest.fail(str(e))


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[TinyDaemon]:
    d = start_tiny(tmp_path / "data")
    yield d
    d.stop()
