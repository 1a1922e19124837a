"""Who shares blocks: engines of different tensor-parallel sizes do (head
shards), tenants do not (cache salts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import BLOCK_TOKENS, MLA_BLOCK_TOKENS, daemon_env, mla_daemon_env
from engines import PROMPT, PROMPTS, Events, connected, engine_process, node_stats, run, usable_tokens
from kvtier.testing import Daemon, start_daemon
from kvtier.vllm import reset_prefix_cache
from kvtier.vllm.config import block_key
from vllm.distributed.kv_events import BlockStored


def test_head_shards_are_shared_across_tp_sizes(tmp_path: Path, weights_dir: Path) -> None:
    """With ``shard_heads=1`` every block is stored as one object per KV
    head, in a namespace of no rank: an engine at TP=2 (one head per rank)
    loads what an engine at TP=1 stored, and the reverse. Real weights: the
    two engines must be one model."""
    daemon = start_daemon(tmp_path / "data", daemon_env(KVTIER_GEOMETRY__KV_HEADS="1"))
    a, b = PROMPTS[0], PROMPTS[3]  # no block in common
    try:
        [a_tp1] = engine_process(weights_dir, daemon, prompts=[a], shard_heads=1, weights=True)
        assert a_tp1["cached"] == 0
        a_tp2, b_tp2 = engine_process(weights_dir, daemon, tp=2, prompts=[a, b], shard_heads=1, weights=True)
        assert a_tp2["cached"] == usable_tokens(a), "TP=2 loads the blocks TP=1 stored"
        assert a_tp2["tokens"] == a_tp1["tokens"]
        assert b_tp2["cached"] == 0
        [b_tp1] = engine_process(weights_dir, daemon, prompts=[b], shard_heads=1, weights=True)
        assert b_tp1["cached"] == usable_tokens(b), "TP=1 loads the blocks TP=2 stored"
        assert b_tp1["tokens"] == b_tp2["tokens"]

        stats = node_stats(daemon, layer_bytes=8192)
        # Two head shards per block, each stored once whichever TP stored it.
        assert stats["committed"] == 2 * (len(a) // BLOCK_TOKENS + len(b) // BLOCK_TOKENS), stats
        # Each load read both shards of every usable block (two ranks of
        # one shard, or one rank of two).
        assert stats["loaded"] == 2 * (usable_tokens(a) + usable_tokens(b)) // BLOCK_TOKENS, stats
    finally:
        daemon.stop()


def test_mla_latents_are_stored_once_for_all_ranks(tmp_path: Path, mla_model_dir: Path) -> None:
    """A latent-attention model at TP=2: both ranks hold the same latent, so
    the connector stores it rank-free (head shards of the one latent). The
    daemon keeps each block once, the second rank's store being a dedup
    hit, and the second run loads every full block on both ranks."""
    daemon = start_daemon(tmp_path / "data", mla_daemon_env())
    try:
        first, second = engine_process(mla_model_dir, daemon, tp=2, runs=2, block_size=MLA_BLOCK_TOKENS)
        usable = (len(PROMPT) - 1) // MLA_BLOCK_TOKENS
        assert first["cached"] == 0
        assert second["cached"] == usable * MLA_BLOCK_TOKENS
        assert second["tokens"] == first["tokens"]
        stats = node_stats(daemon, layer_bytes=MLA_BLOCK_TOKENS * 576 * 4, block_tokens=MLA_BLOCK_TOKENS)
        blocks = len(PROMPT) // MLA_BLOCK_TOKENS
        assert stats["committed"] == blocks, stats
        assert stats["reserve_already_stored"] + stats["reserve_in_flight"] == blocks, stats
        assert stats["loaded"] == 2 * usable, stats
    finally:
        daemon.stop()


def test_tenants_never_share_blocks(daemon: Daemon, model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Identical tokens under two cache salts: tenant B never hits what
    tenant A stored, though A does; at the node, A's keys are found in A's
    namespace only."""
    # Events carrying vLLM's whole hashes (not 64-bit ints): the keys.
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "0")
    events = Events()
    llm = events.attach(connected(model_dir, daemon.socket, kv_events_config=events.config()))
    prompt = PROMPTS[0]
    expected, cached = run(llm, prompt, salt="tenant-a")
    assert cached == 0
    reset_prefix_cache(llm)
    tokens, cached = run(llm, prompt, salt="tenant-b")
    assert cached == 0 and tokens == expected, "B computes its own"
    reset_prefix_cache(llm)
    tokens, cached = run(llm, prompt, salt="tenant-a")
    assert cached == usable_tokens(prompt) and tokens == expected, "A hits its own"

    # Both tenants' blocks are held, each once: the node shares nothing.
    blocks = len(prompt) // BLOCK_TOKENS
    assert node_stats(daemon)["committed"] == 2 * blocks
    # The keys the connector stored for A (vLLM's hashes, from its KV
    # events): in A's namespace, not in B's nor in the unsalted one. (vLLM
    # folds the salt into its hashes too; this checks kvtier's own wall.)
    stored = events.wait_for(BlockStored, medium="CPU", want=2 * blocks)
    # The tiny Llama has one KV-cache group: its clients.
    clients = llm.llm_engine.engine_core.engine_core.scheduler.connector._scheduler._clients[0]
    for keys in ([block_key(h) for h in e.block_hashes] for e in stored):
        found = {salt: clients.call(salt, "lookup", lambda c: c.lookup(keys), []) for salt in ("tenant-a", "tenant-b", None)}
        hits = [salt for salt, tiers in found.items() if tiers]
        assert len(hits) == 1 and hits[0] in ("tenant-a", "tenant-b"), found
