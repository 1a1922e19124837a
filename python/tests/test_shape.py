"""A daemon started without a block shape takes the first engine's: the
Python client connects to ``kvtier serve`` with no ``[geometry]``, its
shape is kept for the next start, and another shape is refused naming
both (docs/configuration.md, "Block shape")."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import LAYER_BYTES, LAYERS, TOKENS

import kvtier
from kvtier.testing import start_daemon

#: The tiny store without any KVTIER_GEOMETRY__* setting.
STORE = dict(
    KVTIER_MEMORY__CAPACITY="4MiB",
    KVTIER_DISK__CAPACITY_PER_DIR="16MiB",
    KVTIER_DISK__REGION_SIZE="1MiB",
)


def client(socket: Path, layers: int = LAYERS, layer_bytes: int = LAYER_BYTES) -> kvtier.Client:
    return kvtier.Client(
        socket, model="pytest", dtype="float32", layers=layers, layer_bytes=layer_bytes, block_size_tokens=TOKENS
    )


def test_a_daemon_without_geometry_takes_the_first_clients_shape(tmp_path: Path) -> None:
    data = tmp_path / "data"
    daemon = start_daemon(data, STORE)
    try:
        assert any("none yet" in line for line in daemon.log)
        c = client(daemon.socket)
        block = bytes(range(256)) * (LAYERS * LAYER_BYTES // 256)
        assert c.store_buffers([7], [block]) == ["stored"]
        assert (data / "shape.toml").stat().st_mode & 0o777 == 0o600
        with pytest.raises(kvtier.KvtierError, match="this node holds blocks of 2 layers"):
            client(daemon.socket, layers=4, layer_bytes=LAYER_BYTES // 2)
        del c
    finally:
        daemon.stop()

    again = start_daemon(data, STORE)
    try:
        assert any("kept in" in line for line in again.log if "kvtier serving" in line)
        c = client(again.socket)
        load = c.load([7])
        assert load.prefix_len == 1
        load.wait_layer(LAYERS - 1)
        out = bytearray(LAYERS * LAYER_BYTES)
        assert load.read_block(0, out)
        assert bytes(out) == block
        load.release()
    finally:
        again.stop()
