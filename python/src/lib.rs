//! `kvtier._native`: the node daemon's client (`kvtier-client`) for Python
//! engine processes. Every call that waits on the daemon or copies block
//! bytes releases the GIL; the copies between engine memory and arena
//! slots happen here, fused with the checksums, layer by layer.
//!
//! Engine memory is named by address and length (`(data_ptr, nbytes)` of a
//! tensor), or by the buffer protocol. An address is the caller's promise
//! that the memory stays valid for the call; every offset computed from it
//! is checked against the length first.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use kvtier_client::{
    BlockHash, BlockSource, ClientConfig, ClientError, ErrorCode, Lookup, Namespace, StoreOutcome,
    Tier, WireGeometry,
};
use pyo3::buffer::PyBuffer;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyRange;

create_exception!(
    _native,
    KvtierError,
    PyException,
    "A request the node daemon or the arena refused."
);
create_exception!(
    _native,
    DaemonUnavailable,
    KvtierError,
    "The node daemon cannot be reached, went away, or did not answer in time; the base of every \
     error after which a client is unusable: connect again."
);
create_exception!(
    _native,
    ConnectionBroken,
    DaemonUnavailable,
    "The connection to the node daemon is unusable after a fatal error (the daemon broke the \
     protocol, answered out of turn, or refused in a way that closes the connection); connect again."
);

/// The Python exception of a client error. Every error after which the
/// connection is unusable (`ClientError::is_fatal`) is a
/// `DaemonUnavailable`, so that callers drop the client and connect again:
/// the daemon unreachable or gone, or no answer in time, is
/// `DaemonUnavailable` itself; any other fatal error (a protocol violation,
/// a reply to another request or of the wrong type, a refusal that closes
/// the connection, a call after one of these) is its subclass
/// `ConnectionBroken`. The rest (caller mistakes, refusals that keep the
/// connection) are `KvtierError`.
fn to_py(e: ClientError) -> PyErr {
    let message = e.to_string();
    if !e.is_fatal() {
        return KvtierError::new_err(message);
    }
    match e {
        ClientError::Connect { .. }
        | ClientError::Io(_)
        | ClientError::Disconnected
        | ClientError::Timeout(_) => DaemonUnavailable::new_err(message),
        _ => ConnectionBroken::new_err(message),
    }
}

/// The Python exception of a failed `connect`: as [`to_py`], except that a
/// refusal of the handshake (a version, namespace or geometry the daemon
/// does not serve) is a plain `KvtierError`, though the daemon closes the
/// connection after it: connecting again would be refused the same way.
/// `BUSY` (the daemon is at its connection cap or out of descriptors) is
/// the one refusal that passes: it is `DaemonUnavailable`, so the caller
/// tries again after its reconnect interval.
fn connect_err(e: ClientError) -> PyErr {
    match e {
        ClientError::Refused { code, .. } if code == ErrorCode::BUSY => {
            DaemonUnavailable::new_err(e.to_string())
        }
        ClientError::Refused { .. } => KvtierError::new_err(e.to_string()),
        e => to_py(e),
    }
}

fn outcome_name(o: StoreOutcome) -> &'static str {
    match o {
        StoreOutcome::Stored => "stored",
        StoreOutcome::AlreadyStored => "already_stored",
        StoreOutcome::InFlightElsewhere => "in_flight_elsewhere",
        StoreOutcome::NoSpace => "no_space",
        StoreOutcome::NotReserved => "not_reserved",
        StoreOutcome::BadChecksum => "bad_checksum",
    }
}

fn hashes(keys: &[u128]) -> Vec<BlockHash> {
    keys.iter().map(|k| BlockHash(*k)).collect()
}

fn ints(keys: Vec<BlockHash>) -> Vec<u128> {
    keys.into_iter().map(|k| k.0).collect()
}

fn core_err(e: kvtier_core::CoreError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// A range of engine memory the caller vouches for.
#[derive(Debug, Clone, Copy)]
struct Region {
    addr: usize,
    len: usize,
}

impl Region {
    /// `len` bytes at `offset`, if they lie inside.
    fn at(self, offset: usize, len: usize) -> PyResult<usize> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len && self.addr != 0 => Ok(self.addr + offset),
            _ => Err(PyValueError::new_err(format!(
                "{len} bytes at offset {offset} do not fit in a buffer of {} bytes",
                self.len
            ))),
        }
    }
}

