"""The connector's worker side: loads read layer by layer into vLLM's paged
KV buffers as the forward reaches each layer; saves copy finished prompt
blocks from those buffers into the node on a background thread, so the
next step does not wait for them. Each KV-cache group (docs/vllm.md,
"Hybrid models") loads and saves its own layers in its own namespace."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

import kvtier
from kvtier.device import DeviceCopier
from kvtier.vllm.clients import Clients, logger
from kvtier.vllm.config import Shape
from kvtier.vllm.events import KvtierWorkerMetadata
from kvtier.vllm.groups import Group, primary
from kvtier.vllm.layouts import RankBlocks
from kvtier.vllm.scheduler import KvtierConnectorMetadata, Transfer
from kvtier.vllm.stats import KvtierStats, WorkerStats


@dataclass
class _Loading:
    """A load in progress: the node pinned ``pinned`` leading blocks."""

    transfer: Transfer
    load: kvtier.Load
    pinned: int


class KvtierWorker:
    """Loads and saves of one worker (one TP rank); ``clients[g]`` serve
    KV-cache group ``groups[g]``."""

    def __init__(self, shape: Shape, groups: list[Group], clients: list[Clients], tp_rank: int, layout: RankBlocks) -> None:
        self._shape = shape
        self._groups = groups
        self._clients = clients
        self._layout = layout
        self._reports = tp_rank == 0
        self._primary = primary(groups)
        self._positions: dict[str, tuple[int, int]] = {
            name: (g.index, j) for g in groups for j, name in enumerate(g.layer_names)
        }
        self._layers: list[torch.Tensor] = []
        self._layer_index: dict[str, int] = {}
        # Set when the KV cache is not host blocks of contiguous rows (a
        # GPU's): blocks then go through host staging (kvtier.device).
        self._copier: DeviceCopier | None = None
        self._loading: list[_Loading] = []
        self._load_errors: set[int] = set()
        self._corrupt: dict[tuple[int, str | None], set[int]] = {}
        self._stats = WorkerStats()
        # Saves run one at a time, off the forward's thread; the copies
        # release the GIL, so the next step runs beside them.
        self._saver = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvtier-save")
        self._lock = threading.Lock()
        self._saves: dict[str, list[Future[None]]] = {}
        self._finishing: set[str] = set()
        self._window_saves: list[Future[None]] = []
        """Saves of sliding-window blocks, which vLLM frees while the
        request runs: they end before the next forward."""
        self._said = KvtierWorkerMetadata()

    # ---------------------------------------------------------------- buffers

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        # A rank's objects of a block lie side by side in its block row.
        row = self._shape.layer_bytes * self._layout.per_block
        direct = all(t.device.type == "cpu" and t[0].is_contiguous() for t in kv_caches.values())
        for name, t in kv_caches.items():
            per_block = t[0].numel() * t.element_size()
            if per_block != row:
                # Not the blocks this engine's shape names: run without the
                # cache rather than stop the engine.
                logger.warning(
                    "kvtier needs KV blocks of %d bytes per layer; layer %s is %s %s on %s: running without the cache",
                    row,
                    name,
                    tuple(t.shape),
                    t.dtype,
                    t.device,
                )
                return
        if not direct:
            self._copier = _copier(kv_caches)
            if self._copier is None:
                return
        self._layers = list(kv_caches.values())
        self._layer_index = {name: i for i, name in enumerate(kv_caches)}

    def _group_layers(self, group: int) -> list[int]:
        """Indices in ``_layers`` of ``group``'s layers, in forward order."""
        return [self._layer_index[name] for name in self._groups[group].layer_names]

    def _region(self, layer: int) -> tuple[int, int, int]:
        """(address, nbytes, object stride) of one layer's paged buffer:
        the stride between the layout's virtual blocks."""
        t = self._layers[layer]
        stride = t.stride(0) * t.element_size()
        return t.data_ptr(), stride * t.shape[0], stride // self._layout.per_block

    # ------------------------------------------------------------------ loads

    def start_load_kv(self, meta: KvtierConnectorMetadata) -> None:
        if not self._layers:
            # No usable KV buffers: every planned block is recomputed.
            for t in meta.loads:
                self._load_errors.update(t.block_ids)
            return
        if meta.loads and self._copier is not None:
            self._copier.start_loads()
        for t in meta.loads:
            began = time.perf_counter()
            load = self._clients[t.group].call(t.salt, "load", _loader(self._layout.rank_keys(t.keys), t.tiers), None)
            pinned = self._layout.blocks_of(load.prefix_len) if load is not None else 0
            # What the node no longer holds is recomputed.
            self._load_errors.update(t.block_ids[pinned:])
            if load is not None:
                self._loading.append(_Loading(t, load, pinned))
            self._stats.load_started(began)

    def wait_for_layer_load(self, layer_name: str) -> None:
        position = self._positions.get(layer_name)
        if position is None or not self._loading or layer_name not in self._layer_index:
            return
        group, layer = position
        self._read_layer(group, layer)
        if layer == len(self._groups[group].layer_names) - 1:
            self._finish_loads(group)

    def _read_layer(self, group: int, layer: int) -> None:
        """Reads layer ``layer`` of ``group`` (its index in the group's
        stored objects) of every load of that group."""
        index = self._group_layers(group)[layer]
        loads = [ld for ld in self._loading if ld.transfer.group == group]
        if self._copier is not None:
            self._read_layer_staged(layer, index, loads, self._copier)
            return
        addr, nbytes, stride = self._region(index)
        for ld in loads:
            ids = ld.transfer.block_ids[: ld.pinned]
            self._read_blocks(ld, layer, (addr, nbytes), self._layout.rank_ids(ids), stride)

    def _read_layer_staged(self, layer: int, index: int, loads: list[_Loading], copier: DeviceCopier) -> None:
        """Reads one layer (``layer`` of the group, ``index`` of the KV
        cache) of ``loads`` into host staging, one block after another,
        then copies the verified blocks to the device."""
        dst = copier.load_region(index, sum(ld.pinned for ld in loads))
        ids: list[int] = []
        rows: list[int] = []
        base = 0
        for ld in loads:
            staged = list(range(base, base + ld.pinned))
            ok = self._read_blocks(ld, layer, dst, self._layout.rank_ids(staged), self._shape.layer_bytes)
            ids.extend(b for b, good in zip(ld.transfer.block_ids, ok) if good)
            rows.extend(r for r, good in zip(staged, ok) if good)
            base += ld.pinned
        copier.stage_in(index, ids, rows)

    def _read_blocks(self, ld: _Loading, layer: int, dst: tuple[int, int], objects: list[int], stride: int) -> list[bool]:
        """Reads one layer of ``ld``'s pinned blocks into ``dst``, object
        ``i`` at ``objects[i] * stride``; whether each block was read whole
        and verified (one that was not is recomputed, and removed)."""
        t = ld.transfer
        n = self._layout.per_block
        try:
            ld.load.wait_layer(layer)
            ok = ld.load.read_layer(layer, dst, objects, stride)
        except kvtier.KvtierError as e:
            logger.warning("kvtier load of request %s failed at layer %d: %s", t.req_id, layer, e)
            ok = [False] * len(objects)
        whole = [all(ok[i * n : (i + 1) * n]) for i in range(ld.pinned)]
        for i, good in enumerate(whole):
            if not good:
                self._load_errors.add(t.block_ids[i])
                self._corrupt.setdefault((t.group, t.salt), set()).add(t.keys[i])
        return whole

    def _finish_loads(self, group: int) -> None:
        """Releases ``group``'s loads once all its layers are read."""
        block_bytes = len(self._groups[group].layer_names) * self._shape.layer_bytes * self._layout.per_block
        for ld in [ld for ld in self._loading if ld.transfer.group == group]:
            try:
                ld.load.release()
            except kvtier.KvtierError as e:
                logger.warning("kvtier release of request %s failed: %s", ld.transfer.req_id, e)
            self._stats.loaded(block_bytes, ld.transfer.tiers[: ld.pinned])
            self._loading.remove(ld)
        # A block that failed verification is a miss for every reader:
        # remove it, so the next save of its key stores good bytes.
        for (g, salt), keys in list(self._corrupt.items()):
            if g != group:
                continue
            logger.warning("kvtier: %d blocks failed verification; vLLM recomputes them", len(keys))
            self._clients[g].call(salt, "remove", _remover(self._layout.rank_keys(sorted(keys))), None)
            if self._reports and g == self._primary:
                self._said.removed.extend(keys)
            del self._corrupt[(g, salt)]

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        self._stats.add(load_failed_blocks=len(errors))
        return errors

    # ------------------------------------------------------------------ saves

    def wait_for_save(self, meta: KvtierConnectorMetadata | None) -> None:
        """Ends this step's loads and starts its saves."""
        for group in sorted({ld.transfer.group for ld in self._loading}):
            # A forward that did not visit every layer: read the rest so no
            # slot stays pinned.
            for layer in range(len(self._groups[group].layer_names)):
                self._read_layer(group, layer)
            self._finish_loads(group)
        if meta is None:
            return
        # Device copies of this step's saves wait for its forward.
        ready = self._copier.ready() if self._copier is not None and meta.saves else None
        for t in meta.saves:
            if self._layers:
                future = self._saver.submit(self._save, t, ready)
            else:
                future = Future()
                future.set_result(None)
                self._report(t, [])
            with self._lock:
                self._saves.setdefault(t.req_id, []).append(future)
                if self._groups[t.group].window is not None:
                    self._window_saves.append(future)

    def _save(self, t: Transfer, ready: object = None) -> None:
        stored: list[int] = []
        try:
            began = time.perf_counter()
            if self._copier is not None:
                stored = self._store_staged(t, self._copier, ready)
            else:
                stored = self._store(t, t.keys, self._regions(t.group, t.block_ids))
            block_bytes = len(self._groups[t.group].layer_names) * self._shape.layer_bytes * self._layout.per_block
            self._stats.saved(began, len(stored) * block_bytes, len(stored))
        except Exception as e:  # a bug here must not leave the request's blocks held
            logger.warning("kvtier save of request %s failed: %s", t.req_id, e)
        finally:
            self._report(t, stored)

    def _regions(self, group: int, block_ids: list[int]) -> tuple[list[tuple[int, int]], list[int], int]:
        """Where ``block_ids``' objects of ``group`` lie in the paged
        buffers: a region per stored layer, the objects' virtual block ids,
        and their stride."""
        regions = [self._region(i) for i in self._group_layers(group)]
        layers = self._padded([(addr, nbytes) for addr, nbytes, _ in regions])
        return layers, self._layout.rank_ids(block_ids), regions[0][2]

    def _padded(self, layers: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """``layers`` filled up to the daemon's layers with the last one: a
        group smaller than the shape (vLLM pads groups to one size) stores
        its last layer again, never read back."""
        return layers + [layers[-1]] * (self._shape.layers - len(layers))

    def _store_staged(self, t: Transfer, copier: DeviceCopier, ready: object) -> list[int]:
        """Stores ``t``'s blocks through host staging, a batch at a time."""
        stored: list[int] = []
        start = 0
        for n, layers in copier.stage_out(t.block_ids, ready, self._group_layers(t.group)):
            objects = self._layout.rank_ids(list(range(n)))
            at = (self._padded(layers), objects, self._shape.layer_bytes)
            stored += self._store(t, t.keys[start : start + n], at)
            start += n
        return stored

    def _store(self, t: Transfer, keys: list[int], at: tuple[list[tuple[int, int]], list[int], int]) -> list[int]:
        """Stores the blocks ``keys`` of ``t``'s group whose objects lie
        ``at`` (as :meth:`_regions` says); the keys the node holds whole
        after."""
        layers, objects, stride = at
        none: list[str] = []
        store = _storer(self._layout.rank_keys(keys), layers, objects, stride)
        outcomes = self._clients[t.group].call(t.salt, "store", store, none)
        return self._whole_blocks(keys, outcomes)

    def _whole_blocks(self, keys: list[int], outcomes: list[str]) -> list[int]:
        """The blocks of ``keys`` whose every object the node holds after a
        store with ``outcomes`` (one per object)."""
        n = self._layout.per_block
        held = [o in ("stored", "already_stored") for o in outcomes]
        return [k for i, k in enumerate(keys) if len(held) >= (i + 1) * n and all(held[i * n : (i + 1) * n])]

    def _report(self, t: Transfer, stored: list[int]) -> None:
        done = set(stored)
        with self._lock:
            # Every rank counts its finished saves: the scheduler frees a
            # finished request's blocks once all ranks are done with them.
            self._said.saves_done[t.req_id] = self._said.saves_done.get(t.req_id, 0) + 1
            # The primary group's stores stand for the block in KV events.
            if self._reports and t.group == self._primary:
                self._said.stored.extend(stored)
                self._said.not_stored.extend(k for k in t.keys if k not in done)

    def handle_preemptions(self, meta: KvtierConnectorMetadata) -> None:
        """Called before every forward. vLLM may hand the blocks of a
        preempted request, and the sliding-window blocks a running request
        left behind, to another request in this step: saves still copying
        them finish before the forward writes them. (Usually they are long
        done: a prompt's saves start in its prefill step.)"""
        with self._lock:
            futures = [f for r in meta.preempted for f in self._saves.get(r, ())]
            # Finished requests whose saves every rank reported done.
            futures += [f for r in meta.finished for f in self._saves.pop(r, ())]
            futures += self._window_saves
            self._window_saves = []
        for f in futures:
            f.exception()

    def get_finished(self, meta: KvtierConnectorMetadata | None) -> set[str]:
        """Requests whose blocks the scheduler kept for their saves
        (``meta.delayed``), once those saves are done: vLLM frees the
        blocks now. Every rank reports each of them, as vLLM expects."""
        done: set[str] = set()
        with self._lock:
            if meta is not None:
                self._finishing.update(meta.delayed)
            for req_id in list(self._finishing):
                if all(f.done() for f in self._saves.get(req_id, ())):
                    self._finishing.discard(req_id)
                    self._saves.pop(req_id, None)
                    done.add(req_id)
        return done

    def take_worker_metadata(self) -> KvtierWorkerMetadata | None:
        with self._lock:
            said, self._said = self._said, KvtierWorkerMetadata()
        if not said:
            return None
        return said

    def take_stats(self) -> KvtierStats | None:
        return self._stats.take()

    def shutdown(self) -> None:
        """Waits for saves in flight (their blocks must not be freed under
        them), and loads' copies to the device."""
        self._saver.shutdown(wait=True)
        if self._copier is not None:
            self._copier.drain()


def _loader(keys: list[int], tiers: list[str]) -> Callable[[kvtier.Client], kvtier.Load | None]:
    """A load of ``keys``, whose blocks the scheduler found in ``tiers``.
    The node brings a block from the cluster (another node: the peer tier;
    a store the cluster shares, listed after it) only for a session whose
    own lookup located it there (docs/node-protocol.md §4.2), and the
    scheduler looked up on its own session: when any block is in such a
    tier, this session looks the keys up first."""

    def load(c: kvtier.Client) -> kvtier.Load | None:
        if _cluster_tiers(c).intersection(tiers):
            c.lookup(keys)
        return c.load(keys)

    return load


def _cluster_tiers(c: kvtier.Client) -> set[str]:
    """The tiers ``c``'s node reads from the cluster: its peer tier and
    every tier it lists after it; none on a node of no cluster."""
    kinds = [kind for _, kind in c.tiers]
    if "peer" not in kinds:
        return set()
    return {name for name, _ in c.tiers[kinds.index("peer") :]}


def _remover(keys: list[int]) -> Callable[[kvtier.Client], None]:
    def remove(c: kvtier.Client) -> None:
        c.remove(keys)

    return remove


def _storer(
    keys: list[int], layers: list[tuple[int, int]], ids: list[int], stride: int
) -> Callable[[kvtier.Client], list[str]]:
    def store(c: kvtier.Client) -> list[str]:
        return c.store_layers(keys, layers, ids, stride)

    return store


def _copier(kv_caches: dict[str, torch.Tensor]) -> DeviceCopier | None:
    """A copier through host staging for KV layers the node cannot copy in
    place (a GPU's); ``None``, logged, for layers it cannot view."""
    layers = list(kv_caches.values())
    try:
        copier = DeviceCopier(layers)
    except (ValueError, RuntimeError) as e:
        logger.warning("kvtier cannot copy the KV cache on %s (%s): running without the cache", layers[0].device, e)
        return None
    logger.info(
        "kvtier copies KV blocks on %s through host staging: %d layers, strides %s, up to %d blocks per save batch",
        copier.device,
        len(layers),
        tuple(layers[0].stride()),
        copier.batch_blocks,
    )
    return copier
