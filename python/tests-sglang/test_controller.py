"""SGLang's own HiCache controller code driving the backend: its backup
(``_page_backup``), its storage hit query (``_storage_hit_query``, which
hashes the tokens itself) and its prefetch transfer (``_page_transfer``),
with the page functions SGLang picks for a ``dynamic`` backend with and
without ``interface_v1``. The controller is SGLang's ``HiCacheController``
with only the attributes those methods read (its constructor needs CUDA
streams and process groups)."""

from __future__ import annotations

from array import array
from queue import Queue
from typing import Any

import pytest
from conftest import PAGE, NodeFactory, attach, page_bytes, pool_of, prompt, slots
from sglang.srt.managers.cache_controller import HiCacheController, PrefetchOperation, StorageOperation
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.utils import get_storage_hash_str

from kvtier.sglang import KvtierHiCacheStorage


def controller(backend: KvtierHiCacheStorage, pool: Any, interface_v1: bool) -> HiCacheController:
    ctl = HiCacheController.__new__(HiCacheController)
    ctl.storage_backend = backend
    ctl.page_size = PAGE
    ctl.mem_pool_host = pool
    ctl.storage_host_pool = pool
    ctl.prefetch_sync_queue = Queue()
    # What attach_storage_backend picks for "dynamic" (interface_v1 or not).
    if interface_v1:
        ctl.page_get_func, ctl.page_set_func = ctl._page_get_zero_copy, ctl._page_set_zero_copy
    else:
        ctl.page_get_func, ctl.page_set_func = ctl._generic_page_get, ctl._generic_page_set
    return ctl


@pytest.mark.parametrize("interface_v1", [True, False], ids=["v1", "generic"])
@pytest.mark.parametrize(("kind", "layout"), [(k, lay) for k in ("mha", "mla") for lay in ("layer_first", "page_first")])
def test_backup_hit_query_and_prefetch(node: NodeFactory, kind: str, layout: str, interface_v1: bool) -> None:
    pool = pool_of(kind, layout)
    backend = attach(pool, node(pool).socket, interface_v1=int(interface_v1))
    ctl = controller(backend, pool, interface_v1)
    tokens = RadixKey(array("q", prompt(5)), cache_salt="tenant-x")
    keys = get_storage_hash_str(tokens, None, page_size=PAGE)
    assert isinstance(keys, list) and len(keys) == 5

    # Backup of the first three pages (SGLang writes what it computed).
    backup = StorageOperation(slots([2, 3, 4]), prompt(3), hash_value=keys[:3])
    ctl._page_backup(backup)
    assert backup.completed_tokens == 3 * PAGE

    # The hit query hashes the request's tokens itself: three pages hit.
    fetch = PrefetchOperation("req-1", tokens)
    hashes, hit_tokens = ctl._storage_hit_query(fetch)
    assert (hashes, hit_tokens) == (keys[:3], 3 * PAGE)

    # The prefetch reads them into the host slots SGLang allocated.
    fetch.hash_value = hashes
    fetch.host_indices = slots([20, 21, 22])
    assert ctl._page_transfer(fetch) == 3
    ack = ctl.prefetch_sync_queue.get_nowait()
    assert ack.completed_tokens == 3 * PAGE
    assert [page_bytes(pool, p) for p in (20, 21, 22)] == [page_bytes(pool, p) for p in (2, 3, 4)]

    # Another tenant's request for the same tokens finds nothing.
    other = PrefetchOperation("req-2", RadixKey(array("q", prompt(5)), cache_salt="tenant-y"))
    assert ctl._storage_hit_query(other) == ([], 0)