/// Where block `i`'s layer `l` lies: `layers[l]` + `block_ids[i]` *
/// `stride`, `layer_bytes` long, each checked against its region.
struct Strided {
    addrs: Vec<Vec<usize>>,
    layer_bytes: usize,
}

impl Strided {
    fn new(
        layers: &[(usize, usize)],
        block_ids: &[usize],
        stride: usize,
        layer_bytes: usize,
    ) -> PyResult<Self> {
        let addrs = layers
            .iter()
            .map(|&(addr, len)| {
                let region = Region { addr, len };
                block_ids
                    .iter()
                    .map(|&b| {
                        let offset = b.checked_mul(stride).ok_or_else(|| {
                            PyValueError::new_err(format!(
                                "block {b} times stride {stride} overflows"
                            ))
                        })?;
                        region.at(offset, layer_bytes)
                    })
                    .collect::<PyResult<Vec<usize>>>()
            })
            .collect::<PyResult<Vec<_>>>()?;
        Ok(Self { addrs, layer_bytes })
    }

    fn slice(&self, layer: usize, block: usize) -> &[u8] {
        // SAFETY: the address was checked to lie, with `layer_bytes` after
        // it, inside a region the caller vouched for (see the module docs).
        unsafe {
            std::slice::from_raw_parts(self.addrs[layer][block] as *const u8, self.layer_bytes)
        }
    }

    /// # Safety
    /// The caller holds the region for writing, and no other slice of
    /// this block's layer is alive.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice_mut(&self, layer: usize, block: usize) -> &mut [u8] {
        // SAFETY: checked to lie inside a region the caller vouched for and
        // lends for writing; exclusive per the function's contract.
        unsafe {
            std::slice::from_raw_parts_mut(self.addrs[layer][block] as *mut u8, self.layer_bytes)
        }
    }
}

/// Blocks to store whose layers lie in per-layer engine buffers.
struct LayerSource {
    keys: Vec<BlockHash>,
    at: Strided,
}

impl BlockSource for LayerSource {
    fn len(&self) -> usize {
        self.keys.len()
    }
    fn key(&self, i: usize) -> BlockHash {
        self.keys[i]
    }
    fn layer(&self, i: usize, layer: usize, _within: std::ops::Range<usize>) -> &[u8] {
        self.at.slice(layer, i)
    }
}

/// Whole blocks in buffers (the buffer protocol), read-only here.
struct BufferSource {
    keys: Vec<BlockHash>,
    blocks: Vec<(usize, usize)>,
}

impl BlockSource for BufferSource {
    fn len(&self) -> usize {
        self.keys.len()
    }
    fn key(&self, i: usize) -> BlockHash {
        self.keys[i]
    }
    fn layer(&self, i: usize, _layer: usize, within: std::ops::Range<usize>) -> &[u8] {
        let (addr, len) = self.blocks[i];
        // SAFETY: the buffer is held (its `PyBuffer` outlives the store)
        // and `len` is its length; a block shorter than `within` yields a
        // shorter slice, which the store refuses.
        let whole = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
        whole.get(within).unwrap_or(&[])
    }
}

fn contiguous(buf: &PyBuffer<u8>, writable: bool) -> PyResult<(usize, usize)> {
    if !buf.is_c_contiguous() {
        return Err(PyValueError::new_err("the buffer is not contiguous"));
    }
    if writable && buf.readonly() {
        return Err(PyValueError::new_err("the buffer is read-only"));
    }
    Ok((buf.buf_ptr() as usize, buf.len_bytes()))
}

/// A connection to the node daemon (`kvtier serve`), for one namespace.
/// Thread-safe: calls from several threads take turns.
#[pyclass(module = "kvtier._native", frozen)]
struct Client {
    inner: Mutex<kvtier_client::Client>,
    layers: usize,
    layer_bytes: usize,
    block_bytes: usize,
    session_id: u64,
    shm_name: String,
    /// The node's tiers from its `HelloOk`: label and kind name.
    tiers: Vec<(&'static str, &'static str)>,
}

impl Client {
    fn with<T>(
        &self,
        f: impl FnOnce(&mut kvtier_client::Client) -> Result<T, ClientError>,
    ) -> PyResult<T> {
        let mut c = self
            .inner
            .lock()
            .map_err(|_| KvtierError::new_err("a call on this client panicked; connect again"))?;
        f(&mut c).map_err(to_py)
    }
}

