"""Helpers for vLLM's offline ``LLM`` with the kvtier connector."""

from __future__ import annotations

import time
from typing import Any


def reset_prefix_cache(llm: Any, timeout: float = 60.0) -> None:
    """Empties vLLM's own prefix cache (``LLM.reset_prefix_cache``), waiting
    for kvtier's saves first.

    Usually ``LLM.reset_prefix_cache()`` succeeds right after ``generate``:
    a finished request's blocks are freed at once when its saves are done.
    A request that finished while its saves still ran keeps its blocks
    until they are, and vLLM refuses to reset its cache while any block is
    allocated. The engine frees the blocks at its next step: in
    multi-process mode its core keeps stepping by itself, in-process (with
    ``VLLM_ENABLE_V1_MULTIPROCESSING=0``) this steps it. Raises
    ``TimeoutError`` if the blocks are still held after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    in_process = hasattr(llm.llm_engine.engine_core, "engine_core")
    while not llm.reset_prefix_cache():
        if time.monotonic() > deadline:
            raise TimeoutError(f"vLLM still holds KV blocks after {timeout} s; is a request running?")
        if in_process:
            llm.llm_engine.step()
        else:
            time.sleep(0.005)
