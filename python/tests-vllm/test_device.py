"""``kvtier.device`` on CPU tensors laid out exactly as vLLM 0.32 lays its
GPU KV caches: gathers and scatters byte-exact in every layout and dtype
(property-tested over block ids and shapes), round trips through a real
``kvtier serve``, a corrupted slot a failed block that never reaches the
cache, and the connector's worker on a KV cache whose blocks are not
contiguous rows (the route a GPU's cache takes).

In this directory because it needs torch (the vLLM venv has it; the plain
Python tests' interpreter does not)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvtier
from kvtier.device import KV_LAYOUTS, DeviceCopier, gather, paged_kv_cache, row_bytes, scatter
from kvtier.testing import Daemon, DaemonError, corrupt_arena_slots, start_daemon
from kvtier.vllm.clients import Clients
from kvtier.vllm.config import KvtierConfig, Shape
from kvtier.vllm.groups import Group
from kvtier.vllm.layouts import HeadShardBlocks, RankBlocks
from kvtier.vllm.scheduler import KvtierConnectorMetadata, Transfer
from kvtier.vllm.worker import KvtierWorker

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.float8_e4m3fn]

# The daemon's block shape: 2 layers, 2 KV heads of 8 elements (K and V),
# 4 tokens per block, float32: a layer of a block is 512 bytes.
LAYERS, HEADS, HEAD_DIM, TOKENS = 2, 2, 8, 4


def _fill(layers: list[torch.Tensor], seed: int) -> None:
    """Random bytes in every element (NaN patterns included: compared as
    bytes)."""
    g = torch.Generator().manual_seed(seed)
    for t in layers:
        b = t.view(torch.uint8)
        b.copy_(torch.randint(0, 256, tuple(b.shape), dtype=torch.uint8, generator=g))


def _block(layer: torch.Tensor, b: int, block_dim: int = 0) -> torch.Tensor:
    """Block ``b``'s bytes in logical order: what the arena holds."""
    return layer.select(block_dim, b).contiguous().view(torch.uint8).reshape(-1)


