"""A hybrid model (sliding-window and full-attention layers: two KV-cache
groups) through the kvtier connector with vLLM's hybrid KV cache manager
on; kvtier's log lines in vLLM's logging; ``LLM.reset_prefix_cache()``
right after ``generate``."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import kvtier
from conftest import BLOCK_TOKENS
from engines import (
    LAYER_BYTES,
    LAYERS,
    PROMPTS,
    connected,
    distinct_blocks,
    node_stats,
    run_all,
    uncached_outputs,
    usable_tokens,
)
from kvtier.testing import Daemon
from kvtier.vllm.clients import Clients
from kvtier.vllm.config import KvtierConfig, Shape, namespace_of
from kvtier.vllm.groups import Group, groups_of
from kvtier.vllm.layouts import RankBlocks
from kvtier.vllm.scheduler import KvtierScheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec


class _Lines(logging.Handler):
    """kvtier's lines that reach vLLM's root logger (``vllm``), as vLLM's
    own handler shows them. (Text only: a record may hold a traceback, and
    with it the engine.)"""

    def __init__(self, shown_by: logging.Handler) -> None:
        super().__init__(logging.DEBUG)
        self.shown_by = shown_by
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("kvtier"):
            self.lines.append(self.shown_by.format(record))


@contextmanager
def vllm_log() -> Iterator[_Lines]:
    """kvtier's lines that vLLM's own logger tree handles meanwhile (vLLM
    stops propagation at ``vllm``: a record outside that tree never reaches
    vLLM's handler)."""
    root = logging.getLogger("vllm")
    assert root.handlers, "vLLM configured no handler"
    records = _Lines(root.handlers[0])
    root.addHandler(records)
    try:
        yield records
    finally:
        root.removeHandler(records)


def record_loads(llm: Any) -> list[tuple[int, int]]:
    """(group, blocks) of each load the scheduler side plans from now on."""
    connector = llm.llm_engine.engine_core.engine_core.scheduler.connector
    build = connector.build_connector_meta
    loads: list[tuple[int, int]] = []

    # Ints only: the engine must not end up holding the test.
    def record(scheduler_output: Any) -> Any:
        meta = build(scheduler_output)
        loads.extend((t.group, len(t.block_ids)) for t in meta.loads)
        return meta

    connector.build_connector_meta = record
    return loads


def test_a_sliding_window_model_is_served_group_by_group(daemon: Daemon, hybrid_model_dir: Path) -> None:
    expected = uncached_outputs(hybrid_model_dir, PROMPTS, load_format="safetensors")
    with vllm_log() as log:
        llm = connected(hybrid_model_dir, daemon.socket, load_format="safetensors")
    groups = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_config.kv_cache_groups
    # The connector keeps vLLM's hybrid KV cache manager on (SupportsHMA).
    assert [type(g.kv_cache_spec) for g in groups] == [SlidingWindowSpec, FullAttentionSpec]

    # The start-up line goes through vLLM's handler, in vLLM's format:
    # route, socket, the shape the daemon must hold, the groups.
    started = [line for line in log.lines if "kvtier connector (KvtierConnector, SCHEDULER" in line]
    assert len(started) == 1, log.lines
    assert " INFO " in started[0] and "[connector.py:" in started[0], started[0]
    assert str(daemon.socket) in started[0] and "2 layers of 16384 bytes per stored object" in started[0]
    assert "2 KV-cache groups" in started[0], started[0]

    first, _ = run_all(llm, PROMPTS)
    assert first == expected
    # The saves of the finished requests do not hold vLLM's blocks.
    assert llm.reset_prefix_cache()
    # Every distinct full prompt block, once in each group's namespace.
    assert node_stats(daemon)["committed"] == 2 * distinct_blocks(PROMPTS)

    loads = record_loads(llm)
    second, cached = run_all(llm, PROMPTS)
    assert second == expected
    # The full group loads every usable block, the window only the two
    # blocks of its window at the end of each prompt.
    assert sum(n for g, n in loads if g == 1) == sum(usable_tokens(p) for p in PROMPTS) // BLOCK_TOKENS, loads
    assert [n for g, n in loads if g == 0] == [2] * len(PROMPTS), loads
    full_block_tokens = sum(len(p) // BLOCK_TOKENS * BLOCK_TOKENS for p in PROMPTS)
    assert sum(cached) >= 0.9 * full_block_tokens, cached
    assert cached == [usable_tokens(p) for p in PROMPTS]


def _window_scheduler(daemon: Daemon) -> tuple[KvtierScheduler, list[kvtier.Client]]:
    """A scheduler side over two groups of the tiny hybrid's shape (a
    sliding window of two blocks, then full attention), and a client of
    each group's namespace."""
    shape = Shape(model="hybrid-probe", dtype="float32", layout="probe", block_size=BLOCK_TOKENS, layers=LAYERS, layer_bytes=LAYER_BYTES)
    groups = [Group(0, ("l0", "l2"), window=2 * BLOCK_TOKENS), Group(1, ("l1", "l3"), window=None)]
    config = KvtierConfig(socket=str(daemon.socket))
    shapes = [dataclasses.replace(shape, layout=f"probe group={g.index}") for g in groups]
    clients = [Clients(config, s, 0, 1) for s in shapes]
    direct = [kvtier.Client(str(daemon.socket), **namespace_of(config, s, None, 0, 1)) for s in shapes]
    return KvtierScheduler(shape, groups, clients, RankBlocks(), workers=1), direct


def _store(client: kvtier.Client, keys: list[int]) -> None:
    block = bytes(LAYERS * LAYER_BYTES)
    assert set(client.store_buffers(keys, [block] * len(keys))) == {"stored"}


def test_a_window_offers_only_the_blocks_its_group_holds(daemon: Daemon) -> None:
    """A prefix is offered only as far as the full-attention group holds
    it and the sliding window holds the blocks of its window at its end."""
    scheduler, (window, full) = _window_scheduler(daemon)
    keys = list(range(1, 11))

    def hit() -> int:
        return len(scheduler._hit(None, keys)[0])

    _store(full, keys)
    assert hit() == 0, "the window group holds nothing"
    _store(window, keys[:4])
    assert hit() == 4, "the window's own prefix: its window at block 4 is held"
    _store(window, keys[8:])
    assert hit() == 10, "the window at the end (blocks 8 and 9) is held"
    full.remove(keys[6:7])
    assert hit() == 4, "the full group holds 6 blocks, the window not its blocks 4 and 5"
    _store(window, keys[4:6])
    assert hit() == 6


def _config(*specs: Any) -> Any:
    """A vLLM ``KVCacheConfig`` of one group of two layers per spec."""
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    groups = [KVCacheGroupSpec([f"l{2 * i}", f"l{2 * i + 1}"], spec) for i, spec in enumerate(specs)]
    return KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=groups)


def test_groups_kvtier_serves_and_those_it_does_not() -> None:
    import torch
    from vllm.v1.kv_cache_interface import MambaSpec

    full = FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=32, dtype=torch.float32)
    window = SlidingWindowSpec(block_size=32, num_kv_heads=2, head_size=32, dtype=torch.float32, sliding_window=64)
    groups, why = groups_of(_config(window, full))
    assert why is None and [(g.window, g.layer_names) for g in groups] == [(64, ("l0", "l1")), (None, ("l2", "l3"))]
    # vLLM keeps the tokens from ``end - window + 1`` on: at 10 blocks of
    # 32 tokens, blocks 8 and 9; at one block, that block.
    assert groups[0].first_needed(10, 32) == 8 and groups[0].first_needed(1, 32) == 0
    assert groups[1].first_needed(10, 32) == 0

    state = MambaSpec(block_size=32, shapes=((4, 8),), dtypes=(torch.float32,))
    _, why = groups_of(_config(full, state))
    assert why is not None and "MambaSpec" in why
    wide = FullAttentionSpec(block_size=32, num_kv_heads=4, head_size=32, dtype=torch.float32)
    _, why = groups_of(_config(window, wide))
    assert why is not None and "pages differ" in why
