"""vLLM reuses KV blocks through kvtier, end to end."""

from __future__ import annotations

import gc
import time
from pathlib import Path

from conftest import BLOCK_TOKENS, daemon_env
from engines import (
    PROMPT,
    PROMPTS,
    Events,
    cached_by_source,
    connected,
    corrupt_every_slot,
    distinct_blocks,
    engine_process,
    node_stats,
    probe,
    run,
    run_all,
    uncached_outputs,
    usable_tokens,
)
from kvtier.testing import Daemon, start_daemon
from kvtier.vllm import reset_prefix_cache
from vllm.distributed.kv_events import BlockStored


def test_prompts_with_shared_prefixes_are_served_from_kvtier(daemon: Daemon, model_dir: Path) -> None:
    expected = uncached_outputs(model_dir, PROMPTS)
    events = Events()
    llm = events.attach(connected(model_dir, daemon.socket, kv_events_config=events.config()))

    first, cached = run_all(llm, PROMPTS)
    assert first == expected
    # Every distinct full prompt block, each stored once (shared prefixes
    # included).
    distinct = distinct_blocks(PROMPTS)
    reset_prefix_cache(llm)
    assert node_stats(daemon)["committed"] == distinct

    before = cached_by_source(llm)
    second, cached = run_all(llm, PROMPTS)
    assert second == expected
    # Every full prompt block comes from kvtier (or, for a prefix shared
    # within the batch, from the blocks kvtier just filled).
    full_block_tokens = sum(len(p) // BLOCK_TOKENS * BLOCK_TOKENS for p in PROMPTS)
    assert sum(cached) >= 0.9 * full_block_tokens, cached
    assert cached == [usable_tokens(p) for p in PROMPTS]
    # vLLM's metrics say which tier the tokens came from: host memory (G2).
    after = cached_by_source(llm)
    gained = {s: after.get(s, 0) - before.get(s, 0) for s in after}
    assert gained.get("host", 0) > 0 and gained.get("disk", 0) == 0, gained
    assert gained.get("host", 0) + gained.get("device", 0) == sum(cached), gained

    # Our KV events: each stored block once, in host memory ("CPU").
    stored = events.wait_for(BlockStored, medium="CPU", want=distinct)
    assert len(stored) == distinct


def test_a_corrupted_block_is_recomputed_never_served(daemon: Daemon, model_dir: Path) -> None:
    llm = connected(model_dir, daemon.socket)
    expected, _ = run(llm, PROMPT)
    reset_prefix_cache(llm)
    corrupt_every_slot(daemon)
    # Every block fails verification: vLLM recomputes, the output stands.
    again, _ = run(llm, PROMPT)
    assert again == expected
    # The connector removed the bad blocks, so the prompt is stored again
    # and then served from kvtier.
    reset_prefix_cache(llm)
    run(llm, PROMPT)
    reset_prefix_cache(llm)
    third, cached = run(llm, PROMPT)
    assert third == expected
    assert cached == usable_tokens(PROMPT)


def test_without_a_daemon_the_engine_runs_uncached(tmp_path: Path, model_dir: Path) -> None:
    llm = connected(model_dir, tmp_path / "nobody-listens.sock")
    first, _ = run(llm, PROMPT)
    reset_prefix_cache(llm)
    second, cached = run(llm, PROMPT)
    assert second == first and cached == 0


def wait_until_on_disk(daemon: Daemon, blocks: int, timeout: float = 60.0) -> None:
    """Waits for the node to report ``blocks`` blocks in G3 (inclusive mode
    writes new blocks to disk in the background)."""
    client = probe(daemon)
    deadline = time.monotonic() + timeout
    while client.stats()["blocks_g3"] < blocks:
        assert time.monotonic() < deadline, client.stats()
        time.sleep(0.05)


def test_daemon_and_engine_restarts(tmp_path: Path, model_dir: Path) -> None:
    """The daemon killed (SIGKILL) while the engine runs: the engine serves
    uncached, then reconnects to the restarted daemon and is served from it
    again; after a clean restart of the daemon, a restarted engine loads the
    prompt from the disk tier. (A SIGKILL loses no acknowledged block:
    crates/cli/tests/node_crash.rs checks that; this test checks the
    engine's side of a restart.)"""
    expected = uncached_outputs(model_dir, [PROMPT])[0]
    daemon = start_daemon(tmp_path / "data", daemon_env(KVTIER_MANAGER__MODE="inclusive"))
    try:
        llm = connected(model_dir, daemon.socket)
        tokens, cached = run(llm, PROMPT)
        assert tokens == expected and cached == 0
        reset_prefix_cache(llm)
        wait_until_on_disk(daemon, len(PROMPT) // BLOCK_TOKENS)

        daemon.kill()
        tokens, cached = run(llm, PROMPT)
        assert tokens == expected and cached == 0, "the daemon is down: nothing can be loaded"
        reset_prefix_cache(llm)

        daemon = daemon.restart()
        tokens, _ = run(llm, PROMPT)
        assert tokens == expected
        reset_prefix_cache(llm)
        tokens, cached = run(llm, PROMPT)
        assert tokens == expected and cached == usable_tokens(PROMPT), "reconnected and served again"
        del llm
        gc.collect()

        daemon.stop()
        daemon = daemon.restart()
        llm = connected(model_dir, daemon.socket)
        tokens, cached = run(llm, PROMPT)
        assert tokens == expected and cached == usable_tokens(PROMPT)
        assert cached_by_source(llm).get("disk", 0) == cached
    finally:
        daemon.stop()


def test_two_engine_processes_share_one_daemon(daemon: Daemon, model_dir: Path) -> None:
    """Two engines in vLLM's multi-process mode (scheduler and worker in
    different processes, each a client of the daemon), one after the
    other: the second reuses what the first stored."""
    [first] = engine_process(model_dir, daemon)
    assert first["cached"] == 0
    [second] = engine_process(model_dir, daemon)
    assert second["cached"] == usable_tokens(PROMPT)
    assert second["tokens"] == first["tokens"]
    assert node_stats(daemon)["loaded"] >= usable_tokens(PROMPT) // BLOCK_TOKENS


def test_tensor_parallel_ranks_store_and_load_their_own_heads(tmp_path: Path, model_dir: Path) -> None:
    """TP=2: each rank is its own client with its own KV heads (one of the
    tiny Llama's two), so the daemon holds the per-rank shape; the second
    run loads every full block on both ranks."""
    daemon = start_daemon(tmp_path / "data", daemon_env(KVTIER_GEOMETRY__KV_HEADS="1"))
    try:
        first, second = engine_process(model_dir, daemon, tp=2, runs=2)
        assert first["cached"] == 0
        assert second["cached"] == usable_tokens(PROMPT)
        assert second["tokens"] == first["tokens"]
        stats = node_stats(daemon, layer_bytes=8192)
        blocks = len(PROMPT) // BLOCK_TOKENS
        assert stats["committed"] == 2 * blocks, stats
        assert stats["loaded"] == 2 * (usable_tokens(PROMPT) // BLOCK_TOKENS), stats
    finally:
        daemon.stop()
