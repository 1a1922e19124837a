#!/usr/bin/env python3
"""Store and load times of the SGLang HiCache backend (``kvtier.sglang``)
between SGLang's own host pool and a real ``kvtier serve``.

One process builds SGLang's ``MHATokenToKVPoolHost`` (CPU tensors, as
python/tests-sglang does) for a Llama-3-8B-shaped rank (32 layers, 8 KV
heads of 128, bf16) with pages of 16 tokens (2 MiB per page), starts a
daemon with the geometry of the pool's pages, and times ``batch_set_v1``
of a batch of fresh pages, then ``batch_get_v1`` of the same pages into
other host slots (a G2 hit), for each host layout. Every page stored must
be stored and every page loaded must be a verified hit.

Run from the repository root, in the environment .ci/setup makes::

    PYTHONPATH=target/sglang-extra KVTIER_BIN=target/release/kvtier \\
      target/vllm-venv/bin/python benchmarks/sglang_copy.py [--pages 32] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python" / "tests-sglang"))
import conftest as pools  # noqa: E402  (SGLang's host pools, built as the tests build them)

from kvtier.sglang import PageLayout  # noqa: E402
from kvtier.testing import start_daemon  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=32, help="pages per batch (SGLang's batches are up to 128)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    pools.LAYERS, pools.HEADS, pools.HEAD_DIM, pools.PAGE = 32, 8, 128, 16
    pools.DEVICE_TOKENS = args.pages * pools.PAGE
    for layout in ("page_first", "layer_first"):
        pool = pools.mha_pool(layout, torch.bfloat16)
        lay = PageLayout.of(pool)
        env = lay.node_env()
        mib = args.pages * lay.block_bytes / 2**20
        env.update(KVTIER_MEMORY__CAPACITY=f"{int(mib * args.rounds + 64)}MiB", KVTIER_DISK__CAPACITY_PER_DIR="64MiB")
        env.update(KVTIER_DISK__REGION_SIZE="8MiB")
        daemon = start_daemon(Path(tempfile.mkdtemp()) / "data", env)
        try:
            backend = pools.attach(pool, daemon.socket)
            src, dst = pools.slots(list(range(args.pages))), pools.slots(list(range(args.pages, 2 * args.pages)))
            times: dict[str, list[float]] = {"store": [], "load": []}
            for r in range(args.rounds):
                keys = [f"{r:08x}{i:024x}" for i in range(args.pages)]
                t = time.perf_counter()
                assert all(backend.batch_set_v1(keys, src))
                times["store"].append(time.perf_counter() - t)
                t = time.perf_counter()
                assert all(backend.batch_get_v1(keys, dst))
                times["load"].append(time.perf_counter() - t)
            assert backend.counters()["stored_pages"] == args.pages * args.rounds
            cells = ", ".join(
                f"{k} {statistics.median(v) * 1e3:.1f} ms median ({mib / 1024 / statistics.median(v):.2f} GiB/s)"
                for k, v in times.items()
            )
            print(f"{layout}: {lay.runs} runs of {lay.run_bytes} B per page, {args.pages} pages ({mib:.0f} MiB): {cells}")
        finally:
            daemon.stop()


if __name__ == "__main__":
    main()
