"""``KvtierHiCacheStorage`` as SGLang's HiCache controller drives it, against
a real ``kvtier serve``: both host layouts, MHA and MLA, the zero-copy (v1)
and flat-page paths, prefix lookups, corruption, a daemon that goes away,
MLA ranks sharing one copy, and tenants that never share."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from conftest import (
    PAGE,
    NodeFactory,
    attach,
    extra,
    mha_pool,
    mla_pool,
    page_bytes,
    page_keys,
    pool_of,
    prompt,
    slots,
    storage_config,
)
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageExtraInfo

from kvtier.sglang import KvtierHiCacheStorage
from kvtier.testing import corrupt_arena_slots

KINDS_LAYOUTS = [(k, lay) for k in ("mha", "mla") for lay in ("layer_first", "page_first")]


@pytest.mark.parametrize(("kind", "layout"), KINDS_LAYOUTS)
def test_zero_copy_pages_round_trip(node: NodeFactory, kind: str, layout: str) -> None:
    pool = pool_of(kind, layout)
    n = node(pool)
    backend = attach(pool, n.socket)
    keys = page_keys(prompt(3))
    src = [1, 7, 4]
    want = [page_bytes(pool, p) for p in src]

    assert backend.batch_exists(keys) == 0
    assert backend.batch_set_v1(keys, slots(src)) == [True] * 3
    assert backend.batch_exists(keys) == 3
    assert n.stats()["committed"] == 3

    dst = [20, 21, 9]
    assert [page_bytes(pool, p) for p in dst] != want
    assert backend.batch_get_v1(keys, slots(dst)) == [True] * 3
    assert [page_bytes(pool, p) for p in dst] == want
    # Nothing beside the destination pages changed.
    assert page_bytes(pool, 8) != want[2] and page_bytes(pool, 10) != want[2]
    assert backend.counters()["loaded_pages"] == 3


@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_exists_is_the_longest_stored_prefix(node: NodeFactory, kind: str) -> None:
    pool = pool_of(kind, "page_first")
    backend = attach(pool, node(pool).socket)
    keys = page_keys(prompt(5))
    assert backend.batch_set_v1(keys[:3], slots([0, 1, 2])) == [True] * 3
    assert backend.batch_exists(keys) == 3
    assert backend.batch_exists(keys[:2]) == 2
    assert backend.batch_exists(keys[3:]) == 0
    assert backend.exists(keys[2]) and not backend.exists(keys[3])
    # A gap ends the prefix even where later pages are stored.
    assert backend.batch_set_v1(keys[4:], slots([4])) == [True]
    assert backend.batch_exists(keys) == 3
    # Loads stop at the prefix too: the pages after it are misses.
    got = backend.batch_get_v1(keys, slots([10, 11, 12, 13, 14]))
    assert got == [True, True, True, False, False]


@pytest.mark.parametrize(("kind", "layout"), KINDS_LAYOUTS)
def test_flat_pages_are_the_same_pages(node: NodeFactory, kind: str, layout: str) -> None:
    """SGLang without ``interface_v1`` hands flat page tensors: they store the
    bytes the zero-copy path stores, under the same keys."""
    pool = pool_of(kind, layout)
    backend = attach(pool, node(pool).socket)
    keys = page_keys(prompt(4, base=5))
    flat = [pool.get_data_page(p * PAGE, flat=True) for p in (2, 3)]
    assert backend.batch_set(keys[:2], flat)
    assert backend.set(keys[2], pool.get_data_page(6 * PAGE, flat=True))
    assert backend.exists(keys[2])
    # Flat-page stores, zero-copy load.
    assert backend.batch_get_v1(keys[:3], slots([30, 31, 32])) == [True] * 3
    assert [page_bytes(pool, p) for p in (30, 31, 32)] == [page_bytes(pool, p) for p in (2, 3, 6)]
    # Zero-copy store, flat-page load into SGLang's dummy pages, written
    # back the way SGLang's generic path does.
    assert backend.batch_set_v1(keys[3:], slots([11])) == [True]
    got = backend.batch_get(keys, [pool.get_dummy_flat_data_page() for _ in keys])
    assert isinstance(got, list) and all(t is not None for t in got)
    for i, t in enumerate(got):
        assert t is not None
        pool.set_from_flat_data_page((24 + i) * PAGE, t)
    assert [page_bytes(pool, 24 + i) for i in range(4)] == [page_bytes(pool, p) for p in (2, 3, 6, 11)]
    one = backend.get(keys[3], pool.get_dummy_flat_data_page())
    assert one is not None and bytes(one.view(torch.uint8).numpy()) == page_bytes(pool, 11)
    assert backend.get(page_keys(prompt(1, base=999))[0], pool.get_dummy_flat_data_page()) is None


def test_a_second_store_is_a_dedup_hit(node: NodeFactory) -> None:
    pool = mha_pool("layer_first")
    n = node(pool)
    backend = attach(pool, n.socket)
    keys = page_keys(prompt(2))
    assert backend.batch_set_v1(keys, slots([0, 1])) == [True, True]
    assert backend.batch_set_v1(keys, slots([0, 1])) == [True, True]
    c = backend.counters()
    assert (c["stored_pages"], c["dedup_pages"]) == (2, 2)
    assert n.stats()["committed"] == 2


@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
def test_a_corrupted_page_is_a_miss_and_is_replaced(node: NodeFactory, layout: str) -> None:
    pool = mha_pool(layout)
    n = node(pool)
    backend = attach(pool, n.socket)
    keys = page_keys(prompt(3))
    want = [page_bytes(pool, p) for p in (0, 1, 2)]
    assert backend.batch_set_v1(keys, slots([0, 1, 2])) == [True] * 3
    corrupt_arena_slots(n.daemon.env["KVTIER_MEMORY__SHM_NAME"])

    assert backend.batch_get_v1(keys, slots([20, 21, 22])) == [False] * 3
    c = backend.counters()
    assert c["load_failed_pages"] == 3 and c["loaded_pages"] == 0
    # The bad pages were removed: a new store writes good bytes again.
    assert backend.batch_exists(keys) == 0
    assert backend.batch_set_v1(keys, slots([0, 1, 2])) == [True] * 3
    assert backend.counters()["stored_pages"] == 6
    assert backend.batch_get_v1(keys, slots([20, 21, 22])) == [True] * 3
    assert [page_bytes(pool, p) for p in (20, 21, 22)] == want


def test_a_missing_daemon_is_a_miss_with_one_warning_then_reconnects(
    node: NodeFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pool = mla_pool("layer_first")
    data = tmp_path / "later"
    backend = attach(pool, data / "node.sock", reconnect_interval=0)
    keys = page_keys(prompt(2))
    caplog.set_level(logging.INFO, logger="kvtier.sglang")
    for _ in range(3):
        assert backend.batch_exists(keys) == 0
        assert backend.batch_set_v1(keys, slots([0, 1])) == [False, False]
        assert backend.batch_get_v1(keys, slots([5, 6])) == [False, False]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "unavailable" in warnings[0].getMessage()

    n = node(pool, data=data)
    assert backend.batch_set_v1(keys, slots([0, 1])) == [True, True]
    assert backend.batch_exists(keys) == 2
    assert any("is back" in r.getMessage() for r in caplog.records)

    # Gone again while connected (killed), then restarted.
    n.daemon.kill()
    caplog.clear()
    assert backend.batch_exists(keys) == 0
    assert backend.batch_get_v1(keys, slots([5, 6])) == [False, False]
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    # On the killed daemon's arena, as a restart after a crash (which
    # adopts it and removes it at its clean stop: nothing left in /dev/shm).
    node(pool, data=data, KVTIER_MEMORY__SHM_NAME=n.daemon.env["KVTIER_MEMORY__SHM_NAME"])
    assert backend.batch_set_v1(keys, slots([0, 1])) == [True, True]
    assert backend.batch_get_v1(keys, slots([5, 6])) == [True, True]
    assert [page_bytes(pool, p) for p in (5, 6)] == [page_bytes(pool, p) for p in (0, 1)]


def test_a_node_of_another_shape_refuses_with_one_warning(
    node: NodeFactory, caplog: pytest.LogCaptureFixture
) -> None:
    other = mha_pool("page_first")
    n = node(other)
    pool = mha_pool("layer_first")
    backend = attach(pool, n.socket)
    caplog.set_level(logging.WARNING, logger="kvtier.sglang")
    keys = page_keys(prompt(1))
    assert backend.batch_set_v1(keys, slots([0])) == [False]
    assert backend.batch_exists(keys) == 0
    refused = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 1 and "layers" in refused[0].getMessage()


@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
def test_mla_ranks_share_one_stored_copy(node: NodeFactory, layout: str) -> None:
    """MLA pages are the same on every TP rank: all ranks use one namespace,
    so a page is stored once and the second rank's store is a dedup hit
    (SGLang lets only rank 0 write; this holds if both do)."""
    pools = [mla_pool(layout, seed=3), mla_pool(layout, seed=3)]
    n = node(pools[0])
    ranks = [attach(p, n.socket, tp=(r, 2)) for r, p in enumerate(pools)]
    assert ranks[0].storage_config.is_storage_writer and not ranks[1].storage_config.is_storage_writer
    keys = page_keys(prompt(4))
    assert ranks[0].batch_set_v1(keys, slots([0, 1, 2, 3])) == [True] * 4
    assert ranks[1].batch_exists(keys) == 4
    assert ranks[1].batch_set_v1(keys, slots([0, 1, 2, 3])) == [True] * 4
    c0, c1 = ranks[0].counters(), ranks[1].counters()
    assert (c0["stored_pages"], c1["stored_pages"], c1["dedup_pages"]) == (4, 0, 4)
    s = n.stats()
    assert s["committed"] == 4 and s["reserve_already_stored"] == 4
    assert ranks[1].batch_get_v1(keys, slots([10, 11, 12, 13])) == [True] * 4
    assert [page_bytes(pools[1], p) for p in (10, 11, 12, 13)] == [page_bytes(pools[0], p) for p in (0, 1, 2, 3)]


def test_mha_ranks_keep_their_own_pages(node: NodeFactory) -> None:
    pools = [mha_pool("page_first"), mha_pool("page_first")]
    n = node(pools[0])
    ranks = [attach(p, n.socket, tp=(r, 2)) for r, p in enumerate(pools)]
    keys = page_keys(prompt(2))
    assert ranks[0].batch_set_v1(keys, slots([0, 1])) == [True, True]
    assert ranks[1].batch_exists(keys) == 0
    assert ranks[1].batch_get_v1(keys, slots([5, 6])) == [False, False]
    assert ranks[1].batch_set_v1(keys, slots([0, 1])) == [True, True]
    assert ranks[1].counters()["stored_pages"] == 2
    assert n.stats()["committed"] == 4


@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_tenants_never_share_pages(node: NodeFactory, kind: str) -> None:
    """A tenant is named by ``extra_info["cache_salt"]`` (its own namespace),
    and SGLang also seeds its page hashes with a request's cache salt. Either
    way, tenant B never hits tenant A's pages for the same tokens."""
    pool = pool_of(kind, "page_first")
    n = node(pool)
    backend = attach(pool, n.socket)
    tokens = prompt(3)

    # The same keys, two tenants.
    keys = page_keys(tokens)
    a, b = extra("tenant-a"), extra("tenant-b")
    assert backend.batch_set_v1(keys, slots([0, 1, 2]), a) == [True] * 3
    assert backend.batch_exists(keys, a) == 3
    assert backend.batch_exists(keys, b) == 0
    assert backend.batch_exists(keys, HiCacheStorageExtraInfo(prefix_keys=None)) == 0
    assert backend.batch_exists(keys) == 0
    assert backend.batch_get_v1(keys, slots([10, 11, 12]), b) == [False] * 3
    # B's own store is a new copy, not a dedup hit on A's.
    assert backend.batch_set_v1(keys, slots([3, 4, 5]), b) == [True] * 3
    assert backend.counters()["dedup_pages"] == 0
    assert backend.batch_get_v1(keys, slots([10, 11, 12]), a) == [True] * 3
    assert [page_bytes(pool, p) for p in (10, 11, 12)] == [page_bytes(pool, p) for p in (0, 1, 2)]
    assert backend.batch_get_v1(keys, slots([10, 11, 12]), b) == [True] * 3
    assert [page_bytes(pool, p) for p in (10, 11, 12)] == [page_bytes(pool, p) for p in (3, 4, 5)]

    # SGLang's own keys for salted requests differ per salt.
    salted_a, salted_b = page_keys(tokens, "A"), page_keys(tokens, "B")
    assert salted_a != salted_b != keys
    assert backend.batch_set_v1(salted_a, slots([6, 7, 8])) == [True] * 3
    assert backend.batch_exists(salted_b) == 0
    assert n.stats()["committed"] == 9


