"""``kvtier.HeadShards``: shard keys and virtual block ids per rank, and
blocks stored at TP 1 and loaded at TP 2 through a real daemon whose
geometry is one head of the tiny model."""

from __future__ import annotations

import ctypes
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TOKENS

import kvtier
from kvtier.testing import DaemonError, start_daemon

LAYERS = 2
KV_HEADS = 2
# One head's K and V of one layer of one block: 16 tokens x 32 f32, twice.
HEAD_BYTES = 2 * TOKENS * 32 * 4


def test_rank_keys_interleave_the_ranks_shards() -> None:
    shards = kvtier.HeadShards(kv_heads=8, shard_heads=1)
    assert (shards.kv_heads, shards.shard_heads, shards.count) == (8, 1, 8)
    assert shards.for_rank(1, 2) == range(4, 8)
    blocks = [11, 12]
    keys = shards.rank_keys(blocks, 1, 2)
    assert keys == [shards.key(b, s) for b in blocks for s in range(4, 8)]
    assert len(set(shards.all_keys(blocks))) == 16
    # Ranks of one TP size partition every block's shards.
    per_rank = [shards.rank_keys(blocks, r, 4) for r in range(4)]
    assert sorted(k for ks in per_rank for k in ks) == sorted(shards.all_keys(blocks))
    assert shards.rank_block_ids([7, 3], 1, 4) == [14, 15, 6, 7]
    assert shards.blocks_in_prefix(4 + 3, 1, 2) == 1
    assert shards.blocks_in_prefix(15) == 1
    # Another cut of the heads names other objects.
    coarse = kvtier.HeadShards.for_tp_sizes(8, [1, 2, 4])
    assert coarse == kvtier.HeadShards(8, 2)
    assert not set(coarse.all_keys(blocks)) & set(shards.all_keys(blocks))


def test_replicated_heads_and_latents_share_keys() -> None:
    shards = kvtier.HeadShards(kv_heads=2)
    assert [shards.rank_heads(r, 4) for r in range(4)] == [range(0, 1)] * 2 + [range(1, 2)] * 2
    assert shards.rank_keys([5], 0, 4) == shards.rank_keys([5], 1, 4)
    mla = kvtier.HeadShards.mla()
    assert {tuple(mla.rank_keys([5], r, 8)) for r in range(8)} == {(mla.key(5, 0),)}


def test_bad_shapes_raise_value_error() -> None:
    with pytest.raises(ValueError, match="do not split"):
        kvtier.HeadShards(kv_heads=8, shard_heads=3)
    with pytest.raises(ValueError, match="not whole shards"):
        kvtier.HeadShards(kv_heads=8, shard_heads=4).for_rank(1, 4)
    with pytest.raises(ValueError, match="TP 3"):
        kvtier.HeadShards(kv_heads=8).rank_keys([1], 0, 3)


@pytest.fixture
def shard_daemon(tmp_path: Path) -> Iterator[Path]:
    """A daemon holding one head of the tiny model per block."""
    env = dict(
        KVTIER_GEOMETRY__PRESET="tiny",
        KVTIER_GEOMETRY__KV_HEADS="1",
        KVTIER_GEOMETRY__TOKENS_PER_BLOCK=str(TOKENS),
        KVTIER_MEMORY__CAPACITY="1MiB",
        KVTIER_DISK__CAPACITY_PER_DIR="16MiB",
        KVTIER_DISK__REGION_SIZE="1MiB",
    )
    try:
        d = start_daemon(tmp_path / "data", env)
    except DaemonError as e:
        pytest.fail(str(e))
    yield d.socket
    d.stop()


def head_kv(block: int, layer: int, head: int) -> bytes:
    """What the model computes for one head: the same at every TP size."""
    return random.Random(block * 1_000_003 + layer * 1009 + head).randbytes(HEAD_BYTES)


def address(buf: bytearray) -> tuple[int, int]:
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf)), len(buf)


def test_saved_at_tp1_loads_at_tp2(shard_daemon: Path) -> None:
    """Per-layer buffers ``[engine block, local head, HEAD_BYTES]``, read
    and written through virtual block ids with a stride of one shard."""
    shards = kvtier.HeadShards(kv_heads=KV_HEADS)

    def client() -> kvtier.Client:
        return kvtier.Client(
            shard_daemon,
            model="pytest-shards",
            dtype="f32",
            layers=LAYERS,
            layer_bytes=HEAD_BYTES,
            block_size_tokens=TOKENS,
        )

    blocks, slots = [101, 102, 103], [2, 0, 1]
    saver = [bytearray(3 * KV_HEADS * HEAD_BYTES) for _ in range(LAYERS)]
    for b, slot in zip(blocks, slots):
        for layer in range(LAYERS):
            for head in range(KV_HEADS):
                at = (slot * KV_HEADS + head) * HEAD_BYTES
                saver[layer][at : at + HEAD_BYTES] = head_kv(b, layer, head)
    c = client()
    keys = shards.rank_keys(blocks, 0, 1)
    ids = shards.rank_block_ids(slots, 0, 1)
    layers = [address(buf) for buf in saver]
    assert c.store_layers(keys, layers, ids, HEAD_BYTES) == ["stored"] * 6
    assert shards.blocks_in_prefix(len(c.lookup(shards.all_keys(blocks)))) == 3

    for rank in range(2):
        mine = [bytearray(3 * HEAD_BYTES) for _ in range(LAYERS)]
        into = [1, 2, 0]
        load = client().load(shards.rank_keys(blocks, rank, 2))
        assert shards.blocks_in_prefix(load.prefix_len, rank, 2) == 3
        ids = shards.rank_block_ids(into, rank, 2)
        for layer in range(LAYERS):
            load.wait_layer(layer)
            assert load.read_layer(layer, address(mine[layer]), ids, HEAD_BYTES) == [True] * 3
        load.release()
        for b, slot in zip(blocks, into):
            for layer in range(LAYERS):
                got = bytes(mine[layer][slot * HEAD_BYTES : (slot + 1) * HEAD_BYTES])
                assert got == head_kv(b, layer, rank), (b, layer, rank)