#[pymethods]
impl Client {
    /// Connects to the daemon's socket and opens the arena. The namespace
    /// (model, dtype, layout version, tokens per block, TP rank and size,
    /// tenant salt) keeps these blocks apart from every other namespace's;
    /// `layers` and `layer_bytes` must be the node's block shape. Raises
    /// `DaemonUnavailable` when the daemon cannot be reached (try again
    /// later) and `KvtierError` when it refuses this client (a version,
    /// namespace or geometry it does not serve).
    #[new]
    #[pyo3(signature = (socket, *, model, dtype, layers, layer_bytes, block_size_tokens,
        layout_version=1, tp_rank=0, tp_size=1, tenant_salt=None, instance=None, timeout=10.0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        socket: std::path::PathBuf,
        model: String,
        dtype: String,
        layers: u32,
        layer_bytes: u64,
        block_size_tokens: u32,
        layout_version: u32,
        tp_rank: u32,
        tp_size: u32,
        tenant_salt: Option<Vec<u8>>,
        instance: Option<String>,
        timeout: f64,
    ) -> PyResult<Self> {
        if !(timeout.is_finite() && timeout > 0.0) {
            return Err(PyValueError::new_err(
                "timeout must be a positive number of seconds",
            ));
        }
        let namespace = Namespace {
            model,
            dtype,
            layout_version,
            block_size_tokens,
            tp_rank,
            tp_size,
            tenant_salt,
        };
        let geometry = WireGeometry {
            layers,
            block_bytes: layer_bytes * u64::from(layers),
            layer_bytes,
        };
        let mut config = ClientConfig::new(socket, namespace, geometry)
            .with_timeout(Duration::from_secs_f64(timeout));
        if let Some(i) = instance {
            config = config.with_instance(i);
        }
        let client = py
            .detach(|| kvtier_client::Client::connect(config))
            .map_err(connect_err)?;
        let arena = client.arena();
        Ok(Self {
            layers: arena.layers(),
            layer_bytes: arena.layer_bytes(),
            block_bytes: arena.block_bytes(),
            session_id: client.hello().session_id,
            shm_name: client.hello().shm_name.clone(),
            tiers: (client.tiers().iter())
                .map(|t| (t.tier.label(), t.kind.name()))
                .collect(),
            inner: Mutex::new(client),
        })
    }

    /// Layers per block.
    #[getter]
    fn layers(&self) -> usize {
        self.layers
    }

    /// Bytes of one layer of one block.
    #[getter]
    fn layer_bytes(&self) -> usize {
        self.layer_bytes
    }

    /// Bytes of one block (all layers).
    #[getter]
    fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    /// The daemon's id of this connection (its logs name it).
    #[getter]
    fn session_id(&self) -> u64 {
        self.session_id
    }

    /// The shared-memory arena this client maps.
    #[getter]
    fn shm_name(&self) -> &str {
        &self.shm_name
    }

    /// The node's tiers, fastest first, as the daemon announced them: a
    /// list of `(label, kind)`, e.g. `[("G2", "memory"), ("G3", "disk")]`.
    /// Every tier `lookup` names is one of these labels.
    #[getter]
    fn tiers(&self) -> Vec<(&'static str, &'static str)> {
        self.tiers.clone()
    }

    /// The longest stored prefix of `keys`: the tier of each of its blocks
    /// (`"G2"`, `"G3"`, ...: labels of `tiers`).
    fn lookup(&self, py: Python<'_>, keys: Vec<u128>) -> PyResult<Vec<&'static str>> {
        let keys = hashes(&keys);
        let tiers = py.detach(|| self.with(|c| c.lookup(&keys)))?;
        Ok(tiers.into_iter().map(Tier::label).collect())
    }

    /// Stores whole blocks, one buffer of `block_bytes` per key; one
    /// outcome per block (`"stored"`, `"already_stored"`, ...).
    fn store_buffers(
        &self,
        py: Python<'_>,
        keys: Vec<u128>,
        blocks: Vec<PyBuffer<u8>>,
    ) -> PyResult<Vec<&'static str>> {
        if keys.len() != blocks.len() {
            return Err(PyValueError::new_err(format!(
                "{} keys and {} buffers",
                keys.len(),
                blocks.len()
            )));
        }
        let spans = blocks
            .iter()
            .map(|b| contiguous(b, false))
            .collect::<PyResult<Vec<_>>>()?;
        if let Some((_, len)) = spans.iter().find(|(_, len)| *len != self.block_bytes) {
            return Err(PyValueError::new_err(format!(
                "a block buffer of {len} bytes; blocks are {}",
                self.block_bytes
            )));
        }
        let src = BufferSource {
            keys: hashes(&keys),
            blocks: spans,
        };
        let out = py.detach(|| self.with(|c| c.store_from(&src)))?;
        drop(blocks);
        Ok(out.into_iter().map(outcome_name).collect())
    }

    /// Stores blocks whose layers lie in per-layer engine buffers:
    /// `layers[l]` is `(address, nbytes)` of layer `l`'s buffer, and key
    /// `i`'s layer `l` is the `layer_bytes` at `block_ids[i] *
    /// block_stride` in it. One outcome per block.
    fn store_layers(
        &self,
        py: Python<'_>,
        keys: Vec<u128>,
        layers: Vec<(usize, usize)>,
        block_ids: Vec<usize>,
        block_stride: usize,
    ) -> PyResult<Vec<&'static str>> {
        self.check_layout(keys.len(), &layers, &block_ids)?;
        let src = LayerSource {
            keys: hashes(&keys),
            at: Strided::new(&layers, &block_ids, block_stride, self.layer_bytes)?,
        };
        let out = py.detach(|| self.with(|c| c.store_from(&src)))?;
        Ok(out.into_iter().map(outcome_name).collect())
    }

    /// Makes the longest stored prefix of `keys` resident in the arena and
    /// pins it for this client; read it with the returned [`Load`] as its
    /// layers arrive, then release it.
    fn load(slf: Py<Self>, py: Python<'_>, keys: Vec<u128>) -> PyResult<Load> {
        let keys = hashes(&keys);
        let load = {
            let me = slf.get();
            py.detach(|| me.with(|c| c.load(&keys)))?
        };
        Ok(Load {
            client: slf,
            load: Mutex::new(Some(load)),
        })
    }

    /// Drops the blocks from every tier of the node.
    fn remove(&self, py: Python<'_>, keys: Vec<u128>) -> PyResult<()> {
        let keys = hashes(&keys);
        py.detach(|| self.with(|c| c.remove(&keys)))
    }

    /// The daemon's counters by name.
    fn stats(&self, py: Python<'_>) -> PyResult<HashMap<String, u64>> {
        let counters = py.detach(|| self.with(|c| c.stats()))?;
        Ok(counters.into_iter().map(|c| (c.name, c.value)).collect())
    }
}