def test_clear_removes_what_this_engine_stored(node: NodeFactory) -> None:
    pool = mla_pool("page_first")
    n = node(pool)
    backend = attach(pool, n.socket)
    keys = page_keys(prompt(3))
    assert backend.batch_set_v1(keys, slots([0, 1, 2]), extra("t")) == [True] * 3
    assert backend.batch_set_v1(keys[:1], slots([0])) == [True]
    backend.clear()
    assert backend.batch_exists(keys, extra("t")) == 0
    assert backend.batch_exists(keys) == 0
    assert n.stats()["removed"] == 4


def test_storage_metrics(node: NodeFactory) -> None:
    pool = mha_pool("page_first")
    backend = attach(pool, node(pool).socket, metrics=True)
    keys = page_keys(prompt(2))
    backend.batch_set_v1(keys, slots([0, 1]))
    backend.batch_get_v1(keys, slots([5, 6]))
    m = backend.get_stats()
    assert (m.backup_pgs, m.prefetch_pgs) == ([2], [2])
    assert m.backup_bandwidth[0] > 0 and m.prefetch_bandwidth[0] > 0
    m2 = backend.get_stats()
    assert (m2.backup_pgs, m2.prefetch_pgs) == ([], [])
    assert attach(pool, Path("/nonexistent")).get_stats() is None


def test_settings_and_pools_it_cannot_take_are_refused(tmp_path: Path) -> None:
    pool = mha_pool("layer_first")
    with pytest.raises(ValueError, match="unknown kvtier storage settings"):
        attach(pool, tmp_path / "s", sockte="x")
    cfg = storage_config(socket=tmp_path / "s")
    cfg.should_split_heads = True
    with pytest.raises(ValueError, match="tp_lcm_size"):
        KvtierHiCacheStorage(cfg)
    backend = attach(pool, tmp_path / "s")
    backend.register_mem_host_pool_v2(pool, "kv")
    with pytest.raises(ValueError, match="mamba"):
        backend.register_mem_host_pool_v2(mla_pool("layer_first"), "mamba")