def _legacy(layers: int, blocks: int, heads: int, tokens: int, head: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """Older vLLM's FlashAttention cache: ``[2, blocks, tokens, heads, head]``
    per layer, blocks on axis 1."""
    return [torch.zeros(2, blocks, tokens, heads, head, dtype=dtype) for _ in range(layers)]


@st.composite
def _cases(draw: st.DrawFn) -> tuple[str, dict[str, int], torch.dtype, list[int], list[int], int]:
    layout = draw(st.sampled_from([*KV_LAYOUTS, "legacy"]))
    dims = dict(
        layers=draw(st.integers(1, 3)),
        blocks=draw(st.integers(2, 12)),
        heads=draw(st.integers(1, 4)),
        tokens=draw(st.integers(1, 8)),
        content=draw(st.integers(1, 12)) * 2,
    )
    dtype = draw(st.sampled_from(DTYPES))
    n = draw(st.integers(1, dims["blocks"]))
    src = draw(st.permutations(range(dims["blocks"])))[:n]
    dst = draw(st.permutations(range(dims["blocks"])))[:n]
    return layout, dims, dtype, src, dst, draw(st.integers(0, 2**31))


def _cache(layout: str, dims: dict[str, int], dtype: torch.dtype) -> tuple[list[torch.Tensor], int]:
    """A zeroed cache in ``layout`` and the axis of its blocks."""
    if layout == "legacy":
        d = dims
        return _legacy(d["layers"], d["blocks"], d["heads"], d["tokens"], d["content"] // 2, dtype), 1
    return paged_kv_cache(layout, **dims, dtype=dtype, device="cpu"), 0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_cases())
def test_gather_scatter_round_trip_is_byte_exact(case: tuple[str, dict[str, int], torch.dtype, list[int], list[int], int]) -> None:
    layout, dims, dtype, src_ids, dst_ids, seed = case
    src, axis = _cache(layout, dims, dtype)
    _fill(src, seed)
    # Back into a cache of the canonical host layout, other block ids.
    dst = paged_kv_cache("LBHNC", **dims, dtype=dtype, device="cpu") if axis == 0 else _cache(layout, dims, dtype)[0]
    n = len(src_ids)
    for s, d in zip(src, dst):
        row = row_bytes(s, axis)
        out = torch.empty(n, row, dtype=torch.uint8)
        gather(s, torch.tensor(src_ids), out, axis)
        for i, b in enumerate(src_ids):
            assert torch.equal(out[i], _block(s, b, axis))
        scatter(d, torch.tensor(dst_ids), out, axis)
        for b_src, b_dst in zip(src_ids, dst_ids):
            assert torch.equal(_block(d, b_dst, axis), _block(s, b_src, axis))
        untouched = set(range(dims["blocks"])) - set(dst_ids)
        assert all(not _block(d, b, axis).any() for b in untouched)


@pytest.mark.parametrize("layout", sorted(KV_LAYOUTS))
def test_staged_image_is_the_host_layout_block(layout: str) -> None:
    """The staged bytes of a block are the bytes vLLM's CPU cache (LBHNC)
    keeps for the same block: both routes store one image."""
    dims = dict(layers=2, blocks=5, heads=3, tokens=4, content=6)
    cache = paged_kv_cache(layout, **dims, dtype=torch.float16, device="cpu")
    host = paged_kv_cache("LBHNC", **dims, dtype=torch.float16, device="cpu")
    _fill(cache, 7)
    for c, h in zip(cache, host):
        h.copy_(c)
        assert h[3].is_contiguous()
        out = torch.empty(1, row_bytes(c), dtype=torch.uint8)
        gather(c, torch.tensor([3]), out)
        assert torch.equal(out[0], h[3].view(torch.uint8).reshape(-1))


def test_copier_batches_and_load_staging_grow() -> None:
    dims = dict(layers=3, blocks=40, heads=2, tokens=4, content=8)
    src = paged_kv_cache("LBNHC", **dims, dtype=torch.bfloat16, device="cpu")
    dst = paged_kv_cache("BLNHC", **dims, dtype=torch.bfloat16, device="cpu")
    _fill(src, 3)
    copier = DeviceCopier(src, batch_bytes=5 * 3 * row_bytes(src[0]))
    assert copier.batch_blocks == 5
    back = DeviceCopier(dst)
    ids = list(range(0, 38, 2))  # 19 blocks: the last batch is short
    start = 0
    for n, regions in copier.stage_out(ids):
        assert n == min(5, len(ids) - start)
        batch = ids[start : start + n]
        for layer, (addr, nbytes) in enumerate(regions):
            assert nbytes == n * copier.row
            to_addr, to_nbytes = back.load_region(layer, n)
            assert to_nbytes == nbytes
            _memcpy(to_addr, addr, nbytes)
            back.stage_in(layer, [b + 1 for b in batch], list(range(n)))
        start += n
    assert start == len(ids)
    for s, d in zip(src, dst):
        for b in ids:
            assert torch.equal(_block(d, b + 1), _block(s, b))
            assert not _block(d, b).any()


def test_stage_in_takes_any_rows_of_the_staging() -> None:
    """Blocks that failed are left out: the rows that reach the cache are
    not always the leading ones."""
    dims = dict(layers=1, blocks=6, heads=2, tokens=2, content=4)
    src = paged_kv_cache("LBNHC", **dims, dtype=torch.float16, device="cpu")
    dst = paged_kv_cache("LHBNC", **dims, dtype=torch.float16, device="cpu")
    _fill(src, 5)
    out, back = DeviceCopier(src), DeviceCopier(dst)
    ((n, [(addr, nbytes)]),) = list(out.stage_out([0, 1, 2, 3]))
    to_addr, _ = back.load_region(0, n)
    _memcpy(to_addr, addr, nbytes)
    back.stage_in(0, [5, 4], [3, 1])
    assert torch.equal(_block(dst[0], 5), _block(src[0], 3))
    assert torch.equal(_block(dst[0], 4), _block(src[0], 1))
    assert not any(_block(dst[0], b).any() for b in range(4))


def _memcpy(dst: int, src: int, n: int) -> None:
    import ctypes

    ctypes.memmove(dst, src, n)


def test_mismatched_layers_are_refused() -> None:
    a = paged_kv_cache("LBNHC", layers=1, blocks=4, heads=2, tokens=4, content=8, dtype=torch.float32, device="cpu")
    b = paged_kv_cache("LBNHC", layers=1, blocks=4, heads=2, tokens=4, content=16, dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match="differ"):
        DeviceCopier([a[0], b[0]])
    with pytest.raises(ValueError, match="innermost"):
        DeviceCopier([a[0].transpose(2, 3)])


# ------------------------------------------------------------ a real daemon


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Daemon]:
    try:
        d = start_daemon(
            tmp_path / "data",
            dict(
                KVTIER_GEOMETRY__PRESET="tiny",
                KVTIER_GEOMETRY__LAYERS=str(LAYERS),
                KVTIER_GEOMETRY__KV_HEADS=str(HEADS),
                KVTIER_GEOMETRY__HEAD_DIM=str(HEAD_DIM),
                KVTIER_GEOMETRY__DTYPE="f32",
                KVTIER_GEOMETRY__TOKENS_PER_BLOCK=str(TOKENS),
                KVTIER_MEMORY__CAPACITY="1MiB",
                KVTIER_DISK__CAPACITY_PER_DIR="16MiB",
                KVTIER_DISK__REGION_SIZE="1MiB",
            ),
        )
    except DaemonError as e:
        pytest.fail(str(e))
    yield d
    d.stop()


