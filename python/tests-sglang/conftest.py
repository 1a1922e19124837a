"""SGLang's own HiCache pieces against a real ``kvtier serve``.

The host pools are SGLang's classes (``MHATokenToKVPoolHost``,
``MLATokenToKVPoolHost``) built through their own constructors on CPU
tensors (``pin_memory=False``: no CUDA here); the backend is built the way
SGLang builds a ``dynamic`` one (``StorageBackendFactory.create_backend``)
and handed the pool as SGLang's cache controller does; page keys are
SGLang's own storage hashes (``get_storage_hash_str``). Each test starts
its own daemon, with the geometry the pool's pages need.

A missing binary fails the tests (it is not a reason to skip them).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo, MLABufferInfo
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig, HiCacheStorageExtraInfo
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
from sglang.srt.mem_cache.utils import get_storage_hash_str

import kvtier
from kvtier.sglang import KvtierHiCacheStorage, PageLayout
from kvtier.testing import Daemon, DaemonError, start_daemon

#: A small model: 3 layers, 2 KV heads of 16 (MHA) or a latent of 24 (MLA:
#: 16 + 8 rope), pages of 4 tokens, float32.
LAYERS = 3
HEADS = 2
HEAD_DIM = 16
KV_LORA_RANK = 16
ROPE_DIM = 8
PAGE = 4
DEVICE_TOKENS = 64

MODEL = "sglang-tiny"


def mha_pool(layout: str, dtype: torch.dtype = torch.float32) -> MHATokenToKVPoolHost:
    """SGLang's MHA host pool for device buffers of ``DEVICE_TOKENS`` tokens,
    twice as large (SGLang's ``--hicache-ratio 2``), filled with random data."""
    k = tuple(torch.zeros(DEVICE_TOKENS, HEADS, HEAD_DIM, dtype=dtype) for _ in range(LAYERS))
    v = tuple(torch.zeros(DEVICE_TOKENS, HEADS, HEAD_DIM, dtype=dtype) for _ in range(LAYERS))
    buffers = KVBuffers(
        k=k,
        v=v,
        k_data_ptrs=torch.tensor([t.data_ptr() for t in k], dtype=torch.uint64),
        v_data_ptrs=torch.tensor([t.data_ptr() for t in v], dtype=torch.uint64),
        layout=KVBufferLayout.NHD,
    )
    info = MHABufferInfo(
        buffers=buffers,
        page_size=PAGE,
        head_num=HEADS,
        head_dim=HEAD_DIM,
        v_head_dim=HEAD_DIM,
        dtype=dtype,
        device=torch.device("cpu"),
    )
    pool = MHATokenToKVPoolHost(
        info,
        2.0,
        0,
        PAGE,
        layout,
        pin_memory=False,
        device="cpu",
        device_capacity_tokens=DEVICE_TOKENS,
        start_layer=0,
        end_layer=LAYERS,
    )
    _fill(pool.kv_buffer)
    return pool


def mla_pool(layout: str, dtype: torch.dtype = torch.float32, seed: int = 0) -> MLATokenToKVPoolHost:
    """SGLang's MLA host pool, like :func:`mha_pool`."""
    dim = KV_LORA_RANK + ROPE_DIM
    latent = tuple(torch.zeros(DEVICE_TOKENS, 1, dim, dtype=dtype) for _ in range(LAYERS))
    info = MLABufferInfo(
        buffers=latent,
        data_ptrs=torch.tensor([t.data_ptr() for t in latent], dtype=torch.uint64),
        layer_indices=tuple(range(LAYERS)),
        device_layer_num=LAYERS,
        page_size=PAGE,
        kv_lora_rank=KV_LORA_RANK,
        qk_rope_head_dim=ROPE_DIM,
        kv_cache_dim=dim,
        dtype=dtype,
        device=torch.device("cpu"),
    )
    pool = MLATokenToKVPoolHost(
        info,
        2.0,
        0,
        PAGE,
        layout,
        pin_memory=False,
        device="cpu",
        device_capacity_tokens=DEVICE_TOKENS,
        start_layer=0,
        end_layer=LAYERS,
        target_layer_num=LAYERS,
    )
    _fill(pool.kv_buffer, seed)
    return pool


def _fill(buf: torch.Tensor, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    buf.copy_(torch.randn(buf.shape, generator=g).to(buf.dtype))


def pool_of(kind: str, layout: str) -> Any:
    return mha_pool(layout) if kind == "mha" else mla_pool(layout)


def page_keys(tokens: list[int], salt: str | None = None) -> list[str]:
    """SGLang's storage keys of the whole pages of ``tokens`` (chained SHA-256,
    seeded by the request's cache salt)."""
    keys = get_storage_hash_str(RadixKey(array("q", tokens), cache_salt=salt), None, page_size=PAGE)
    assert isinstance(keys, list)
    return keys


def prompt(n_pages: int, base: int = 0) -> list[int]:
    return [(base + i * 37) % 1000 + 1 for i in range(n_pages * PAGE)]


def slots(pages: list[int]) -> torch.Tensor:
    """Host slots of whole pages, as SGLang hands them (``page_size`` per page)."""
    return torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE, dtype=torch.int64) for p in pages])


