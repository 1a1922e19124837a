"""A vLLM engine in multi-process mode (the scheduler in this process, each
worker in a process of its own, each a client of the daemon): runs each
prompt in turn, emptying vLLM's own prefix cache after each run, and prints
the output tokens and cached token count of each run as one JSON line.

Usage: python mp_engine.py MODEL_DIR SOCKET PROMPTS_JSON [--tp N] [--runs N]
       [--shard-heads K] [--weights] [--block-size N]

PROMPTS_JSON is a list of token-id lists; each is run RUNS times.
"""

from __future__ import annotations

import argparse
import json
import os

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model_dir")
    p.add_argument("socket")
    p.add_argument("prompts", type=json.loads)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--shard-heads", type=int, help="store head shards of this many KV heads")
    p.add_argument("--weights", action="store_true", help="load the model's weights (not dummy ones)")
    p.add_argument("--block-size", type=int, default=32)
    args = p.parse_args()
    if args.tp > 1:
        # vLLM's CPU workers bind their threads to NUMA nodes; a host with
        # one node needs the CPUs of each rank named.
        cpus = os.cpu_count() or 1
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(r % cpus) for r in range(args.tp)))

    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    from kvtier.vllm import reset_prefix_cache

    extra: dict[str, object] = {"socket": args.socket}
    if args.shard_heads is not None:
        extra["shard_heads"] = args.shard_heads
    sampling = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, detokenize=False)
    llm = LLM(
        model=args.model_dir,
        load_format="safetensors" if args.weights else "dummy",
        skip_tokenizer_init=True,
        enforce_eager=True,
        max_model_len=1024,
        block_size=args.block_size,
        enable_prefix_caching=True,
        dtype="float32",
        seed=0,
        kv_cache_memory_bytes=64 << 20,
        tensor_parallel_size=args.tp,
        distributed_executor_backend="mp",
        kv_transfer_config=KVTransferConfig(
            kv_connector="KvtierConnector",
            kv_connector_module_path="kvtier.vllm",
            kv_role="kv_both",
            kv_connector_extra_config=extra,
            kv_load_failure_policy="recompute",
        ),
    )
    results = []
    for prompt in args.prompts:
        for _ in range(args.runs):
            out = llm.generate([{"prompt_token_ids": prompt}], sampling, use_tqdm=False)[0]
            results.append({"tokens": list(out.outputs[0].token_ids), "cached": int(out.num_cached_tokens or 0)})
            reset_prefix_cache(llm)
    print("RESULT " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