impl Client {
    fn check_layout(
        &self,
        keys: usize,
        layers: &[(usize, usize)],
        block_ids: &[usize],
    ) -> PyResult<()> {
        if layers.len() != self.layers {
            return Err(PyValueError::new_err(format!(
                "{} layer buffers; blocks have {} layers",
                layers.len(),
                self.layers
            )));
        }
        if block_ids.len() != keys {
            return Err(PyValueError::new_err(format!(
                "{keys} keys and {} block ids",
                block_ids.len()
            )));
        }
        Ok(())
    }
}

/// Blocks pinned in the arena for one client by [`Client::load`]. Their
/// layers become readable in order; each read is verified before it is
/// served.
#[pyclass(module = "kvtier._native", frozen)]
struct Load {
    client: Py<Client>,
    load: Mutex<Option<kvtier_client::Load>>,
}

impl Load {
    fn with<T>(&self, f: impl FnOnce(&kvtier_client::Load) -> PyResult<T>) -> PyResult<T> {
        let guard = self
            .load
            .lock()
            .map_err(|_| KvtierError::new_err("a call on this load panicked"))?;
        match guard.as_ref() {
            Some(load) => f(load),
            None => Err(KvtierError::new_err("the load was released")),
        }
    }
}

#[pymethods]
impl Load {
    /// How many leading keys the daemon pinned (the rest are misses).
    #[getter]
    fn prefix_len(&self) -> PyResult<usize> {
        self.with(|l| Ok(l.prefix_len()))
    }

    /// Waits until layer `layer` of every pinned block can be read.
    fn wait_layer(&self, py: Python<'_>, layer: u32) -> PyResult<()> {
        let client = self.client.get();
        py.detach(|| self.with(|l| client.with(|c| c.wait_layer(l, layer))))
    }

