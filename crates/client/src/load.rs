//! [`Load`]: the blocks one `Load` request pinned, and reading them.

use std::borrow::Cow;
use std::sync::Arc;

use kvtier_arena::{ArenaClient, MemError};
use kvtier_core::{BlockHash, Lookup};
use kvtier_protocol::{KeyMap, LoadResult};

use crate::error::{ClientError, Result};
use crate::session::Ready;

/// The answer to one `Load`: per key, the arena slot the daemon pinned for
/// this client or a miss, and how many layers are ready.
///
/// The bytes are read straight from the arena into the caller's memory
/// ([`read`](Self::read), [`read_layer`](Self::read_layer)), each copy
/// verified against checksums the daemon sent over the socket, never the
/// arena's slot table (which clients can write): a resident block's come
/// with `LoadOk`, an arriving block's layer by layer with each
/// `LayerReady` (blocks read from the disk arrive layer by layer). A layer may be read once the daemon has said it is ready
/// (`wait_layer` on the client); a slot a later `LayerReady` leaves out
/// failed and reads as a miss. The
/// slots stay pinned until the client releases them
/// ([`Client::release_load`](crate::Client::release_load)); a `Load` dropped
/// without that keeps them pinned until the daemon ends the lease or the
/// connection closes.
#[derive(Debug)]
pub struct Load {
    request_id: u64,
    keys: Vec<BlockHash>,
    /// The keys the arena shows the blocks under (the namespace's).
    stored: Vec<BlockHash>,
    results: Vec<LoadResult>,
    /// The arena slot of each key granted one (checked against the arena).
    slots: Vec<Option<usize>>,
    layers: u32,
    ready: Arc<Ready>,
    arena: Arc<ArenaClient>,
}