def _client(d: Daemon) -> kvtier.Client:
    return kvtier.Client(
        str(d.socket),
        model="device-test",
        dtype="float32",
        layers=LAYERS,
        layer_bytes=2 * HEADS * HEAD_DIM * TOKENS * 4,
        block_size_tokens=TOKENS,
    )


def _gpu_cache(layout: str, blocks: int = 16) -> list[torch.Tensor]:
    return paged_kv_cache(
        layout, layers=LAYERS, blocks=blocks, heads=HEADS, tokens=TOKENS, content=2 * HEAD_DIM, dtype=torch.float32, device="cpu"
    )


def _store(client: kvtier.Client, copier: DeviceCopier, keys: list[int], ids: list[int]) -> list[str]:
    outcomes: list[str] = []
    for n, layers in copier.stage_out(ids):
        outcomes += client.store_layers(keys[len(outcomes) : len(outcomes) + n], layers, list(range(n)), client.layer_bytes)
    return outcomes


def _load(client: kvtier.Client, copier: DeviceCopier, keys: list[int], ids: list[int]) -> list[bool]:
    """Loads ``keys`` into blocks ``ids`` layer by layer; whether each
    block was whole and verified (only those reach the cache)."""
    load = client.load(keys)
    n = load.prefix_len
    whole = [True] * n
    copier.start_loads()
    for layer in range(LAYERS):
        load.wait_layer(layer)
        dst = copier.load_region(layer, n)
        ok = load.read_layer(layer, dst, list(range(n)), client.layer_bytes)
        whole = [w and o for w, o in zip(whole, ok)]
        good = [i for i in range(n) if ok[i]]
        copier.stage_in(layer, [ids[i] for i in good], good)
    load.release()
    return whole + [False] * (len(keys) - n)