    /// Copies layer `layer` of the first `len(block_ids)` pinned blocks
    /// into the engine buffer `dst` (`(address, nbytes)`), block `i` at
    /// `block_ids[i] * block_stride`, each verified against its checksum.
    /// Returns whether each block's layer was a verified hit; a block that
    /// failed is never copied over good bytes the caller may rely on
    /// (treat it as a miss: recompute it).
    fn read_layer(
        &self,
        py: Python<'_>,
        layer: u32,
        dst: (usize, usize),
        block_ids: Vec<usize>,
        block_stride: usize,
    ) -> PyResult<Vec<bool>> {
        let layer_bytes = self.client.get().layer_bytes;
        let at = Strided::new(&[dst], &block_ids, block_stride, layer_bytes)?;
        py.detach(|| {
            self.with(|l| {
                (0..block_ids.len())
                    .map(|i| {
                        // SAFETY: `dst` is lent for writing for the call;
                        // one block's slice at a time.
                        let out = unsafe { at.slice_mut(0, i) };
                        match l.read_layer(i, layer, out) {
                            Ok(Lookup::Hit) => Ok(true),
                            Ok(_) => Ok(false),
                            Err(e) => Err(to_py(e)),
                        }
                    })
                    .collect()
            })
        })
    }

    /// Copies pinned block `index` whole into `dst` (a writable buffer of
    /// `block_bytes`), verified; whether it was a verified hit. Every
    /// layer must be ready.
    fn read_block(&self, py: Python<'_>, index: usize, dst: PyBuffer<u8>) -> PyResult<bool> {
        let (addr, len) = contiguous(&dst, true)?;
        let hit = py.detach(|| {
            self.with(|l| {
                // SAFETY: a writable, contiguous buffer of `len` bytes,
                // held by `dst` for the call.
                let out = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) };
                l.read(index, out).map_err(to_py)
            })
        })?;
        drop(dst);
        Ok(hit == Lookup::Hit)
    }

    /// Unpins the blocks (at once; also when the client disconnects).
    /// Releasing twice is a no-op.
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        let taken = self
            .load
            .lock()
            .map_err(|_| KvtierError::new_err("a call on this load panicked"))?
            .take();
        let Some(load) = taken else {
            return Ok(());
        };
        let client = self.client.get();
        py.detach(|| client.with(|c| c.release_load(load)))
    }
}

/// How a model's KV heads are cut into *head shards*, the objects a block
/// is stored as so that engines at any tensor-parallel size share it
/// (docs/block-identity.md, "Head shards"). Shard `s` holds heads
/// `[s * shard_heads, (s + 1) * shard_heads)` of every layer; each rank
/// stores and loads the shards its heads cover, under keys every rank of
/// every TP size derives alike. Clients storing shards connect with
/// `tp_rank=0, tp_size=1` (the shards are no one rank's) to a node whose
/// `layer_bytes` is one shard's: `shard_heads` heads' bytes of one layer of
/// one block.
#[pyclass(module = "kvtier._native", frozen, eq, hash)]
#[derive(PartialEq, Eq, Hash)]
struct HeadShards {
    inner: kvtier_core::HeadShards,
}

#[pymethods]
impl HeadShards {
    /// Shards of `shard_heads` heads of a model with `kv_heads` KV heads
    /// (`shard_heads` divides `kv_heads`; ValueError otherwise).
    #[new]
    #[pyo3(signature = (kv_heads, shard_heads=1))]
    fn new(kv_heads: u32, shard_heads: u32) -> PyResult<Self> {
        let inner = kvtier_core::HeadShards::new(kv_heads, shard_heads).map_err(core_err)?;
        Ok(Self { inner })
    }

    /// The largest shards every rank of each TP size in `tp_sizes` holds
    /// whole (`shard_heads` = the gcd of the heads per rank).
    #[staticmethod]
    fn for_tp_sizes(kv_heads: u32, tp_sizes: Vec<u32>) -> PyResult<Self> {
        let inner = kvtier_core::HeadShards::for_tp_sizes(kv_heads, &tp_sizes).map_err(core_err)?;
        Ok(Self { inner })
    }

    /// Multi-head latent attention: one shard, the latent, which every
    /// rank holds; a second rank's store of it is a dedup hit.
    #[staticmethod]
    fn mla() -> Self {
        Self {
            inner: kvtier_core::HeadShards::mla(),
        }
    }

