"""Where an SGLang host pool keeps each page, as kvtier blocks.

SGLang describes a page's bytes itself: ``get_page_buffer_meta(indices)``
of a host pool returns, for every page, the addresses and sizes of the
contiguous runs that hold it, the same runs SGLang's zero-copy backends
(Mooncake) copy. For the pools and layouts this backend takes, each run is
an affine function of the page index (``base + page * stride``) and every
run has the same size. Taken in address order, a page's runs are SGLang's
flat data page (``get_data_page(index, flat=True)``), so the zero-copy and
the flat-page calls store the same bytes:

============================  ====================  ===========================
pool, layout                  runs of one page      one run
============================  ====================  ===========================
MHA, ``layer_first``          ``2 * layers``        K of one layer (all K, then V)
MHA, ``page_first``           2                     K (then V) of every layer
MHA, ``page_first_direct``    2                     K (then V) of every layer
MLA, ``layer_first``          ``layers``            the latent of one layer
MLA, ``page_first``           1                     the latent of every layer
MLA, ``page_first_direct``    1                     the latent of every layer
============================  ====================  ===========================

A kvtier block is one page and a kvtier *layer* is one run: the copies use
``store_layers``/``read_layer`` with one ``(address, nbytes)`` region per
run, the page index as block id and the run's page stride, so no byte of a
page is copied twice and none passes through Python. The node's geometry
must be these runs (:meth:`PageLayout.node_geometry`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

#: kvtier's dtype name for each torch dtype a host pool may hold (only the
#: element size matters to the node: its geometry is bytes per run).
KVTIER_DTYPES: dict[torch.dtype, str] = {
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float8_e4m3fn: "fp8",
    torch.float8_e5m2: "fp8",
    torch.uint8: "int8",
    torch.int8: "int8",
}

#: Layouts whose pages this backend copies. ``page_head`` (heads split for
#: heterogeneous TP), ``page_unified`` and ``page_first_kv_split`` (NPU) are
#: not taken: their pages are not runs of one size at one stride.
LAYOUTS = ("layer_first", "page_first", "page_first_direct")

#: Attributes of a host pool that name what its bytes mean; they go into the
#: namespace so pools that differ in them never share pages.
_SHAPE_ATTRS = (
    "layer_num",
    "head_num",
    "head_dim",
    "v_head_dim",
    "kv_cache_dim",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "start_layer",
)


class LayoutError(ValueError):
    """A host pool whose pages this backend cannot copy."""


@dataclass(frozen=True)
class PageLayout:
    """One host pool's pages as kvtier blocks: ``runs`` regions, each with
    its page-0 address; page ``p`` of run ``r`` is ``run_bytes`` at
    ``bases[r] + p * stride``."""

    pool: str
    """The host pool's class name."""
    layout: str
    """SGLang's host layout (``layer_first``, ``page_first``, ...)."""
    page_size: int
    """Tokens per page: the node's tokens per block."""
    pages: int
    """Pages the pool holds."""
    dtype: torch.dtype
    bases: tuple[int, ...]
    """Address of each run of page 0."""
    run_bytes: int
    """Bytes of one run of one page: the node's bytes per layer."""
    stride: int
    """Bytes between one page and the next in every run."""
    shape: str
    """The pool's shape attributes, for the namespace."""

    @staticmethod
    def of(pool: Any) -> PageLayout:
        """Reads a host pool (``MHATokenToKVPoolHost``,
        ``MLATokenToKVPoolHost`` or one laid out like them);
        :class:`LayoutError` for one whose pages this backend cannot copy."""
        layout = str(getattr(pool, "layout", ""))
        if layout not in LAYOUTS:
            raise LayoutError(f"kvtier copies host layouts {LAYOUTS}; this pool is {layout!r}")
        buf = getattr(pool, "kv_buffer", None)
        if not isinstance(buf, torch.Tensor) or buf.device.type != "cpu":
            raise LayoutError("kvtier copies a host pool with one KV buffer in host memory")
        if buf.dtype not in KVTIER_DTYPES:
            raise LayoutError(f"kvtier has no element type for {buf.dtype}")
        page_size = int(pool.page_size)
        pages = int(pool.size) // page_size
        if pages < 1:
            raise LayoutError("the host pool holds no whole page")
        # Runs in address order: SGLang lists an MHA layer_first page's runs
        # layer by layer (K0, V0, K1, ...), but its flat data page, which the
        # flat-page calls copy whole, is K0, K1, ..., V0, V1, ...: the order
        # of their addresses, in every layout taken here.
        first, size = _runs(pool, 0, page_size)
        bases = tuple(first)
        stride = 0
        if pages > 1:
            second, _ = _runs(pool, 1, page_size)
            strides = {b - a for a, b in zip(first, second, strict=True)}
            if len(strides) != 1:
                raise LayoutError(f"runs of a page are {len(strides)} different strides apart; kvtier needs one")
            stride = strides.pop()
            last, _ = _runs(pool, pages - 1, page_size)
            if last != [b + (pages - 1) * stride for b in bases]:
                raise LayoutError("the pool's pages are not evenly spaced")
            if stride < size:
                raise LayoutError("pages of one run overlap")
        lay = PageLayout(
            pool=type(pool).__name__,
            layout=layout,
            page_size=page_size,
            pages=pages,
            dtype=buf.dtype,
            bases=bases,
            run_bytes=size,
            stride=stride,
            shape=",".join(f"{a}={getattr(pool, a)}" for a in _SHAPE_ATTRS if getattr(pool, a, None) is not None),
        )
        lay._check_inside(buf)
        return lay

    @property
    def runs(self) -> int:
        """Runs per page: the node's layers per block."""
        return len(self.bases)

    @property
    def block_bytes(self) -> int:
        """Bytes of one page."""
        return self.runs * self.run_bytes

    def regions(self) -> list[tuple[int, int]]:
        """``(address, nbytes)`` of every run over all pages: the layer
        buffers of ``store_layers`` and ``read_layer``."""
        span = (self.pages - 1) * self.stride + self.run_bytes
        return [(b, span) for b in self.bases]

    def block_ids(self, host_indices: torch.Tensor, pages: int) -> list[int]:
        """The page index of each of ``pages`` pages at ``host_indices``
        (``page_size`` token slots per page, as SGLang hands them: a page's
        first slot is page-aligned and names the page)."""
        if host_indices.numel() != pages * self.page_size:
            raise ValueError(f"{host_indices.numel()} host slots for {pages} pages of {self.page_size} tokens")
        firsts = host_indices.reshape(-1)[:: self.page_size].to(torch.int64)
        if bool((firsts % self.page_size != 0).any()):
            raise ValueError("a page's first host slot is not page-aligned")
        return [int(i) for i in (firsts // self.page_size).tolist()]

    def namespace_layout(self, pp: tuple[int, int], cp: tuple[int, int]) -> str:
        """What, beyond model, dtype, page size and TP rank, makes two pools'
        pages interchangeable: pool kind, layout, shape and the pipeline
        stage and context-parallel shard the pool holds."""
        return (
            f"sglang-hicache/v1/{self.pool}/{self.layout}/{self.shape}"
            f"/runs={self.runs}x{self.run_bytes}/pp={pp[0]}of{pp[1]}/cp={cp[0]}of{cp[1]}"
        )

    def node_geometry(self) -> dict[str, str]:
        """The node's ``[geometry]`` that holds these pages: ``runs`` layers
        of one part (kvtier's MLA shape, a layer of ``latent_dim`` elements
        per token) of ``run_bytes`` each. The preset only selects that shape;
        every field is set."""
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return {
            "preset": "deepseek-v3",
            "layers": str(self.runs),
            "latent_dim": str(self.run_bytes // (self.page_size * itemsize)),
            "dtype": KVTIER_DTYPES[self.dtype],
            "tokens_per_block": str(self.page_size),
        }

    def node_env(self) -> dict[str, str]:
        """:meth:`node_geometry` as ``KVTIER_GEOMETRY__*`` variables."""
        return {f"KVTIER_GEOMETRY__{k.upper()}": v for k, v in self.node_geometry().items()}

    def _check_inside(self, buf: torch.Tensor) -> None:
        """Every run of every page must lie in the pool's KV buffer: the copies
        write where these addresses say."""
        lo = buf.data_ptr()
        hi = lo + buf.numel() * buf.element_size()
        for addr, nbytes in self.regions():
            if addr < lo or addr + nbytes > hi:
                raise LayoutError("the pool's page runs lie outside its KV buffer")
        itemsize = buf.element_size()
        if self.run_bytes % (self.page_size * itemsize) != 0:
            raise LayoutError("a run is not whole elements per token")


def _runs(pool: Any, page: int, page_size: int) -> tuple[list[int], int]:
    """Addresses of the runs of one page, and their common size."""
    indices = torch.arange(page * page_size, (page + 1) * page_size, dtype=torch.int64)
    try:
        ptrs, sizes = pool.get_page_buffer_meta(indices)
    except (AssertionError, NotImplementedError, ValueError) as e:
        raise LayoutError(f"the pool does not describe its pages: {e}") from e
    ptrs = [int(p) for p in ptrs]
    sizes = [int(s) for s in sizes]
    if not ptrs or len(set(sizes)) != 1 or len(sizes) != len(ptrs):
        raise LayoutError("the runs of a page differ in size; kvtier needs one size")
    return sorted(ptrs), sizes[0]

