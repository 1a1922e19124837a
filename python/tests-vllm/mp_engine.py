"""A vLLM engine in multi-process mode (the scheduler in this process, the
worker in an engine-core process, each a client of the daemon): runs one
prompt once and prints its output tokens and cached token count as one
JSON line.

Usage: python mp_engine.py MODEL_DIR SOCKET PROMPT_JSON
"""

from __future__ import annotations

import json
import os
import sys

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")


def main() -> None:
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    model_dir, socket, prompt = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    sampling = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, detokenize=False)
    llm = LLM(
        model=model_dir,
        load_format="dummy",
        skip_tokenizer_init=True,
        enforce_eager=True,
        max_model_len=1024,
        block_size=32,
        enable_prefix_caching=True,
        dtype="float32",
        seed=0,
        kv_cache_memory_bytes=64 << 20,
        kv_transfer_config=KVTransferConfig(
            kv_connector="KvtierConnector",
            kv_connector_module_path="kvtier.vllm",
            kv_role="kv_both",
            kv_connector_extra_config={"socket": socket},
            kv_load_failure_policy="recompute",
        ),
    )
    out = llm.generate([{"prompt_token_ids": prompt}], sampling, use_tqdm=False)[0]
    result = {"tokens": list(out.outputs[0].token_ids), "cached": int(out.num_cached_tokens or 0)}
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
