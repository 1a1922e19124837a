#!/usr/bin/env python3
"""Peer fetch between two daemons (issue 33's bench): node B's ``Load`` of
blocks only node A holds, against a raw TCP copy of the same bytes between
two processes, in one run.

One process starts a real cluster with ``kvtier.testing``: a
``redis-server`` and daemons A and B of one cluster, every setting at its
default (the default block: Llama 3 8B's 32 layers of 64 KiB, 2 MiB at 16
tokens) but the arena's size and the loopback addresses. Each round stores
``--blocks`` new blocks of random bytes on A (not timed), waits until A
has published them, has B ``Lookup`` them (each must answer the peer
tier), then times two phases, in an order that turns around every round:

``peer``
    B's ``Load`` of the blocks: B reads them from A's G2 over the
    authenticated data plane into its own G2, verified, then answers. Timed
    to the answer (``LoadOk``), to layer 0 readable and to the last layer
    readable; every block is then read back through B's arena and compared
    with what was stored (not timed), released and removed from B.
``raw``
    The same number of bytes copied over one loopback TCP connection from
    a sender process (a Python process writing a prepared buffer with
    ``sendall``) into one buffer of this process (``recv_into``): the
    floor for moving those bytes between two processes on this machine.

CPU is the phase's CPU time of both sides' processes (the daemons A and B,
or the sender and this process), per block. Ratios are peer MB/s over raw
MB/s, per round.

Run with an interpreter that has the kvtier package, next to a built
binary (``KVTIER_BIN``, else ``target/release/kvtier``)::

    python3 benchmarks/cluster_fetch.py             # 5 rounds of 64 blocks
    python3 benchmarks/cluster_fetch.py --json      # one JSON object
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cluster_common import cpu_seconds, member, print_logs

import kvtier
from kvtier.testing import Daemon, start_cluster, wait_until

#: The raw sender: serves ``count`` blocks of ``size`` bytes per 8-byte
#: request (``count``), from one prepared buffer, until the peer closes.
SENDER = """
import socket, sys
size = int(sys.argv[1])
buf = memoryview(bytes(range(256)) * (size // 256))
srv = socket.create_server(("127.0.0.1", 0))
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while True:
    head = conn.recv(8, socket.MSG_WAITALL)
    if len(head) < 8:
        break
    for _ in range(int.from_bytes(head, "little")):
        conn.sendall(buf)
"""


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5, help="measured rounds (default 5)")
    p.add_argument("--blocks", type=int, default=64, help="blocks per Load (default 64)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    return p.parse_args()


def client(daemon: Daemon) -> kvtier.Client:
    """A client of the default block shape (the daemon's geometry)."""
    return kvtier.Client(daemon.socket, model="bench-cluster-fetch", dtype="bf16", layers=32, layer_bytes=65536, block_size_tokens=16)


class Raw:
    """The raw baseline: a sender process and one connection to it."""

    def __init__(self, block: int) -> None:
        self.block = block
        self.proc = subprocess.Popen([sys.executable, "-c", SENDER, str(block)], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        port = int(self.proc.stdout.readline())
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def copy(self, blocks: int, into: bytearray) -> None:
        """Asks for ``blocks`` blocks and receives them into ``into``."""
        self.sock.sendall(blocks.to_bytes(8, "little"))
        view = memoryview(into)[: blocks * self.block]
        got = 0
        while got < len(view):
            n = self.sock.recv_into(view[got:])
            if n == 0:
                sys.exit("the raw sender closed the connection")
            got += n

    def close(self) -> None:
        self.sock.close()
        self.proc.wait(timeout=30)


def raw_phase(raw: Raw, blocks: int, into: bytearray) -> dict[str, Any]:
    pids = [raw.proc.pid, os.getpid()]
    cpu0 = [cpu_seconds(p) for p in pids]
    t0 = time.perf_counter()
    raw.copy(blocks, into)
    secs = time.perf_counter() - t0
    cpu = sum(cpu_seconds(p) - c for p, c in zip(pids, cpu0))
    return {"secs": secs, "cpu_us_per_block": cpu / blocks * 1e6}


def peer_phase(on_b: kvtier.Client, keys: list[int], payloads: list[bytes], pids: list[int]) -> dict[str, Any]:
    """Times B's ``Load`` of ``keys`` (to the answer, layer 0 and the last
    layer), then checks every block byte for byte and drops it from B."""
    layers = on_b.layers
    cpu0 = [cpu_seconds(p) for p in pids]
    t0 = time.perf_counter()
    load = on_b.load(keys)
    t_answer = time.perf_counter() - t0
    if load.prefix_len != len(keys):
        sys.exit(f"B's Load found {load.prefix_len} of {len(keys)} blocks")
    load.wait_layer(0)
    t_first = time.perf_counter() - t0
    load.wait_layer(layers - 1)
    secs = time.perf_counter() - t0
    cpu = sum(cpu_seconds(p) - c for p, c in zip(pids, cpu0))
    out = bytearray(on_b.block_bytes)
    for i, want in enumerate(payloads):
        if not load.read_block(i, out) or bytes(out) != want:
            sys.exit(f"block {i} read back from B is not the block stored on A")
    load.release()
    on_b.remove(keys)
    return {"secs": secs, "answer_secs": t_answer, "first_layer_secs": t_first, "cpu_us_per_block": cpu / len(keys) * 1e6}


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="kvtier-bench-fetch-") as tmp:
        cluster = start_cluster(Path(tmp) / "cluster", name="bench-fetch")
        raw = None
        try:
            block = 32 * 65536
            # A holds every round's blocks in G2; B one round's, twice over.
            a_arena = f"{max(256, (args.rounds * args.blocks * block * 2) >> 20)}MiB"
            b_arena = f"{max(256, (args.blocks * block * 4) >> 20)}MiB"
            a = member(cluster, Path(tmp) / "a", "fetch-a", dict(KVTIER_MEMORY__CAPACITY=a_arena))
            b = member(cluster, Path(tmp) / "b", "fetch-b", dict(KVTIER_MEMORY__CAPACITY=b_arena))
            on_a, on_b = client(a), client(b)
            if on_a.block_bytes != block:
                sys.exit(f"the daemon's default block is {on_a.block_bytes} bytes, not {block}")
            peer_tier = on_b.tiers[-1][0]
            raw = Raw(block)
            into = bytearray(args.blocks * block)
            rounds = []
            stored = 0
            for r in range(args.rounds):
                keys = [(0xF0 << 56) | (r << 20) | k for k in range(args.blocks)]
                payloads = [os.urandom(block) for _ in keys]
                if on_a.store_buffers(keys, payloads) != ["stored"] * len(keys):
                    sys.exit("storing on A failed")
                stored += len(keys)
                wait_until(
                    "node A to publish the round's blocks",
                    lambda: a.metrics().get("kvtier_node_meta_published_total", 0) >= stored or None,
                    timeout=120,
                )
                if on_b.lookup(keys) != [peer_tier] * len(keys):
                    sys.exit("B's Lookup does not answer the peer tier for every block")
                pids = [a.proc.pid, b.proc.pid]
                if r % 2 == 0:
                    p = peer_phase(on_b, keys, payloads, pids)
                    w = raw_phase(raw, args.blocks, into)
                else:
                    w = raw_phase(raw, args.blocks, into)
                    p = peer_phase(on_b, keys, payloads, pids)
                rounds.append({"peer": p, "raw": w})
        except BaseException:
            print_logs(cluster)
            raise
        finally:
            if raw is not None:
                raw.close()
            cluster.stop()
    report(args, rounds, block)


def spread(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def report(args: argparse.Namespace, rounds: list[dict[str, Any]], block: int) -> None:
    mb = args.blocks * block / 1e6
    out: dict[str, Any] = {
        "blocks": args.blocks,
        "block_bytes": block,
        "rounds": args.rounds,
        "peer_mb_s": spread([mb / r["peer"]["secs"] for r in rounds]),
        "raw_mb_s": spread([mb / r["raw"]["secs"] for r in rounds]),
        "peer_over_raw": spread([r["raw"]["secs"] / r["peer"]["secs"] for r in rounds]),
        "peer_answer_ms": spread([r["peer"]["answer_secs"] * 1e3 for r in rounds]),
        "peer_first_layer_ms": spread([r["peer"]["first_layer_secs"] * 1e3 for r in rounds]),
        "peer_last_layer_ms": spread([r["peer"]["secs"] * 1e3 for r in rounds]),
        "raw_ms": spread([r["raw"]["secs"] * 1e3 for r in rounds]),
        "peer_cpu_us_per_block": spread([r["peer"]["cpu_us_per_block"] for r in rounds]),
        "raw_cpu_us_per_block": spread([r["raw"]["cpu_us_per_block"] for r in rounds]),
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return

    def row(name: str, s: dict[str, float], fmt: str = ".0f") -> None:
        print(f"{name:<34} {s['median']:>9{fmt}} [{s['min']:{fmt}} .. {s['max']:{fmt}}]")

    print(f"{args.blocks} blocks of {block >> 20} MiB, {args.rounds} rounds (median [min .. max] of rounds):")
    row("peer Load MB/s (to the last layer)", out["peer_mb_s"])
    row("raw TCP copy MB/s", out["raw_mb_s"])
    row("peer / raw", out["peer_over_raw"], ".2f")
    row("peer Load: answer ms", out["peer_answer_ms"], ".1f")
    row("peer Load: layer 0 readable ms", out["peer_first_layer_ms"], ".1f")
    row("peer Load: last layer readable ms", out["peer_last_layer_ms"], ".1f")
    row("raw copy ms", out["raw_ms"], ".1f")
    row("CPU us/block, peer (A + B)", out["peer_cpu_us_per_block"])
    row("CPU us/block, raw (sender + receiver)", out["raw_cpu_us_per_block"])


if __name__ == "__main__":
    main()
