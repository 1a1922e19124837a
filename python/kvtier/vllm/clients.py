"""The connector's connections to the node daemon, one per tenant salt,
that survive the daemon going away (:class:`kvtier.clients.Clients`), and
the connector's logger.
"""

from __future__ import annotations

import kvtier
import kvtier.clients
from kvtier.vllm.config import KvtierConfig, Shape, namespace_of
from kvtier.vllm.logs import init_logger

# In vLLM's logger tree: vLLM's handler, format and level apply.
logger = init_logger(__name__)


class Clients(kvtier.clients.Clients):
    """The connector's connections (:class:`kvtier.clients.Clients`): one
    per tenant salt, each salt its own namespace, so tenants never share
    blocks."""

    def __init__(self, config: KvtierConfig, shape: Shape, tp_rank: int, tp_size: int) -> None:
        def connect(salt: str | None) -> kvtier.Client:
            return kvtier.Client(config.socket, **namespace_of(config, shape, salt, tp_rank, tp_size))

        super().__init__(config.socket, config.reconnect_interval, connect, log=logger)
