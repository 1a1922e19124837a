"""The Python client against a real node daemon."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import BLOCK, LAYER_BYTES, LAYERS, TinyDaemon as Daemon, block, check_blocks, start_tiny

import kvtier


def address(buf: bytearray) -> tuple[int, int]:
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf)), len(buf)


def test_whole_blocks_store_load_and_verify(daemon: Daemon) -> None:
    c = daemon.client()
    assert (c.layers, c.layer_bytes, c.block_bytes) == (LAYERS, LAYER_BYTES, BLOCK)
    keys = [1, 2, 3]
    assert c.store_buffers(keys, [block(k) for k in keys]) == ["stored"] * 3
    assert c.store_buffers([1], [block(1)]) == ["already_stored"]
    assert c.lookup([1, 2, 99, 3]) == ["G2", "G2"]

    load = c.load([1, 2, 3, 99])
    check_blocks(load, keys)
    load.release()
    load.release()  # a no-op
    with pytest.raises(kvtier.KvtierError, match="released"):
        load.wait_layer(0)

    c.remove([2])
    assert c.lookup([1, 2]) == ["G2"]
    assert c.stats()["committed"] == 3


def test_tiers_are_the_nodes_list(daemon: Daemon) -> None:
    """The node announces its tiers, fastest first, with their kinds: the
    arena and the disk log by default; every tier a lookup names is one of
    them."""
    c = daemon.client()
    assert c.tiers == [("G2", "memory"), ("G3", "disk")]
    c.store_buffers([5], [block(5)])
    labels = {label for label, _ in c.tiers}
    assert set(c.lookup([5])) <= labels


def test_tiers_name_a_remote_store_where_configured(tmp_path: Path) -> None:
    """With ``manager.g4_url`` the remote store follows the disk log."""
    remote = tmp_path / "g4"
    remote.mkdir()
    d = start_tiny(tmp_path / "data", KVTIER_MANAGER__G4_URL=f"file://{remote}")
    try:
        assert d.client().tiers == [("G2", "memory"), ("G3", "disk"), ("G4", "remote")]
    finally:
        d.stop()


def test_blocks_stored_from_and_loaded_into_per_layer_buffers(daemon: Daemon) -> None:
    """An engine's layout: one buffer per layer, block b of a layer at
    b * stride (here with a gap after each block)."""
    c = daemon.client()
    stride = LAYER_BYTES + 512
    slots = 6
    keys = [10, 11, 12]
    block_ids = [4, 0, 2]
    src = [bytearray(slots * stride) for _ in range(LAYERS)]
    for k, b in zip(keys, block_ids):
        whole = block(k)
        for layer in range(LAYERS):
            part = whole[layer * LAYER_BYTES : (layer + 1) * LAYER_BYTES]
            src[layer][b * stride : b * stride + LAYER_BYTES] = part
    assert c.store_layers(keys, [address(s) for s in src], block_ids, stride) == ["stored"] * 3

    # Read back into another layout, layer by layer.
    dst = [bytearray(slots * stride) for _ in range(LAYERS)]
    into = [1, 3, 5]
    load = c.load(keys)
    assert load.prefix_len == 3
    for layer in range(LAYERS):
        load.wait_layer(layer)
        assert load.read_layer(layer, address(dst[layer]), into, stride) == [True] * 3
    load.release()
    for k, b in zip(keys, into):
        got = b"".join(bytes(dst[layer][b * stride : b * stride + LAYER_BYTES]) for layer in range(LAYERS))
        assert got == block(k)
    # Whole blocks stored one way read back the same the other way.
    out = bytearray(BLOCK)
    load = c.load([11])
    load.wait_layer(LAYERS - 1)
    assert load.read_block(0, out) and bytes(out) == block(11)
    load.release()


def test_bad_input_is_refused_and_stores_nothing(daemon: Daemon) -> None:
    c = daemon.client()
    buf = bytearray(2 * LAYER_BYTES)
    layers = [address(buf)] * LAYERS
    with pytest.raises(ValueError, match="do not fit"):
        c.store_layers([5], layers, [2], LAYER_BYTES)  # block 2 is past the end
    with pytest.raises(ValueError, match="layer buffers"):
        c.store_layers([5], layers[:1], [0], LAYER_BYTES)
    with pytest.raises(ValueError, match="block ids"):
        c.store_layers([5, 6], layers, [0], LAYER_BYTES)
    with pytest.raises(ValueError, match="bytes; blocks are"):
        c.store_buffers([5], [b"short"])
    assert c.lookup([5]) == []
    assert c.stats()["reserved"] == 0
    load = c.load([5])
    assert load.prefix_len == 0
    load.release()


def test_a_geometry_the_node_does_not_hold_is_refused(daemon: Daemon) -> None:
    with pytest.raises(kvtier.KvtierError) as refused:
        daemon.client(layers=LAYERS + 1)
    assert not isinstance(refused.value, kvtier.DaemonUnavailable)
    assert "layers" in str(refused.value)


def test_a_missing_or_stopped_daemon_is_unavailable(daemon: Daemon, tmp_path: Path) -> None:
    with pytest.raises(kvtier.DaemonUnavailable):
        kvtier.Client(
            tmp_path / "nowhere.sock",
            model="m",
            dtype="f32",
            layers=LAYERS,
            layer_bytes=LAYER_BYTES,
            block_size_tokens=16,
        )
    c = daemon.client(timeout=5.0)
    assert c.store_buffers([7], [block(7)]) == ["stored"]
    daemon.stop()
    with pytest.raises(kvtier.DaemonUnavailable):
        c.lookup([7])


def test_threads_share_a_client(daemon: Daemon) -> None:
    c = daemon.client()
    errors: list[BaseException] = []

    def work(base: int) -> None:
        try:
            keys = [base + i for i in range(4)]
            assert c.store_buffers(keys, [block(k) for k in keys]) == ["stored"] * 4
            assert c.lookup(keys) == ["G2"] * 4
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(100 * t,)) for t in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_region_of_tensor_like_objects() -> None:
    class Fake:
        def __init__(self, contiguous: bool) -> None:
            self.contiguous = contiguous

        def data_ptr(self) -> int:
            return 4096

        def numel(self) -> int:
            return 10

        def element_size(self) -> int:
            return 4

        def is_contiguous(self) -> bool:
            return self.contiguous

    assert kvtier.region(Fake(True)) == (4096, 40)
    with pytest.raises(ValueError, match="contiguous"):
        kvtier.region(Fake(False))


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvtier", *args], capture_output=True, text=True, timeout=60)


def test_the_diagnostics_command(daemon: Daemon, tmp_path: Path) -> None:
    r = run_cli("--socket", str(daemon.socket), "status", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["reachable"] is True
    shape = ["--layers", str(LAYERS), "--layer-bytes", str(LAYER_BYTES), "--block-size", "16"]
    r = run_cli("--socket", str(daemon.socket), "status", "--json", *shape)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["hello"] == "ok" and "committed" in report["counters"]
    assert report["tiers"] == {"G2": "memory", "G3": "disk"}
    r = run_cli("--socket", str(daemon.socket), "status", "--layers", "9", "--layer-bytes", "1", "--block-size", "16")
    assert r.returncode == 1 and "refused" in r.stdout
    r = run_cli("--socket", str(tmp_path / "none.sock"), "status")
    assert r.returncode == 1 and "reachable: False" in r.stdout