    /// KV heads of the whole model.
    #[getter]
    fn kv_heads(&self) -> u32 {
        self.inner.kv_heads()
    }

    /// KV heads per shard.
    #[getter]
    fn shard_heads(&self) -> u32 {
        self.inner.shard_heads()
    }

    /// Shards per block.
    #[getter]
    fn count(&self) -> u32 {
        self.inner.count()
    }

    /// The KV heads rank `tp_rank` of `tp_size` holds (vLLM's split,
    /// replicated when there are more ranks than heads).
    fn rank_heads<'py>(
        &self,
        py: Python<'py>,
        tp_rank: u32,
        tp_size: u32,
    ) -> PyResult<Bound<'py, PyRange>> {
        let heads = self.inner.rank_heads(tp_rank, tp_size).map_err(core_err)?;
        PyRange::new(py, heads.start as isize, heads.end as isize)
    }

    /// The shards rank `tp_rank` of `tp_size` stores and loads.
    fn for_rank<'py>(
        &self,
        py: Python<'py>,
        tp_rank: u32,
        tp_size: u32,
    ) -> PyResult<Bound<'py, PyRange>> {
        let shards = self.inner.for_rank(tp_rank, tp_size).map_err(core_err)?;
        PyRange::new(py, shards.start as isize, shards.end as isize)
    }

    /// The client key of shard `shard` of the block the engine keys
    /// `block`.
    fn key(&self, block: u128, shard: u32) -> u128 {
        self.inner.key(BlockHash(block), shard).0
    }

    /// The keys of every shard of each block, block-major: a lookup of
    /// them answers how many whole blocks the node holds
    /// (`blocks_in_prefix(len(tiers))`).
    fn all_keys(&self, block_keys: Vec<u128>) -> Vec<u128> {
        ints(self.inner.all_keys(&hashes(&block_keys)))
    }

    /// The keys rank `tp_rank` of `tp_size` stores and loads for
    /// `block_keys`: its shards of each block, block-major.
    fn rank_keys(&self, block_keys: Vec<u128>, tp_rank: u32, tp_size: u32) -> PyResult<Vec<u128>> {
        let keys = self.inner.rank_keys(&hashes(&block_keys), tp_rank, tp_size);
        Ok(ints(keys.map_err(core_err)?))
    }

    /// Where the rank's shards of each engine block lie, as virtual block
    /// ids in the order of `rank_keys`: block `b`'s `j`-th shard is `b *
    /// shards_per_rank + j`. With a per-layer layout that holds a block's
    /// heads one after the other, pass them to `Client.store_layers` and
    /// `Load.read_layer` with `block_stride` = the node's `layer_bytes`.
    fn rank_block_ids(
        &self,
        block_ids: Vec<usize>,
        tp_rank: u32,
        tp_size: u32,
    ) -> PyResult<Vec<usize>> {
        self.inner
            .rank_block_ids(&block_ids, tp_rank, tp_size)
            .map_err(core_err)
    }

    /// Whole blocks in a stored prefix of `prefix_len` keys of
    /// `rank_keys(..., tp_rank, tp_size)` (the defaults: of `all_keys`).
    #[pyo3(signature = (prefix_len, tp_rank=0, tp_size=1))]
    fn blocks_in_prefix(&self, prefix_len: usize, tp_rank: u32, tp_size: u32) -> PyResult<usize> {
        let per = self
            .inner
            .for_rank(tp_rank, tp_size)
            .map_err(core_err)?
            .len();
        Ok(kvtier_core::blocks_in_prefix(prefix_len, per))
    }

    fn __repr__(&self) -> String {
        format!(
            "HeadShards(kv_heads={}, shard_heads={})",
            self.inner.kv_heads(),
            self.inner.shard_heads()
        )
    }
}

/// The native half of the `kvtier` package.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Client>()?;
    m.add_class::<Load>()?;
    m.add_class::<HeadShards>()?;
    m.add("KvtierError", m.py().get_type::<KvtierError>())?;
    m.add("DaemonUnavailable", m.py().get_type::<DaemonUnavailable>())?;
    m.add("ConnectionBroken", m.py().get_type::<ConnectionBroken>())?;
    m.add(
        "PROTOCOL_VERSION",
        kvtier_protocol::PROTOCOL_VERSION.to_string(),
    )?;
    Ok(())
}
