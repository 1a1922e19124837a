"""``kvtier shape`` agrees with what the vLLM connector declares: for the
tiny Llama and the tiny DeepSeek (MLA) of the tests, on vLLM's CPU
platform, a daemon started with the geometry ``kvtier shape`` prints
accepts the connector's shape (built by the connector's own ``_shape``
from vLLM's engine configuration and KV cache spec), and holds the same
layers, bytes per layer and tokens per block. No engine is started."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
from conftest import BLOCK_TOKENS, MLA_BLOCK_TOKENS, STORE_ENV
from vllm.engine.arg_utils import EngineArgs
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MLAAttentionSpec

import kvtier
from kvtier.testing import kvtier_bin, start_daemon
from kvtier.vllm.config import KvtierConfig, Shape, namespace_of
from kvtier.vllm.connector import _shape


def connector_shape(model: Path) -> Shape:
    """The shape the connector declares for ``model`` as vLLM's CPU
    platform runs it with ``block_size=32`` (MLA: vLLM makes it 16)."""
    config = EngineArgs(
        model=str(model),
        skip_tokenizer_init=True,
        load_format="dummy",
        dtype="float32",
        max_model_len=1024,
        block_size=BLOCK_TOKENS,
    ).create_engine_config()
    m, p = config.model_config, config.parallel_config
    kind = MLAAttentionSpec if m.use_mla else FullAttentionSpec
    # What vLLM's attention layers declare for their KV cache.
    spec = kind(
        block_size=config.cache_config.block_size,
        num_kv_heads=m.get_num_kv_heads(p),
        head_size=m.get_head_size(),
        dtype=torch.float32,
    )
    layers = [f"model.layers.{i}.self_attn" for i in range(m.get_num_layers(p))]
    groups = [KVCacheGroupSpec(layer_names=layers, kv_cache_spec=spec)]
    kv_cache_config = KVCacheConfig(num_blocks=1, kv_cache_tensors=[], kv_cache_groups=groups)
    return _shape(config, kv_cache_config, KvtierConfig(), 1)


def printed_env(model: Path) -> dict[str, str]:
    """``kvtier shape``'s ``KVTIER_GEOMETRY__*`` lines for ``model`` on CPU."""
    out = subprocess.run(
        [str(kvtier_bin()), "shape", str(model), "--platform", "cpu", "--block-size", str(BLOCK_TOKENS), "--format", "env"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines())


@pytest.mark.parametrize("which", ["llama", "deepseek"])
def test_kvtier_shape_agrees_with_the_connector_on_cpu(
    which: str, model_dir: Path, mla_model_dir: Path, tmp_path: Path
) -> None:
    model = model_dir if which == "llama" else mla_model_dir
    shape = connector_shape(model)
    env = printed_env(model)
    tokens = MLA_BLOCK_TOKENS if which == "deepseek" else BLOCK_TOKENS
    assert shape.block_size == int(env["KVTIER_GEOMETRY__TOKENS_PER_BLOCK"]) == tokens
    assert shape.layers == int(env["KVTIER_GEOMETRY__LAYERS"])
    daemon = start_daemon(tmp_path / "data", {**env, **STORE_ENV})
    try:
        serving = next(line for line in daemon.log if "kvtier serving" in line)
        assert f"{shape.layer_bytes} B per layer of a block" in serving, serving
        # The daemon holds exactly the connector's shape: it accepts it.
        client = kvtier.Client(daemon.socket, **namespace_of(KvtierConfig(), shape, None, 0, 1))
        assert (client.layers, client.layer_bytes) == (shape.layers, shape.layer_bytes)
    finally:
        daemon.stop()
