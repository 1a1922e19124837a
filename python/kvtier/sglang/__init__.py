"""kvtier for SGLang: :class:`KvtierHiCacheStorage`, a HiCache storage
backend (SGLang's L3) that keeps SGLang's KV pages in a kvtier node
(``kvtier serve``).

Load it as SGLang's ``dynamic`` backend::

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
            "module_path": "kvtier.sglang", "class_name": "KvtierHiCacheStorage",
            "interface_v1": 1, "socket": "/var/lib/kvtier/node.sock"}'

See docs/sglang.md in the repository.
"""

from kvtier.sglang.config import KvtierStorageConfig, page_key
from kvtier.sglang.layout import LayoutError, PageLayout
from kvtier.sglang.storage import KvtierHiCacheStorage

__all__ = ["KvtierHiCacheStorage", "KvtierStorageConfig", "LayoutError", "PageLayout", "page_key"]