@pytest.mark.parametrize(("stored_as", "loaded_as"), [("LBNHC", "LBHNC"), ("BLHNC", "LBNHC"), ("LHBNC", "BHLNC")])
def test_round_trip_through_the_node(node: Daemon, stored_as: str, loaded_as: str) -> None:
    src, dst = _gpu_cache(stored_as), _gpu_cache(loaded_as)
    _fill(src, 11)
    client = _client(node)
    keys = [0xD0 + i for i in range(6)]
    src_ids, dst_ids = [9, 2, 14, 5, 0, 11], [1, 3, 4, 7, 8, 15]
    assert _store(client, DeviceCopier(src), keys, src_ids) == ["stored"] * 6
    assert _load(client, DeviceCopier(dst), keys, dst_ids) == [True] * 6
    for s, d in zip(src, dst):
        for a, b in zip(src_ids, dst_ids):
            assert torch.equal(_block(d, b), _block(s, a))
        for b in set(range(16)) - set(dst_ids):
            assert not _block(d, b).any()


def test_a_corrupted_slot_is_a_failed_block_never_data(node: Daemon) -> None:
    src, dst = _gpu_cache("LBNHC"), _gpu_cache("LBNHC")
    _fill(src, 12)
    client = _client(node)
    keys = [0xE0, 0xE1, 0xE2]
    assert _store(client, DeviceCopier(src), keys, [0, 1, 2]) == ["stored"] * 3
    corrupt_arena_slots(node.env["KVTIER_MEMORY__SHM_NAME"])
    ok = _load(client, DeviceCopier(dst), keys, [3, 4, 5])
    assert not any(ok)
    assert not any(t.view(torch.uint8).any() for t in dst)


# ------------------------------------------------- the connector's worker


def _worker(d: Daemon, layer_bytes: int, layout: RankBlocks | None = None) -> KvtierWorker:
    shape = Shape(model="device-test", dtype="float32", layout="test", block_size=TOKENS, layers=LAYERS, layer_bytes=layer_bytes)
    group = Group(0, tuple(_layer_name(i) for i in range(LAYERS)), None)
    clients = Clients(KvtierConfig(socket=str(d.socket)), shape, 0, 1)
    return KvtierWorker(shape, [group], [clients], 0, layout or RankBlocks())


def _save(w: KvtierWorker, keys: list[int], ids: list[int]) -> list[int]:
    """Saves blocks ``ids`` as ``keys``, waits for the save; the keys stored."""
    w.wait_for_save(KvtierConnectorMetadata(saves=[Transfer("saved", None, keys, ids)]))
    # vLLM's wait for a preempted request's saves: they end before it returns.
    w.handle_preemptions(KvtierConnectorMetadata(preempted={"saved"}))
    said = w.take_worker_metadata()
    assert said is not None
    return said.stored


def _load_layers(w: KvtierWorker, names: list[str], keys: list[int], ids: list[int]) -> set[int]:
    """Loads ``keys`` into blocks ``ids`` as a forward would, layer by
    layer; the blocks that failed."""
    w.start_load_kv(KvtierConnectorMetadata(loads=[Transfer("loaded", None, keys, ids, ["G2"] * len(keys))]))
    for name in names:
        w.wait_for_layer_load(name)
    w.wait_for_save(None)
    return w.get_block_ids_with_load_errors()


def _layer_name(i: int) -> str:
    return f"model.layers.{i}.self_attn.attn"


