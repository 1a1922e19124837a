"""kvtier for vLLM: :class:`KvtierConnector`, a ``KVConnectorBase_V1`` that
keeps vLLM's KV blocks in a kvtier node (``kvtier serve``).

Load it with::

    KVTransferConfig(
        kv_connector="KvtierConnector",
        kv_connector_module_path="kvtier.vllm",
        kv_role="kv_both",
        kv_connector_extra_config={"socket": "/path/to/node.sock"},
        kv_load_failure_policy="recompute",
    )

With the offline ``LLM``, ``LLM.reset_prefix_cache()`` empties vLLM's own
prefix cache once the connector's saves are done (usually right after
``generate``); :func:`reset_prefix_cache` waits for them.

See docs/vllm.md in the repository.
"""

from kvtier.vllm.connector import KvtierConnector
from kvtier.vllm.offline import reset_prefix_cache
from kvtier.vllm.scheduler import KvtierConnectorMetadata

__all__ = ["KvtierConnector", "KvtierConnectorMetadata", "reset_prefix_cache"]
