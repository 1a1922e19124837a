"""The connector's connections to the node daemon, one per tenant salt,
that survive the daemon going away (:class:`kvtier.clients.Clients`), and
the connector's logger.
"""

from __future__ import annotations

from typing import Any

import kvtier
import kvtier.clients
from kvtier.vllm.config import KvtierConfig, Shape, namespace_of

# vLLM's logger when present (its format and level settings), else ours.
logger: Any
try:
    from vllm.logger import init_logger

    logger = init_logger(__name__)
except ImportError:  # pragma: no cover - kvtier without vLLM
    import logging

    logger = logging.getLogger(__name__)


class Clients(kvtier.clients.Clients):
    """The connector's connections (:class:`kvtier.clients.Clients`): one
    per tenant salt, each salt its own namespace, so tenants never share
    blocks."""

    def __init__(self, config: KvtierConfig, shape: Shape, tp_rank: int, tp_size: int) -> None:
        def connect(salt: str | None) -> kvtier.Client:
            return kvtier.Client(config.socket, **namespace_of(config, shape, salt, tp_rank, tp_size))

        super().__init__(config.socket, config.reconnect_interval, connect, log=logger)