def _named(layers: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    return {_layer_name(i): t for i, t in enumerate(layers)}


@pytest.mark.parametrize(("saved_as", "loaded_as"), [("LBNHC", "LBHNC"), ("LBHNC", "BLNHC")])
def test_worker_moves_blocks_between_device_and_host_layouts(node: Daemon, saved_as: str, loaded_as: str) -> None:
    """A GPU-layout cache (the staged route) and vLLM's CPU layout (the
    direct route) store and load the same block images."""
    src, dst = _named(_gpu_cache(saved_as)), _named(_gpu_cache(loaded_as))
    _fill(list(src.values()), 21)
    keys, src_ids, dst_ids = [0xF0, 0xF1, 0xF2, 0xF3], [6, 1, 12, 3], [2, 9, 10, 0]
    saver, loader = _worker(node, 512), _worker(node, 512)
    saver.register_kv_caches(src)
    loader.register_kv_caches(dst)
    assert _save(saver, keys, src_ids) == keys
    assert _load_layers(loader, list(dst), keys, dst_ids) == set()
    for s, d in zip(src.values(), dst.values()):
        for a, b in zip(src_ids, dst_ids):
            assert torch.equal(_block(d, b), _block(s, a))
    saver.shutdown()
    loader.shutdown()


def test_worker_reports_corrupted_blocks_and_leaves_them_alone(node: Daemon) -> None:
    """Through staging a failed block is not even written (the host route
    writes it, and vLLM recomputes it either way)."""
    src, dst = _named(_gpu_cache("LBNHC")), _named(_gpu_cache("LBNHC"))
    _fill(list(src.values()), 22)
    saver, loader = _worker(node, 512), _worker(node, 512)
    saver.register_kv_caches(src)
    loader.register_kv_caches(dst)
    assert _save(saver, [0xA0, 0xA1], [4, 5]) == [0xA0, 0xA1]
    corrupt_arena_slots(node.env["KVTIER_MEMORY__SHM_NAME"])
    assert _load_layers(loader, list(dst), [0xA0, 0xA1], [7, 8]) == {7, 8}
    assert not any(t.view(torch.uint8).any() for t in dst.values())
    said = loader.take_worker_metadata()
    assert said is not None and sorted(said.removed) == [0xA0, 0xA1]


@pytest.fixture
def shard_node(tmp_path: Path) -> Iterator[Daemon]:
    """A node whose objects are one KV head of a layer of a block."""
    try:
        d = start_daemon(
            tmp_path / "data",
            dict(
                KVTIER_GEOMETRY__PRESET="tiny",
                KVTIER_GEOMETRY__LAYERS=str(LAYERS),
                KVTIER_GEOMETRY__KV_HEADS="1",
                KVTIER_GEOMETRY__HEAD_DIM=str(HEAD_DIM),
                KVTIER_GEOMETRY__DTYPE="f32",
                KVTIER_GEOMETRY__TOKENS_PER_BLOCK=str(TOKENS),
                KVTIER_MEMORY__CAPACITY="1MiB",
                KVTIER_DISK__CAPACITY_PER_DIR="16MiB",
                KVTIER_DISK__REGION_SIZE="1MiB",
            ),
        )
    except DaemonError as e:
        pytest.fail(str(e))
    yield d
    d.stop()


def test_worker_head_shards_cross_tp_sizes_on_device_layouts(shard_node: Daemon) -> None:
    """Head shards saved at TP 1 from a GPU-layout cache, loaded by rank 1
    of TP 2 into another GPU layout: its head's bytes, block by block."""
    shards = kvtier.HeadShards(kv_heads=HEADS, shard_heads=1)
    head_bytes = 2 * HEAD_DIM * TOKENS * 4
    src = _named(_gpu_cache("LBNHC"))
    one_head = dict(layers=LAYERS, blocks=16, heads=1, tokens=TOKENS, content=2 * HEAD_DIM)
    dst = _named(paged_kv_cache("BLNHC", **one_head, dtype=torch.float32, device="cpu"))
    _fill(list(src.values()), 23)
    saver = _worker(shard_node, head_bytes, HeadShardBlocks(shards, 0, 1))
    loader = _worker(shard_node, head_bytes, HeadShardBlocks(shards, 1, 2))
    saver.register_kv_caches(src)
    loader.register_kv_caches(dst)
    keys, src_ids, dst_ids = [0xB0, 0xB1, 0xB2], [3, 8, 0], [5, 6, 15]
    assert _save(saver, keys, src_ids) == keys
    assert _load_layers(loader, list(dst), keys, dst_ids) == set()
    for s, d in zip(src.values(), dst.values()):
        for a, b in zip(src_ids, dst_ids):
            assert torch.equal(d[b, 0].contiguous().view(torch.uint8), s[a, 1].contiguous().view(torch.uint8))
