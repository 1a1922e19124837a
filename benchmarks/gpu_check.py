#!/usr/bin/env python3
"""The device check of kvtier's copies between a GPU's paged KV cache and
the node's arena (``kvtier.device``), for a CUDA host with torch and no
vLLM; with ``--device cpu`` the same code on CPU tensors (CI runs that).

It starts a real ``kvtier serve`` (``$KVTIER_BIN``, else ``kvtier`` on the
PATH, else this checkout's ``target/{release,debug}/kvtier``), builds a
paged KV cache on the device in each of vLLM 0.32's layouts (and an MLA
latent cache), and per round stores a set of blocks through
``DeviceCopier`` and the client (device -> arena), loads them back layer
by layer into other blocks of another cache (arena -> device), and
compares every byte. Beside each kvtier round it times torch's own copy of
the same bytes between the device and pinned host memory (alternating
rounds). It prints one JSON line: per case the GB/s of each direction
(median, min, max over rounds), torch's, their ratios, and the process
CPU time per block (the client's copies and checksums run in this
process; the daemon's own CPU is not counted). It exits 1 on any byte
mismatch, block not stored, or block not loaded verified.

Run from the repository root (the ``kvtier`` package installed, or built
in ./python)::

    KVTIER_BIN=target/release/kvtier python3 benchmarks/gpu_check.py            # CUDA, full sizes
    KVTIER_BIN=target/debug/kvtier python3 benchmarks/gpu_check.py --device cpu # CI smoke
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

try:
    import kvtier
except ImportError:  # a checkout whose ./python has the native module built
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
    import kvtier

from kvtier.device import KV_LAYOUTS, DeviceCopier, paged_kv_cache
from kvtier.testing import Daemon, start_daemon

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


@dataclass(frozen=True)
class Case:
    """One cache shape in one layout."""

    name: str
    layout: str
    heads: int
    content: int
    """Elements per head and token: K and V, or the MLA latent."""
    geometry: dict[str, str]
    """The daemon's ``KVTIER_GEOMETRY__*`` for this shape."""


def cases(args: argparse.Namespace) -> list[Case]:
    mha = dict(
        KVTIER_GEOMETRY__PRESET="tiny",
        KVTIER_GEOMETRY__KV_HEADS=str(args.heads),
        KVTIER_GEOMETRY__HEAD_DIM=str(args.head_dim),
    )
    mla = dict(KVTIER_GEOMETRY__PRESET="deepseek-v3", KVTIER_GEOMETRY__LATENT_DIM=str(args.latent_dim))
    out = [Case(layout, layout, args.heads, 2 * args.head_dim, mha) for layout in sorted(KV_LAYOUTS)]
    # A latent cache has one "head": every layout is one of two orders.
    out.append(Case("MLA", "LBNHC", 1, args.latent_dim, mla))
    return out


