"""Copies of paged KV blocks between an engine's KV cache on a device (a
CUDA GPU, or host memory laid out as a GPU's would be) and kvtier's arena.

The arena holds a block's layer as one run of bytes (docs/memory-arena.md):
here, the block's ``[heads, tokens, content]`` in that order, contiguous.
That is the image vLLM's CPU KV cache already keeps per block (its
``LBHNC`` layout), so the host route copies it straight from the paged
buffer; a device KV cache is laid out in another order, or lives where the
node cannot read it. For those this module *gathers* a layer's blocks into
a contiguous staging buffer in host memory (the node then copies it into
arena slots, computing the checksums on the host) and *scatters* verified
bytes read from the arena back into the blocks.

Layouts are vLLM 0.32's (``vllm.v1.kv_cache_layout.KVCacheLayout``): every
layer's cache is a logical ``[blocks, heads, tokens, content]`` view whose
content holds K then V (``head_size + head_size_v`` elements) or an MLA
latent (``heads == 1``), and the layout is the order of
``[layers, blocks, heads, tokens, content]`` in memory. :data:`KV_LAYOUTS`
names them; :func:`paged_kv_cache` builds a cache the way vLLM allocates
one (tests and ``benchmarks/gpu_check.py``). A cache with its blocks on
another axis (older vLLM's ``[2, blocks, tokens, heads, head_size]``) is
copied with ``block_dim``.

Everything is torch operations that run alike on CPU and CUDA tensors
(``index_select``/``index_copy_`` over block ids, views); the CUDA-only
part is small: pinned staging, one copy stream per direction and an event
per copy. With CPU tensors the same code runs without any of it, so CI
covers all but those calls.

Importable without vLLM.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from math import prod
from typing import Any

import torch

#: vLLM 0.32's KV cache layouts by name: the order of the logical axes
#: ``[layers, blocks, heads, tokens, content]`` in memory, outermost first.
#: ``LBNHC`` is "NHD" (FlashAttention's default), ``LBHNC`` "HND"
#: (FlashInfer on Blackwell, the CPU backend); the ``B...`` orders keep all
#: layers of a block together (cross-layer blocks).
KV_LAYOUTS: dict[str, tuple[int, ...]] = {
    "LBHNC": (0, 1, 2, 3, 4),
    "LBNHC": (0, 1, 3, 2, 4),
    "LHBNC": (0, 2, 1, 3, 4),
    "BLHNC": (1, 0, 2, 3, 4),
    "BLNHC": (1, 0, 3, 2, 4),
    "BHLNC": (1, 2, 0, 3, 4),
}

#: Bytes of one batch of a save: a copier keeps two batches' staging for
#: saves in host memory (and, on a GPU, two on the device); loads keep two
#: layers of a step's blocks.
DEFAULT_BATCH_BYTES = 64 << 20


def paged_kv_cache(
    layout: str,
    *,
    layers: int,
    blocks: int,
    heads: int,
    tokens: int,
    content: int,
    dtype: torch.dtype,
    device: torch.device | str,
) -> list[torch.Tensor]:
    """One layer view ``[blocks, heads, tokens, content]`` per layer over one
    buffer laid out as ``layout`` (a :data:`KV_LAYOUTS` name), as vLLM 0.32
    allocates its KV cache; zero-filled."""
    order = KV_LAYOUTS[layout]
    logical = (layers, blocks, heads, tokens, content)
    raw = torch.zeros(prod(logical), dtype=dtype, device=device)
    strides = [0] * 5
    step = 1
    for dim in reversed(order):
        strides[dim] = step
        step *= logical[dim]
    whole = raw.as_strided(logical, strides)
    return [whole[i] for i in range(layers)]


def _blocks_first(layer: torch.Tensor, block_dim: int) -> torch.Tensor:
    """``layer``'s bytes with the block axis first and the rest in logical
    order: ``[blocks, ..., content bytes]``. The innermost axis must be
    dense (every vLLM layout keeps the content innermost)."""
    if layer.stride(-1) != 1:
        raise ValueError(f"the innermost axis of a KV layer is not dense (strides {layer.stride()})")
    return layer.view(torch.uint8).movedim(block_dim, 0)


def row_bytes(layer: torch.Tensor, block_dim: int = 0) -> int:
    """Bytes of one block of ``layer``: one row of the staged image."""
    return layer.numel() // layer.shape[block_dim] * layer.element_size()


def gather(layer: torch.Tensor, ids: torch.Tensor, out: torch.Tensor, block_dim: int = 0) -> None:
    """Copies blocks ``ids`` of ``layer`` into ``out`` (``[len(ids), row]``
    bytes, contiguous, on ``layer``'s device), block ``ids[i]`` as row
    ``i`` in logical order."""
    src = _blocks_first(layer, block_dim)
    torch.index_select(src, 0, ids, out=out.view(len(ids), *src.shape[1:]))


def scatter(layer: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor, block_dim: int = 0) -> None:
    """Copies ``rows`` (``[len(ids), row]`` bytes as :func:`gather` lays
    them, on ``layer``'s device) into blocks ``ids`` of ``layer``."""
    dst = _blocks_first(layer, block_dim)
    dst.index_copy_(0, ids, rows.view(len(ids), *dst.shape[1:]))


class DeviceCopier:
    """Gathers and scatters the blocks of one rank's per-layer KV views
    through host staging, for a client that copies the staging to and
    from arena slots (``Client.store_layers`` and ``Load.read_layer``).

    Saves: :meth:`stage_out` gathers whole blocks (every layer) into host
    staging a batch at a time, on a stream of its own that first waits for
    the forward (:meth:`ready`), and hands each batch to the caller (a
    background saver) while the next one is copied: the next step runs
    beside it. Loads, layer by layer, after :meth:`start_loads` marks the
    step: :meth:`load_region` lends host staging for one layer's blocks (the
    client writes verified bytes there), :meth:`stage_in` copies them into
    the blocks on the load stream and makes the forward's stream wait for
    them, so the forward never waits on the host.

    Load methods belong to one thread (the forward's), save methods to
    another (the saver's)."""

    def __init__(
        self,
        layers: Sequence[torch.Tensor],
        *,
        block_dim: int = 0,
        batch_bytes: int = DEFAULT_BATCH_BYTES,
    ) -> None:
        if not layers:
            raise ValueError("no KV layers")
        self._layers = list(layers)
        self._block_dim = block_dim
        self.device = self._layers[0].device
        self.row = row_bytes(self._layers[0], block_dim)
        """Bytes of one block of one layer."""
        for t in self._layers:
            _blocks_first(t, block_dim)  # the layout is one we can view
            if t.device != self.device or row_bytes(t, block_dim) != self.row:
                raise ValueError(f"KV layers differ: {t.device} rows of {row_bytes(t, block_dim)} bytes")
        self._cuda = self.device.type == "cuda"
        self.batch_blocks = max(1, batch_bytes // (self.row * len(self._layers)))
        """Blocks per batch of :meth:`stage_out`."""
        self._save_stream: Any = torch.cuda.Stream(self.device) if self._cuda else None
        self._load_stream: Any = torch.cuda.Stream(self.device) if self._cuda else None
        # Saves: two batches' slots, one filling while the caller stores
        # the other.
        self._out_host = self._host(2 * len(self._layers), self.batch_blocks).view(2, len(self._layers), self.batch_blocks, self.row)
        out_dev = self._staging_on_device(2 * len(self._layers), self.batch_blocks)
        self._out_dev = None if out_dev is None else out_dev.view(2, len(self._layers), self.batch_blocks, self.row)
        # Loads: two layers' slots, so the client fills one while the other
        # still goes to the device; an event per slot says when it is free.
        self._in_host = self._host(2, 0)
        self._in_dev = self._staging_on_device(2, 0)
        self._in_done: list[Any] = [None, None]
        self._step: Any = None

    # ------------------------------------------------------------- staging

    def _host(self, slots: int, blocks: int) -> torch.Tensor:
        """Host staging of ``slots`` x ``blocks`` rows; pinned next to a
        GPU, so copies to and from it are DMA that overlaps compute."""
        return torch.empty((slots, blocks, self.row), dtype=torch.uint8, pin_memory=self._cuda)

    def _staging_on_device(self, slots: int, blocks: int) -> torch.Tensor | None:
        """Device staging that gathers land in before the copy to the host
        (none on the CPU: the host staging is the device's memory)."""
        if not self._cuda:
            return None
        return torch.empty((slots, blocks, self.row), dtype=torch.uint8, device=self.device)

    def _ids(self, ids: Sequence[int]) -> torch.Tensor:
        return torch.tensor(list(ids), dtype=torch.long).to(self.device, non_blocking=True)

    # --------------------------------------------------------------- saves

    def ready(self) -> Any:
        """A mark on the calling (forward) thread's stream after the work
        queued so far: a save of blocks this step wrote waits for it.
        ``None`` on the CPU, where the forward is done when it returns."""
        if not self._cuda:
            return None
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event

    def stage_out(
        self, block_ids: Sequence[int], ready: Any = None, layers: Sequence[int] | None = None
    ) -> Iterator[tuple[int, list[tuple[int, int]]]]:
        """Gathers ``layers`` (indices of the views; all by default) of
        ``block_ids`` into host staging, once
        ``ready`` (from :meth:`ready`) has passed, :attr:`batch_blocks` at
        a time: yields ``(count, regions)`` per batch in order, ``regions``
        an ``(address, nbytes)`` per layer with the batch's block ``i`` at
        ``i * row``, valid until the next step of the iteration. On a GPU
        the next batch's copy runs while the caller stores this one."""
        ids = list(block_ids)
        which = list(range(len(self._layers))) if layers is None else list(layers)
        batches = [ids[i : i + self.batch_blocks] for i in range(0, len(ids), self.batch_blocks)]
        pending = self._stage_batch(batches[0], 0, ready, which) if batches else None
        for k, batch in enumerate(batches):
            following = self._stage_batch(batches[k + 1], (k + 1) % 2, ready, which) if k + 1 < len(batches) else None
            if pending is not None:
                pending.synchronize()
            host = self._out_host[k % 2]
            yield len(batch), [(int(host[i].data_ptr()), len(batch) * self.row) for i in which]
            pending = following

    def _stage_batch(self, block_ids: list[int], slot: int, ready: Any, which: list[int]) -> Any:
        """Queues the gather of layers ``which`` of ``block_ids`` into host
        staging ``slot``; the event that marks it done (``None`` on the
        CPU, where it is done on return)."""
        n = len(block_ids)
        host = [self._out_host[slot][i] for i in which]
        views = [self._layers[i] for i in which]
        if not self._cuda:
            ids = self._ids(block_ids)
            for layer, out in zip(views, host):
                gather(layer, ids, out[:n], self._block_dim)
            return None
        assert self._out_dev is not None
        dev = [self._out_dev[slot][i] for i in which]
        with torch.cuda.stream(self._save_stream):
            if ready is not None:
                self._save_stream.wait_event(ready)
            ids = self._ids(block_ids)
            for layer, d, h in zip(views, dev, host):
                gather(layer, ids, d[:n], self._block_dim)
                h[:n].copy_(d[:n], non_blocking=True)
            done = torch.cuda.Event()
            done.record(self._save_stream)
        return done

    # --------------------------------------------------------------- loads

    def start_loads(self) -> None:
        """Marks the forward's stream before a step's loads: their copies
        into blocks wait for the work queued before (the blocks' previous
        users may still be writing them), not for this step's layers."""
        self._step = self.ready()

    def load_region(self, layer: int, blocks: int) -> tuple[int, int]:
        """``(address, nbytes)`` of host staging for ``blocks`` rows of
        ``layer``, free to write (its previous copy to the device is
        done)."""
        slot = layer % 2
        if blocks > self._in_host.shape[1]:
            self._grow_loads(blocks)
        done = self._in_done[slot]
        if done is not None:
            done.synchronize()
            self._in_done[slot] = None
        return int(self._in_host[slot].data_ptr()), blocks * self.row

    def _grow_loads(self, blocks: int) -> None:
        """Larger load staging (at least doubled: a step's loads grow to a
        steady size); copies in flight from the old one finish first."""
        for done in self._in_done:
            if done is not None:
                done.synchronize()
        self._in_done = [None, None]
        blocks = max(blocks, 2 * self._in_host.shape[1])
        self._in_host = self._host(2, blocks)
        self._in_dev = self._staging_on_device(2, blocks)

    def stage_in(self, layer: int, block_ids: Sequence[int], rows: Sequence[int]) -> None:
        """Copies staging rows ``rows`` of ``layer``'s :meth:`load_region`
        into blocks ``block_ids`` of ``layer``. The forward's stream waits
        for the copy; the caller does not."""
        if not block_ids:
            return
        slot = layer % 2
        host = self._in_host[slot]
        if not self._cuda:
            scatter(self._layers[layer], self._ids(block_ids), self._rows(host, rows), self._block_dim)
            return
        assert self._in_dev is not None
        dev = self._in_dev[slot]
        used = max(rows) + 1
        with torch.cuda.stream(self._load_stream):
            dev[:used].copy_(host[:used], non_blocking=True)
            if self._step is not None:
                self._load_stream.wait_event(self._step)
            scatter(self._layers[layer], self._ids(block_ids), self._rows(dev, rows), self._block_dim)
            done = torch.cuda.Event()
            done.record(self._load_stream)
        torch.cuda.current_stream(self.device).wait_event(done)
        self._in_done[slot] = done

    def _rows(self, staging: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
        """Rows ``rows`` of ``staging``: a view when they are the leading
        ones in order (every block verified, the usual case), else a
        copy."""
        if list(rows) == list(range(len(rows))):
            return staging[: len(rows)]
        return staging.index_select(0, self._ids(rows))

    def drain(self) -> None:
        """Waits for every load copy in flight (before the staging is
        reused from another thread or freed)."""
        for slot, done in enumerate(self._in_done):
            if done is not None:
                done.synchronize()
                self._in_done[slot] = None