impl Load {
    /// Checks every slot of the daemon's answer against the arena: a range
    /// that is not exactly one slot means a daemon that cannot be trusted
    /// with this connection.
    pub(crate) fn new(
        request_id: u64,
        keys: &[BlockHash],
        key_map: KeyMap,
        results: Vec<LoadResult>,
        ready: Arc<Ready>,
        arena: Arc<ArenaClient>,
    ) -> Result<Self> {
        let slots =
            results
                .iter()
                .map(|r| match r.slot() {
                    Some(s) => arena.slot_at(s.offset, s.len).map(Some).map_err(|e| {
                        ClientError::Unexpected {
                            what: format!("LoadOk names {s:?}: {e}"),
                        }
                    }),
                    None => Ok(None),
                })
                .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            request_id,
            keys: keys.to_vec(),
            stored: keys.iter().map(|k| key_map.stored(*k)).collect(),
            results,
            slots,
            layers: arena.layers() as u32,
            ready,
            arena,
        })
    }

    /// The `Load` request's id (named by its `LayerReady` notifications).
    pub fn request_id(&self) -> u64 {
        self.request_id
    }

    /// The keys, in request order.
    pub fn keys(&self) -> &[BlockHash] {
        &self.keys
    }

    /// The daemon's answer per key.
    pub fn results(&self) -> &[LoadResult] {
        &self.results
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the load named no keys.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// How many leading keys the daemon pinned a slot for.
    pub fn prefix_len(&self) -> usize {
        self.slots.iter().take_while(|s| s.is_some()).count()
    }

    /// The keys the daemon pinned a slot for: what releasing unpins.
    pub fn held_keys(&self) -> Vec<BlockHash> {
        self.keys
            .iter()
            .zip(&self.slots)
            .filter_map(|(k, s)| s.map(|_| *k))
            .collect()
    }

    /// How many leading layers are ready to read. A load without a single
    /// slot has nothing to wait for: all of them.
    pub fn ready_layers(&self) -> u32 {
        if self.slots.iter().all(Option::is_none) {
            return self.layers;
        }
        self.ready.layers()
    }

    /// Whether layer `layer` (and every layer before it) is ready.
    pub fn is_ready(&self, layer: u32) -> bool {
        layer < self.ready_layers()
    }

    /// Whether every layer is ready.
    pub fn is_complete(&self) -> bool {
        self.ready_layers() >= self.layers
    }

    /// Copies key `index`'s block into `dst` (exactly the block size),
    /// verified. [`Lookup::Miss`] for a key the daemon did not pin;
    /// [`Lookup::Corrupt`] for bytes that fail verification (never
    /// served). Every layer must be ready ([`ClientError::NotReady`]).
    pub fn read(&self, index: usize, dst: &mut [u8]) -> Result<Lookup> {
        let Some(slot) = self.slot(index)? else {
            return Ok(Lookup::Miss);
        };
        self.check_ready(self.layers.saturating_sub(1))?;
        if self.ready.good_slots().is_some_and(|good| index >= good) {
            return Ok(Lookup::Miss);
        }
        let Some(sums) = self.layer_sums(index) else {
            return Ok(Lookup::Miss);
        };
        Ok(self.arena.read(slot, self.stored[index], &sums, dst)?)
    }

    /// Every layer's checksum of key `index`'s block, as the daemon sent
    /// them: with `LoadOk` for a resident block, else each layer's
    /// `LayerReady`. `None` when some layer's is unknown (the daemon
    /// reported the block failed).
    /// Borrowed for a resident block: a read of one allocates nothing.
    fn layer_sums(&self, index: usize) -> Option<Cow<'_, [u64]>> {
        if let Some(sums) = self.results.get(index)?.sums() {
            return Some(Cow::Borrowed(&sums.layers));
        }
        (0..self.layers)
            .map(|l| self.ready.sums(l)?.get(index).copied())
            .collect::<Option<Vec<u64>>>()
            .map(Cow::Owned)
    }

    /// Layer `layer`'s checksum of key `index`'s block, as the daemon sent
    /// it (see [`layer_sums`](Self::layer_sums)).
    fn layer_sum(&self, index: usize, layer: u32) -> Option<u64> {
        match self.results.get(index)?.sums() {
            Some(sums) => sums.layers.get(layer as usize).copied(),
            None => self.ready.sums(layer)?.get(index).copied(),
        }
    }

    /// Copies layer `layer` of key `index`'s block into `dst` (exactly that
    /// layer's length), verified against the layer's checksum; outcomes as
    /// for [`read`](Self::read). The layer must be ready.
    pub fn read_layer(&self, index: usize, layer: u32, dst: &mut [u8]) -> Result<Lookup> {
        self.check_layer(layer)?;
        let Some(slot) = self.slot(index)? else {
            return Ok(Lookup::Miss);
        };
        self.check_ready(layer)?;
        if self.ready.good_slots().is_some_and(|good| index >= good) {
            // The daemon reported it failed.
            return Ok(Lookup::Miss);
        }
        let Some(sum) = self.layer_sum(index, layer) else {
            return Ok(Lookup::Miss);
        };
        let key = self.stored[index];
        Ok(self.arena.read_layer(slot, key, layer as usize, sum, dst)?)
    }

    /// Reads keys in order into `dsts` until the first one that is not a
    /// verified hit; returns how many were.
    pub(crate) fn read_prefix(&self, dsts: &mut [&mut [u8]]) -> (usize, Option<BlockHash>) {
        let mut n = 0;
        while n < dsts.len() {
            match self.read(n, dsts[n]) {
                Ok(Lookup::Hit) => n += 1,
                // The block's bytes do not match its checksums: whoever
                // stored it wrote them wrong, or they were damaged since.
                Ok(Lookup::Corrupt) => return (n, Some(self.keys[n])),
                _ => break,
            }
        }
        (n, None)
    }

    /// Refuses a layer past the block's last.
    pub(crate) fn check_layer(&self, layer: u32) -> Result<()> {
        if layer < self.layers {
            return Ok(());
        }
        Err(MemError::NoSuchLayer {
            layer: layer as usize,
            layers: self.layers as usize,
        }
        .into())
    }

    fn slot(&self, index: usize) -> Result<Option<usize>> {
        self.slots
            .get(index)
            .copied()
            .ok_or(ClientError::NoSuchKey {
                index,
                len: self.len(),
            })
    }

    fn check_ready(&self, layer: u32) -> Result<()> {
        if self.is_ready(layer) {
            return Ok(());
        }
        Err(ClientError::NotReady {
            request_id: self.request_id,
            layer,
        })
    }
}