def spread(xs: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3), "max": round(max(xs), 3)}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, f: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of ``f`` with the device idle
    before and after."""
    sync(device)
    wall, cpu = time.perf_counter(), time.process_time()
    f()
    sync(device)
    return time.perf_counter() - wall, time.process_time() - cpu


class Check:
    """One case: the caches, the client, and what the rounds measured."""

    def __init__(self, case: Case, args: argparse.Namespace, daemon: Daemon, device: torch.device) -> None:
        self.device = device
        self.blocks = args.blocks
        dims = dict(layers=args.layers, blocks=2 * args.blocks, heads=case.heads, tokens=args.tokens, content=case.content)
        dtype = DTYPES[args.dtype]
        self.src = paged_kv_cache(case.layout, **dims, dtype=dtype, device=device)
        self.dst = paged_kv_cache(case.layout, **dims, dtype=dtype, device=device)
        for t in self.src:
            b = t.view(torch.uint8)
            b.copy_(torch.randint(0, 256, tuple(b.shape), dtype=torch.uint8, device=device))
        self.out, self.back = DeviceCopier(self.src), DeviceCopier(self.dst)
        self.client = kvtier.Client(
            str(daemon.socket),
            model=f"gpu-check-{case.name}",
            dtype=args.dtype,
            layers=args.layers,
            layer_bytes=self.out.row,
            block_size_tokens=args.tokens,
        )
        self.bytes = args.blocks * args.layers * self.out.row
        self.failures: list[str] = []
        self.m: dict[str, list[float]] = {k: [] for k in ("store", "load", "d2h", "h2d", "cpu_store", "cpu_load")}
        pinned = device.type == "cuda"
        self.dev_buf = torch.empty(self.bytes, dtype=torch.uint8, device=device)
        self.host_buf = torch.empty(self.bytes, dtype=torch.uint8, pin_memory=pinned)

    def round(self, r: int) -> None:
        perm = torch.randperm(2 * self.blocks).tolist()
        a, b = perm[: self.blocks], perm[self.blocks :]
        keys = [(r << 32) | i for i in range(self.blocks)]
        wall, cpu = timed(self.device, lambda: self.store(keys, a))
        self.m["store"].append(self.bytes / wall / 1e9)
        self.m["cpu_store"].append(cpu / self.blocks * 1e6)
        wall, _ = timed(self.device, lambda: self.host_buf.copy_(self.dev_buf, non_blocking=True))
        self.m["d2h"].append(self.bytes / wall / 1e9)
        wall, cpu = timed(self.device, lambda: self.load(keys, b))
        self.m["load"].append(self.bytes / wall / 1e9)
        self.m["cpu_load"].append(cpu / self.blocks * 1e6)
        wall, _ = timed(self.device, lambda: self.dev_buf.copy_(self.host_buf, non_blocking=True))
        self.m["h2d"].append(self.bytes / wall / 1e9)
        self.compare(a, b, r)
        # The arena holds a round or two: each round's blocks leave it.
        self.client.remove(keys)

    def store(self, keys: list[int], ids: list[int]) -> None:
        done = 0
        for n, layers in self.out.stage_out(ids):
            outcomes = self.client.store_layers(keys[done : done + n], layers, list(range(n)), self.out.row)
            if outcomes != ["stored"] * n:
                self.failures.append(f"store: {sorted(set(outcomes))}")
            done += n

    def load(self, keys: list[int], ids: list[int]) -> None:
        load = self.client.load(keys)
        n = load.prefix_len
        if n != len(keys):
            self.failures.append(f"load: {n} of {len(keys)} blocks pinned")
        self.back.start_loads()
        for layer in range(len(self.dst)):
            load.wait_layer(layer)
            ok = load.read_layer(layer, self.back.load_region(layer, n), list(range(n)), self.out.row)
            if not all(ok):
                self.failures.append(f"load: {ok.count(False)} blocks failed verification at layer {layer}")
            good = [i for i in range(n) if ok[i]]
            self.back.stage_in(layer, [ids[i] for i in good], good)
        load.release()

    def compare(self, a: list[int], b: list[int], r: int) -> None:
        ia = torch.tensor(a, device=self.device)
        ib = torch.tensor(b, device=self.device)
        for layer, (s, d) in enumerate(zip(self.src, self.dst)):
            sb, db = s.view(torch.uint8), d.view(torch.uint8)
            if not torch.equal(sb.index_select(0, ia), db.index_select(0, ib)):
                self.failures.append(f"round {r} layer {layer}: bytes differ")
            db.index_fill_(0, ib, 0)

    def report(self) -> dict[str, Any]:
        m = self.m
        return {
            "block_layer_bytes": self.out.row,
            "bytes_per_round": self.bytes,
            "device_to_arena_gbps": spread(m["store"]),
            "arena_to_device_gbps": spread(m["load"]),
            "torch_device_to_pinned_gbps": spread(m["d2h"]),
            "torch_pinned_to_device_gbps": spread(m["h2d"]),
            "store_ratio": round(statistics.median(m["store"]) / statistics.median(m["d2h"]), 3),
            "load_ratio": round(statistics.median(m["load"]) / statistics.median(m["h2d"]), 3),
            "cpu_us_per_block_store": spread(m["cpu_store"]),
            "cpu_us_per_block_load": spread(m["cpu_load"]),
            "failures": self.failures,
        }


def daemon_for(case: Case, args: argparse.Namespace, data: Path, round_bytes: int) -> Daemon:
    env = dict(case.geometry)
    env.update(
        KVTIER_GEOMETRY__LAYERS=str(args.layers),
        KVTIER_GEOMETRY__DTYPE=args.dtype,
        KVTIER_GEOMETRY__TOKENS_PER_BLOCK=str(args.tokens),
        KVTIER_MEMORY__CAPACITY=f"{2 * round_bytes // 2**20 + 16}MiB",
        KVTIER_DISK__CAPACITY_PER_DIR="64MiB",
        KVTIER_DISK__REGION_SIZE="8MiB",
    )
    return start_daemon(data, env)


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu")
    ap.add_argument("--rounds", type=int, default=None, help="rounds per case (default 5 on a GPU, 2 on the CPU)")
    ap.add_argument("--blocks", type=int, default=None, help="blocks per round (default 256 on a GPU, 8 on the CPU)")
    ap.add_argument("--layers", type=int, default=None, help="layers (default 32 on a GPU, 2 on the CPU)")
    ap.add_argument("--heads", type=int, default=8, help="KV heads of the rank (default 8)")
    ap.add_argument("--head-dim", type=int, default=None, help="elements per head (default 128 on a GPU, 16 on the CPU)")
    ap.add_argument("--latent-dim", type=int, default=None, help="MLA latent (default 576 on a GPU, 64 on the CPU)")
    ap.add_argument("--tokens", type=int, default=16, help="tokens per block (default 16)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    args = ap.parse_args()
    gpu = args.device != "cpu"
    for name, on_gpu, on_cpu in (("rounds", 5, 2), ("blocks", 256, 8), ("layers", 32, 2), ("head_dim", 128, 16), ("latent_dim", 576, 64)):
        if getattr(args, name) is None:
            setattr(args, name, on_gpu if gpu else on_cpu)
    return args


def main() -> int:
    args = parse()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device (use --device cpu for the CPU run)", file=sys.stderr)
        return 2
    if not os.environ.get("KVTIER_BIN") and shutil.which("kvtier"):
        os.environ["KVTIER_BIN"] = str(shutil.which("kvtier"))
    began = time.perf_counter()
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "shape": dict(layers=args.layers, heads=args.heads, head_dim=args.head_dim, latent_dim=args.latent_dim, tokens=args.tokens, dtype=args.dtype),
        "blocks_per_round": args.blocks,
        "rounds": args.rounds,
        "cases": {},
    }
    failed = False
    for case in cases(args):
        data = Path(tempfile.mkdtemp(prefix="kvtier-gpu-check-"))
        row = args.tokens * case.heads * case.content * torch.empty(0, dtype=DTYPES[args.dtype]).element_size()
        daemon = daemon_for(case, args, data / "data", args.blocks * args.layers * row)
        try:
            check = Check(case, args, daemon, device)
            # A first round that is not timed: staging grows, caches warm.
            check.round(0)
            check.m = {k: [] for k in check.m}
            for r in range(1, args.rounds + 1):
                check.round(r)
            report["cases"][case.name] = check.report()
            failed |= bool(check.failures)
            del check
        finally:
            daemon.stop()
            if os.environ.get("KVTIER_KEEP_DATA") is None:
                shutil.rmtree(data, ignore_errors=True)
    report["seconds"] = round(time.perf_counter() - began, 1)
    report["ok"] = not failed
    print(json.dumps(report), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
