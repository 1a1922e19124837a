"""What the vLLM tests share: prompts, a vLLM engine on the tiny Llama,
runs, the daemon's counters, vLLM's metrics and KV events, and arena
corruption."""

from __future__ import annotations

import gc
import json
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import kvtier
from conftest import BLOCK_TOKENS
from kvtier.testing import Daemon, corrupt_arena_slots
from vllm import LLM, SamplingParams
from vllm.config import KVEventsConfig, KVTransferConfig

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
#: Seconds one batch may take (about one on an idle machine): an engine
#: that keeps rescheduling a request fails the test instead of hanging it.
RUN_DEADLINE = 300.0
#: The tiny Llama's block: 2 layers of 16 KiB (8 KiB per rank at TP=2).
LAYERS = 2
LAYER_BYTES = 16384


def usable_tokens(prompt: list[int]) -> int:
    """Prompt tokens an external cache can supply: whole blocks, leaving
    vLLM at least the last token to compute."""
    return (len(prompt) - 1) // BLOCK_TOKENS * BLOCK_TOKENS


def distinct_blocks(prompts: list[list[int]]) -> int:
    """Distinct full blocks of ``prompts`` (a block is its whole prefix)."""
    return len({tuple(p[: (i + 1) * BLOCK_TOKENS]) for p in prompts for i in range(len(p) // BLOCK_TOKENS)})


#: What every engine (and engine config) of the tiny models is built with.
TINY_ENGINE_ARGS: dict[str, Any] = {
    "load_format": "dummy",
    "skip_tokenizer_init": True,
    "enforce_eager": True,
    "max_model_len": 1024,
    "block_size": BLOCK_TOKENS,
    "enable_prefix_caching": True,
    "dtype": "float32",
}


#: The in-process engines built by ``engine`` and not yet freed.
_LIVE_ENGINES: weakref.WeakSet[LLM] = weakref.WeakSet()


def engine(model_dir: Path, **kw: Any) -> LLM:
    """A vLLM on the tiny Llama (dummy weights unless ``load_format`` says
    otherwise, float32), with ``kw``."""
    args = {**TINY_ENGINE_ARGS, "seed": 0, "kv_cache_memory_bytes": 64 << 20, "disable_log_stats": False}
    llm = LLM(model=str(model_dir), **{**args, **kw})
    _LIVE_ENGINES.add(llm)
    return llm


def shut_down_engines() -> None:
    """Shuts down every engine ``engine`` built that is still alive. A
    failed test's traceback keeps its engine alive; freed later, in the
    middle of another test, vLLM's finalizer would tear down the process's
    model-parallel groups under that test's engine. An engine shut down
    here has its finalizer detached, so freeing it later does nothing."""
    for llm in list(_LIVE_ENGINES):
        llm.llm_engine.engine_core.shutdown()
    _LIVE_ENGINES.clear()


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Fails with ``TimeoutError`` if the block runs longer than ``seconds``."""

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_all(llm: LLM, prompts: list[list[int]], salt: str | None = None) -> tuple[list[list[int]], list[int]]:
    """Greedy output tokens, and the prompt tokens vLLM did not compute, of
    each prompt (one batch; ``salt`` is the requests' ``cache_salt``)."""
    inputs: list[Any] = [{"prompt_token_ids": p} | ({} if salt is None else {"cache_salt": salt}) for p in prompts]
    with deadline(RUN_DEADLINE):
        outs = llm.generate(inputs, SAMPLING, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs], [int(o.num_cached_tokens or 0) for o in outs]


def run(llm: LLM, prompt: list[int], salt: str | None = None) -> tuple[list[int], int]:
    tokens, cached = run_all(llm, [prompt], salt)
    return tokens[0], cached[0]


def connected(model_dir: Path, socket_path: Path, **kw: Any) -> LLM:
    """A vLLM with the kvtier connector on ``socket_path``."""
    kw["kv_transfer_config"] = KVTransferConfig(
        kv_connector="KvtierConnector",
        kv_connector_module_path="kvtier.vllm",
        kv_role="kv_both",
        kv_connector_extra_config={"socket": str(socket_path), "reconnect_interval": 0.1},
        kv_load_failure_policy="recompute",
    )
    return engine(model_dir, **kw)


def uncached_outputs(model_dir: Path, prompts: list[list[int]], **kw: Any) -> list[list[int]]:
    """The outputs of vLLM without kvtier."""
    llm = engine(model_dir, **kw)
    tokens, _ = run_all(llm, prompts)
    del llm
    gc.collect()
    return tokens


def engine_process(
    model_dir: Path,
    daemon: Daemon,
    tp: int = 1,
    runs: int = 1,
    prompts: list[list[int]] | None = None,
    shard_heads: int | None = None,
    weights: bool = False,
    block_size: int = BLOCK_TOKENS,
) -> list[dict[str, Any]]:
    """Each of ``prompts`` (default ``[PROMPT]``) run ``runs`` times by a
    vLLM in multi-process mode in a process of its own (``mp_engine.py``):
    the output tokens and cached tokens of each run."""
    script = Path(__file__).with_name("mp_engine.py")
    cmd = [sys.executable, str(script), str(model_dir), str(daemon.socket), json.dumps(prompts or [PROMPT])]
    cmd += ["--tp", str(tp), "--runs", str(runs), "--block-size", str(block_size)]
    if shard_heads is not None:
        cmd += ["--shard-heads", str(shard_heads)]
    if weights:
        cmd.append("--weights")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    result = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    assert r.returncode == 0 and result, r.stderr[-8000:]
    out: list[dict[str, Any]] = json.loads(result[0].removeprefix("RESULT "))
    return out


def probe(daemon: Daemon, layer_bytes: int = LAYER_BYTES, block_tokens: int = BLOCK_TOKENS) -> kvtier.Client:
    """A client of the daemon in a namespace of its own."""
    return kvtier.Client(
        daemon.socket, model="probe", dtype="f32", layers=LAYERS, layer_bytes=layer_bytes, block_size_tokens=block_tokens
    )


def node_stats(daemon: Daemon, layer_bytes: int = LAYER_BYTES, block_tokens: int = BLOCK_TOKENS) -> dict[str, int]:
    return probe(daemon, layer_bytes, block_tokens).stats()


def cached_by_source(llm: LLM) -> dict[str, int]:
    """vLLM's ``prompt_tokens_cached_by_source`` counter, by source."""
    out: dict[str, int] = {}
    for m in llm.get_metrics():
        if m.name == "vllm:prompt_tokens_cached_by_source":
            source = m.labels["source"]
            out[source] = out.get(source, 0) + int(getattr(m, "value", 0))
    return out


def corrupt_every_slot(daemon: Daemon) -> None:
    """Corrupts every block held in the daemon's arena."""
    corrupt_arena_slots(probe(daemon).shm_name)


class Events:
    """The KV events an in-process engine hands its event publisher, as it
    hands them. (Recorded at the publisher rather than read from its ZMQ
    socket: a subscriber may join after the first batches, and what the
    connector owes vLLM is the batch, not its transport.)"""

    def __init__(self) -> None:
        self.seen: list[Any] = []
        self._llm: Callable[[], LLM | None] = lambda: None

    def config(self) -> KVEventsConfig:
        return KVEventsConfig(enable_kv_cache_events=True, publisher="null")

    def attach(self, llm: LLM) -> LLM:
        """Records every batch ``llm``'s scheduler publishes; returns ``llm``."""
        scheduler = llm.llm_engine.engine_core.engine_core.scheduler
        publisher = scheduler.kv_event_publisher
        publish = publisher.publish
        seen = self.seen

        # The engine must not hold this object (nor itself, through it):
        # an engine left for the garbage collector would outlive its test.
        def record(batch: Any) -> None:
            seen.extend(batch.events)
            publish(batch)

        publisher.publish = record
        self._llm = weakref.ref(llm)
        return llm

    def wait_for(self, kind: type, medium: str, want: int, timeout: float = 30.0) -> list[Any]:
        """``kind`` events of ``medium`` so far, stepping the idle engine
        until ``want`` have come or ``timeout`` seconds have passed."""

        def found() -> list[Any]:
            return [e for e in self.seen if isinstance(e, kind) and getattr(e, "medium", None) == medium]

        deadline = time.monotonic() + timeout
        llm = self._llm()
        while len(found()) < want and time.monotonic() < deadline and llm is not None:
            llm.llm_engine.step()
        return found()
