#!/usr/bin/env python3
"""Latency of a cluster ``Lookup`` (issue 33's bench): 64 keys asked of
node B that only node A holds, against the same ``Lookup`` answered by A
from its own G2, in one run.

One process starts a real cluster with ``kvtier.testing``: a
``redis-server``, daemons A and B of one cluster (each hosting a
metadata-service frontend over that index, every setting at its default
but the block shape, the arena's size and the loopback addresses). It
stores ``--sets`` sets of ``--keys`` blocks on A, waits until A's node view
has published all of them, then measures, round by round, three phases
over that round's sets:

``local``
    A's ``Lookup`` of a set: every key in A's G2 (the baseline: a node
    answering from its own tiers).
``cluster``
    B's first ``Lookup`` of a set: past B's own (empty) prefix B asks the
    metadata index (``getCacheLocation`` in prefix mode, within
    ``peer.lookup_timeout_ms``), checks each location's MAC for the
    session's namespace and answers the peer tier.
``cached``
    B's second ``Lookup`` of the same set at once: answered from B's
    one-second cache of cluster answers.

Every answer is checked (``G2`` for each key on A, the peer tier on B) and
the run stops if one is not what the phase claims. The order of the
local phase and the two cluster phases turns around every round. Each
phase records the wall time of every call (the Python client's round trip
over the node socket) and the CPU time the daemons and the index spent
over the phase (their threads' ``schedstat``), per call.

Run with an interpreter that has the kvtier package, next to a built
binary (``KVTIER_BIN``, else ``target/release/kvtier``)::

    python3 benchmarks/cluster_lookup.py             # 5 rounds of 40 sets of 64 keys
    python3 benchmarks/cluster_lookup.py --json      # one JSON object
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import kvtier
from cluster_common import cpu_seconds, member, pct, print_logs
from kvtier.testing import Cluster, Daemon, start_cluster, wait_until

LAYERS = 2
LAYER_BYTES = 8192
TOKENS = 16


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5, help="measured rounds (default 5)")
    p.add_argument("--sets", type=int, default=40, help="sets of keys per round (default 40)")
    p.add_argument("--keys", type=int, default=64, help="keys per Lookup (default 64)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    return p.parse_args()


def tiny_member(cluster: Cluster, data: Path, node: str, arena: str) -> Daemon:
    # The tiny Llama's shape: 2 layers of 8 KiB at 16 tokens.
    settings = dict(
        KVTIER_GEOMETRY__PRESET="tiny",
        KVTIER_GEOMETRY__TOKENS_PER_BLOCK=str(TOKENS),
        KVTIER_MEMORY__CAPACITY=arena,
    )
    return member(cluster, data, node, settings)


def client(daemon: Daemon) -> kvtier.Client:
    return kvtier.Client(
        daemon.socket,
        model="bench-cluster-lookup",
        dtype="f32",
        layers=LAYERS,
        layer_bytes=LAYER_BYTES,
        block_size_tokens=TOKENS,
    )


def phase(name: str, calls: list[list[int]], c: kvtier.Client, want: str, pids: list[int]) -> dict[str, Any]:
    """Times ``c.lookup`` of each key set, checking every answer is
    ``want`` for all keys."""
    cpu0 = [cpu_seconds(p) for p in pids]
    times = []
    for keys in calls:
        t0 = time.perf_counter()
        got = c.lookup(keys)
        times.append(time.perf_counter() - t0)
        if got != [want] * len(keys):
            sys.exit(f"{name}: a Lookup answered {got[:4]}... ({len(got)} keys), not {want} for all {len(keys)}")
    cpu = sum(cpu_seconds(p) - c0 for p, c0 in zip(pids, cpu0))
    return {"times": times, "cpu_per_call_us": cpu / len(calls) * 1e6}


def main() -> None:
    args = parse_args()
    total = args.rounds * args.sets * args.keys
    block = LAYERS * LAYER_BYTES
    # Room for every block in A's G2 (and B's), with a margin.
    arena = f"{max(64, (total * block * 2) >> 20)}MiB"
    with tempfile.TemporaryDirectory(prefix="kvtier-bench-cluster-") as tmp:
        cluster = start_cluster(Path(tmp) / "cluster", name="bench-cluster")
        try:
            a = tiny_member(cluster, Path(tmp) / "a", "bench-a", arena)
            b = tiny_member(cluster, Path(tmp) / "b", "bench-b", arena)
            on_a, on_b = client(a), client(b)
            peer, kind = on_b.tiers[-1]
            if kind != "peer":
                sys.exit(f"node B lists no peer tier: {on_b.tiers}")
            sets = [
                [(r * 1_000_000 + s * 1000 + k) | (0xC1 << 56) for k in range(args.keys)]
                for r in range(args.rounds)
                for s in range(args.sets)
            ]
            payload = bytes(block)
            for keys in sets:
                got = on_a.store_buffers(keys, [payload] * len(keys))
                if got != ["stored"] * len(keys):
                    sys.exit(f"storing on A answered {set(got)}")
            wait_until(
                "node A to publish every block",
                lambda: a.metrics().get("kvtier_node_meta_published_total", 0) >= total or None,
                timeout=120,
            )
            rounds = []
            for r in range(args.rounds):
                mine = sets[r * args.sets : (r + 1) * args.sets]
                local = lambda: phase("local", mine, on_a, "G2", [a.proc.pid])  # noqa: E731
                pids = [b.proc.pid, cluster.redis.proc.pid]

                def remote() -> tuple[dict[str, Any], dict[str, Any]]:
                    return phase("cluster", mine, on_b, peer, pids), phase("cached", mine, on_b, peer, pids)

                if r % 2 == 0:
                    loc = local()
                    clu, cac = remote()
                else:
                    clu, cac = remote()
                    loc = local()
                rounds.append({"local": loc, "cluster": clu, "cached": cac})
        except BaseException:
            print_logs(cluster)
            raise
        finally:
            cluster.stop()
    report(args, rounds)


def report(args: argparse.Namespace, rounds: list[dict[str, Any]]) -> None:
    out: dict[str, Any] = {"keys": args.keys, "rounds": args.rounds, "sets_per_round": args.sets, "phases": {}}
    for name in ("local", "cluster", "cached"):
        p50s = [pct(r[name]["times"], 0.5) * 1e6 for r in rounds]
        every = [t * 1e6 for r in rounds for t in r[name]["times"]]
        cpu = [r[name]["cpu_per_call_us"] for r in rounds]
        out["phases"][name] = {
            "p50_us": statistics.median(p50s),
            "p50_us_min": min(p50s),
            "p50_us_max": max(p50s),
            "p99_us": pct(every, 0.99),
            "cpu_us_per_call": statistics.median(cpu),
        }
    ratios = [pct(r["cluster"]["times"], 0.5) / pct(r["local"]["times"], 0.5) for r in rounds]
    out["cluster_over_local_p50"] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"Lookup of {args.keys} keys, {args.rounds} rounds of {args.sets} sets (median of the rounds' p50 [min .. max]):")
    print(f"{'phase':<8} {'p50 us':>22} {'p99 us':>9} {'daemon CPU us/call':>19}")
    for name, p in out["phases"].items():
        p50 = f"{p['p50_us']:.0f} [{p['p50_us_min']:.0f} .. {p['p50_us_max']:.0f}]"
        print(f"{name:<8} {p50:>22} {p['p99_us']:>9.0f} {p['cpu_us_per_call']:>19.0f}")
    r = out["cluster_over_local_p50"]
    print(f"cluster / local p50: {r['median']:.2f} [{r['min']:.2f} .. {r['max']:.2f}]")


if __name__ == "__main__":
    main()