def page_bytes(pool: Any, page: int) -> bytes:
    """SGLang's own flat data page, as bytes."""
    flat = pool.get_data_page(page * PAGE, flat=True).contiguous()
    return bytes(flat.view(torch.uint8).numpy())


def extra(salt: str) -> HiCacheStorageExtraInfo:
    return HiCacheStorageExtraInfo(extra_info={"cache_salt": salt})


def storage_config(
    *,
    socket: Path,
    mla: bool = False,
    tp: tuple[int, int] = (0, 1),
    page_first: bool = False,
    metrics: bool = False,
    **settings: Any,
) -> HiCacheStorageConfig:
    """What SGLang's cache controller builds (``_generate_storage_config``)
    for ``--hicache-storage-backend dynamic`` with kvtier's extra config."""
    cfg: dict[str, Any] = dict(
        backend_name="kvtier",
        module_path="kvtier.sglang",
        class_name="KvtierHiCacheStorage",
        interface_v1=1,
        socket=str(socket),
    )
    cfg.update(settings)
    return HiCacheStorageConfig(
        tp_rank=tp[0],
        tp_size=tp[1],
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=mla,
        enable_storage_metrics=metrics,
        is_page_first_layout=page_first,
        model_name=MODEL,
        extra_config=cfg,
    )


def attach(pool: Any, socket: Path, **kw: Any) -> KvtierHiCacheStorage:
    """The backend as SGLang's ``attach_storage_backend`` makes it: through
    the factory, then the host pool registered."""
    mla = isinstance(pool, MLATokenToKVPoolHost)
    config = storage_config(socket=socket, mla=mla, page_first=pool.layout == "page_first", **kw)
    backend = StorageBackendFactory.create_backend("dynamic", config, pool)
    assert isinstance(backend, KvtierHiCacheStorage)
    backend.register_mem_pool_host(pool)
    return backend


def daemon_env(pool: Any, **extra_env: str) -> dict[str, str]:
    """The node's settings for ``pool``'s pages: the geometry the backend
    says it needs, a small arena and disk log."""
    env = PageLayout.of(pool).node_env()
    env.update(
        KVTIER_MEMORY__CAPACITY="2MiB",
        KVTIER_DISK__CAPACITY_PER_DIR="8MiB",
        KVTIER_DISK__REGION_SIZE="1MiB",
    )
    env.update(extra_env)
    return env


@dataclass
class Node:
    """A daemon started for one pool shape, and a way to read its counters."""

    daemon: Daemon
    layout: PageLayout

    @property
    def socket(self) -> Path:
        return self.daemon.socket

    def stats(self) -> dict[str, int]:
        c = kvtier.Client(
            self.socket,
            model="stats-probe",
            dtype="f32",
            layers=self.layout.runs,
            layer_bytes=self.layout.run_bytes,
            block_size_tokens=self.layout.page_size,
        )
        return c.stats()


NodeFactory = Callable[..., Node]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeFactory]:
    """Starts daemons on demand (``node(pool, **env)``); stops them after the test."""
    started: list[Daemon] = []

    def start(pool: Any, data: Path | None = None, **extra_env: str) -> Node:
        try:
            d = start_daemon(data or tmp_path / f"data{len(started)}", daemon_env(pool, **extra_env))
        except DaemonError as e:
            pytest.fail(str(e))
        started.append(d)
        return Node(d, PageLayout.of(pool))

    yield start
    for d in started:
        d.stop()
