"""vLLM reuses KV blocks through kvtier, end to end."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import kvtier
import msgspec
import zmq
from conftest import BLOCK_TOKENS, daemon_env
from kvtier.testing import Daemon, start_daemon
from kvtier.vllm import reset_prefix_cache
from vllm import LLM, SamplingParams
from vllm.config import KVEventsConfig, KVTransferConfig
from vllm.distributed.kv_events import BlockStored, KVEventBatch

# Prompts sharing prefixes: a 160-token system prompt, two of them a
# further 96 tokens, then tails of their own.
SYSTEM = [(i * 37 + 11) % 997 + 3 for i in range(160)]
BRANCH = [(i * 53 + 7) % 991 + 3 for i in range(96)]
PROMPTS = [
    SYSTEM + BRANCH + [(i * 17 + 5) % 983 + 3 for i in range(60)],
    SYSTEM + BRANCH + [(i * 29 + 1) % 977 + 3 for i in range(75)],
    SYSTEM + [(i * 41 + 9) % 971 + 3 for i in range(140)],
    [(i * 13 + 2) % 967 + 3 for i in range(230)],
]
PROMPT = PROMPTS[0]
SAMPLING = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, detokenize=False)


def usable_tokens(prompt: list[int]) -> int:
    """Prompt tokens an external cache can supply: whole blocks, leaving
    vLLM at least the last token to compute."""
    return (len(prompt) - 1) // BLOCK_TOKENS * BLOCK_TOKENS


def engine(model_dir: Path, socket_path: Path | None, **kw: Any) -> LLM:
    if socket_path is not None:
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector="KvtierConnector",
            kv_connector_module_path="kvtier.vllm",
            kv_role="kv_both",
            kv_connector_extra_config={"socket": str(socket_path), "reconnect_interval": 0.1},
            kv_load_failure_policy="recompute",
        )
    return LLM(
        model=str(model_dir),
        load_format="dummy",
        skip_tokenizer_init=True,
        enforce_eager=True,
        max_model_len=1024,
        block_size=BLOCK_TOKENS,
        enable_prefix_caching=True,
        dtype="float32",
        seed=0,
        kv_cache_memory_bytes=64 << 20,
        disable_log_stats=False,
        **kw,
    )


def run_all(llm: LLM, prompts: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """Greedy output tokens, and the prompt tokens vLLM did not compute, of
    each prompt (one batch)."""
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], SAMPLING, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs], [int(o.num_cached_tokens or 0) for o in outs]


def run(llm: LLM, prompt: list[int]) -> tuple[list[int], int]:
    tokens, cached = run_all(llm, [prompt])
    return tokens[0], cached[0]


def uncached_outputs(model_dir: Path, prompts: list[list[int]]) -> list[list[int]]:
    """The outputs of vLLM without kvtier."""
    llm = engine(model_dir, None)
    tokens, _ = run_all(llm, prompts)
    del llm
    gc.collect()
    return tokens


def probe(daemon: Daemon, layer_bytes: int = 16384) -> kvtier.Client:
    """A client of the daemon, outside vLLM's namespaces."""
    # The geometry of the tiny Llama: 2 layers of 16 KiB per block (8 KiB
    # per TP rank at TP=2).
    return kvtier.Client(daemon.socket, model="probe", dtype="f32", layers=2, layer_bytes=layer_bytes, block_size_tokens=BLOCK_TOKENS)


def node_stats(daemon: Daemon, layer_bytes: int = 16384) -> dict[str, int]:
    return probe(daemon, layer_bytes).stats()


def cached_by_source(llm: LLM) -> dict[str, int]:
    """vLLM's ``prompt_tokens_cached_by_source`` counter, by source."""
    out: dict[str, int] = {}
    for m in llm.get_metrics():
        if m.name == "vllm:prompt_tokens_cached_by_source":
            source = m.labels["source"]
            out[source] = out.get(source, 0) + int(getattr(m, "value", 0))
    return out


