"""A vLLM engine in multi-process mode (the scheduler in this process, each
worker in a process of its own, each a client of the daemon): runs one
prompt RUNS times, emptying vLLM's own prefix cache in between, and prints
the output tokens and cached token count of each run as one JSON line.

Usage: python mp_engine.py MODEL_DIR SOCKET PROMPT_JSON [TP_SIZE [RUNS]]
"""

from __future__ import annotations

import json
import os
import sys

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")


def main() -> None:
    model_dir, socket, prompt = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    tp = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    runs = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    if tp > 1:
        # vLLM's CPU workers bind their threads to NUMA nodes; a host with
        # one node needs the CPUs of each rank named.
        cpus = os.cpu_count() or 1
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(r % cpus) for r in range(tp)))

    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    from kvtier.vllm import reset_prefix_cache

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
        tensor_parallel_size=tp,
        distributed_executor_backend="mp",
        kv_transfer_config=KVTransferConfig(
            kv_connector="KvtierConnector",
            kv_connector_module_path="kvtier.vllm",
            kv_role="kv_both",
            kv_connector_extra_config={"socket": socket},
            kv_load_failure_policy="recompute",
        ),
    )
    results = []
    for _ in range(runs):
        out = llm.generate([{"prompt_token_ids": prompt}], sampling, use_tqdm=False)[0]
        results.append({"tokens": list(out.outputs[0].token_ids), "cached": int(out.num_cached_tokens or 0)})
        reset_prefix_cache(llm)
    print("RESULT " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
