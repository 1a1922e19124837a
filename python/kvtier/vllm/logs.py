"""kvtier's loggers inside vLLM.

vLLM configures only its own logger tree (``vllm``: its handler, format,
``VLLM_LOGGING_LEVEL``, ``VLLM_CONFIGURE_LOGGING`` and
``VLLM_LOGGING_CONFIG_PATH``), and stops propagation there. A logger named
``kvtier.vllm...`` would sit outside that tree: its records reach only the
root logger, which vLLM leaves unconfigured, so an operator never sees them.
kvtier's vLLM-side modules therefore log under ``vllm.`` + their module name,
and vLLM's settings apply to them in every vLLM process.
"""

from __future__ import annotations

import logging

#: Prefix that puts a kvtier module's logger in vLLM's logger tree.
VLLM_TREE = "vllm."


def init_logger(module: str) -> logging.Logger:
    """The logger of kvtier module ``module`` (its ``__name__``), in vLLM's
    logger tree when vLLM is installed, else a plain logger of that name."""
    try:
        from vllm.logger import init_logger as vllm_init_logger
    except ImportError:  # pragma: no cover - kvtier without vLLM
        return logging.getLogger(module)
    return vllm_init_logger(VLLM_TREE + module)