def test_prompts_with_shared_prefixes_are_served_from_kvtier(daemon: Daemon, model_dir: Path, tmp_path: Path) -> None:
    expected = uncached_outputs(model_dir, PROMPTS)
    events = f"ipc://{tmp_path / 'kv-events.sock'}"
    llm = engine(
        model_dir,
        daemon.socket,
        kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="zmq", endpoint=events),
    )
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(events)

    first, cached = run_all(llm, PROMPTS)
    assert first == expected
    # Every distinct full prompt block, each stored once (shared prefixes
    # included).
    distinct = {tuple(p[: (i + 1) * BLOCK_TOKENS]) for p in PROMPTS for i in range(len(p) // BLOCK_TOKENS)}
    reset_prefix_cache(llm)
    assert node_stats(daemon)["committed"] == len(distinct)

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
    stored = kv_events(sub, BlockStored, medium="CPU", want=len(distinct))
    assert len(stored) == len(distinct)
    sub.close()


def kv_events(sub: Any, kind: type, medium: str, want: int, timeout: float = 30.0) -> list[Any]:
    """``kind`` events of ``medium`` from vLLM's event publisher, until
    ``want`` have come or nothing more comes for ``timeout`` seconds."""
    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
    found: list[Any] = []
    while len(found) < want and sub.poll(int(timeout * 1000)):
        _topic, _seq, payload = sub.recv_multipart()
        for e in decoder.decode(payload).events:
            if isinstance(e, kind) and getattr(e, "medium", None) == medium:
                found.append(e)
    return found


def corrupt_every_slot(shm_name: str) -> None:
    """Flips every byte of the arena's slot data (docs/memory-arena.md:
    the data offset is the u64 at byte 72 of the header)."""
    path = Path("/dev/shm") / shm_name
    with open(path, "r+b") as f:
        f.seek(72)
        data_offset = int.from_bytes(f.read(8), "little")
        f.seek(0, 2)
        end = f.tell()
        f.seek(data_offset)
        f.write(bytes([0x5A]) * (end - data_offset))


def test_a_corrupted_block_is_recomputed_never_served(daemon: Daemon, model_dir: Path) -> None:
    llm = engine(model_dir, daemon.socket)
    expected, _ = run(llm, PROMPT)
    reset_prefix_cache(llm)
    corrupt_every_slot(probe(daemon).shm_name)
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
    llm = engine(model_dir, tmp_path / "nobody-listens.sock")
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
    uncached, then reconnects to the restarted daemon; a restarted engine
    then loads the prompt from the disk tier."""
    expected = uncached_outputs(model_dir, [PROMPT])[0]
    daemon = start_daemon(tmp_path / "data", daemon_env(KVTIER_MANAGER__MODE="inclusive"))
    try:
        llm = engine(model_dir, daemon.socket)
        tokens, cached = run(llm, PROMPT)
        assert tokens == expected and cached == 0
        reset_prefix_cache(llm)
        wait_until_on_disk(daemon, len(PROMPT) // BLOCK_TOKENS)

        daemon.kill()
        tokens, cached = run(llm, PROMPT)
        assert tokens == expected and cached == 0, "the daemon is down: nothing can be loaded"
        reset_prefix_cache(llm)

        daemon = daemon.restart()
        tokens, cached = run(llm, PROMPT)
        assert tokens == expected and cached == usable_tokens(PROMPT), "reconnected, loaded from disk"
        assert cached_by_source(llm).get("disk", 0) == cached
        del llm
        gc.collect()

        daemon.kill()
        daemon = daemon.restart()
        llm = engine(model_dir, daemon.socket)
        tokens, cached = run(llm, PROMPT)
        assert tokens == expected and cached == usable_tokens(PROMPT)
        assert cached_by_source(llm).get("disk", 0) == cached
    finally:
        daemon.stop()


def engine_process(model_dir: Path, daemon: Daemon, tp: int = 1, runs: int = 1) -> list[dict[str, Any]]:
    """``runs`` runs of ``PROMPT`` by a vLLM in multi-process mode in a
    process of its own (``mp_engine.py``)."""
    script = Path(__file__).with_name("mp_engine.py")
    r = subprocess.run(
        [sys.executable, str(script), str(model_dir), str(daemon.socket), json.dumps(PROMPT), str(tp), str(runs)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    result = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    assert r.returncode == 0 and result, r.stderr[-8000:]
    out: list[dict[str, Any]] = json.loads(result[0].removeprefix("RESULT "))
    return out


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
