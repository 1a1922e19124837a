"""vLLM reuses KV blocks through kvtier, end to end."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import kvtier
from conftest import BLOCK_TOKENS
from kvtier.testing import Daemon
from vllm import LLM, SamplingParams
from vllm.config import KVTransferConfig

PROMPT = [(i * 37 + 11) % 997 + 3 for i in range(300)]
SAMPLING = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, detokenize=False)


def engine(model_dir: Path, socket: Path | None) -> LLM:
    kw: dict[str, Any] = {}
    if socket is not None:
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector="KvtierConnector",
            kv_connector_module_path="kvtier.vllm",
            kv_role="kv_both",
            kv_connector_extra_config={"socket": str(socket), "reconnect_interval": 0.1},
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
        **kw,
    )


def run(llm: LLM, prompt: list[int]) -> tuple[list[int], int]:
    """Greedy output tokens and the prompt tokens vLLM did not compute."""
    out = llm.generate([{"prompt_token_ids": prompt}], SAMPLING, use_tqdm=False)[0]
    return list(out.outputs[0].token_ids), int(out.num_cached_tokens or 0)


def stats(daemon: Daemon) -> dict[str, int]:
    # The geometry of the tiny Llama: 2 layers of 16 KiB per block.
    c = kvtier.Client(daemon.socket, model="stats", dtype="f32", layers=2, layer_bytes=16384, block_size_tokens=BLOCK_TOKENS)
    return c.stats()


def test_a_prompt_computed_once_is_loaded_from_kvtier(daemon: Daemon, model_dir: Path) -> None:
    baseline = engine(model_dir, None)
    expected, _ = run(baseline, PROMPT)
    del baseline
    gc.collect()

    llm = engine(model_dir, daemon.socket)
    first, cached = run(llm, PROMPT)
    assert first == expected and cached == 0
    saved = stats(daemon)["committed"]
    assert saved == len(PROMPT) // BLOCK_TOKENS, saved

    # vLLM's own prefix cache emptied: the prefix can only come from kvtier.
    assert llm.reset_prefix_cache()
    second, cached = run(llm, PROMPT)
    usable = (len(PROMPT) - 1) // BLOCK_TOKENS * BLOCK_TOKENS
    assert cached == usable, cached
    assert second == expected
    after = stats(daemon)
    assert after["loaded"] >= usable // BLOCK_TOKENS
    assert after["committed"] == saved, "blocks already stored are not stored again"


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
    c = kvtier.Client(daemon.socket, model="probe", dtype="f32", layers=2, layer_bytes=16384, block_size_tokens=BLOCK_TOKENS)
    corrupt_every_slot(c.shm_name)
    assert llm.reset_prefix_cache()
    # Every block fails verification: vLLM recomputes, the output stands.
    again, _ = run(llm, PROMPT)
    assert again == expected
    # The connector removed the bad blocks, so the prompt is stored again
    # and then served from kvtier.
    assert llm.reset_prefix_cache()
    run(llm, PROMPT)
    assert llm.reset_prefix_cache()
    third, cached = run(llm, PROMPT)
    assert third == expected
    assert cached == (len(PROMPT) - 1) // BLOCK_TOKENS * BLOCK_TOKENS


def test_without_a_daemon_the_engine_runs_uncached(tmp_path: Path, model_dir: Path) -> None:
    llm = engine(model_dir, tmp_path / "nobody-listens.sock")
    first, _ = run(llm, PROMPT)
    assert llm.reset_prefix_cache()
    second, cached = run(llm, PROMPT)
    assert second == first and cached == 0


def test_multi_process_mode(daemon: Daemon, model_dir: Path) -> None:
    """The scheduler and the worker in different processes, each its own
    client of the daemon."""
    import json
    import subprocess
    import sys

    script = Path(__file__).with_name("mp_engine.py")
    r = subprocess.run(
        [sys.executable, str(script), str(model_dir), str(daemon.socket)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    result = [l for l in r.stdout.splitlines() if l.startswith("RESULT ")]
    assert r.returncode == 0 and result, r.stderr[-8000:]
    first, second = json.loads(result[0].removeprefix("RESULT "))
    assert first["cached"] == 0
    assert second["cached"] == (len(PROMPT) - 1) // BLOCK_TOKENS * BLOCK_TOKENS
    assert second["tokens"] == first["tokens"]
    assert stats(daemon)["loaded"] >= len(PROMPT) // BLOCK_TOKENS - 1
