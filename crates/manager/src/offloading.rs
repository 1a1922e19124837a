//! The vLLM-shaped offloading API over the manager's offload tiers.
//!
//! [`OffloadingManager`] has the semantics of vLLM's
//! `vllm.v1.kv_offload.abstract.OffloadingManager`, so a Python connector
//! is a thin layer over it. It runs in the engine's scheduler and keeps
//! the books only; the engine's workers move the bytes to and from the
//! slots named in the specs it returns.
//!
//! | vLLM | here | what it does |
//! |---|---|---|
//! | `lookup` | [`lookup`](OffloadingManager::lookup) | longest leading run of blocks stored (and loadable) in some offload tier |
//! | `prepare_load` | [`prepare_load`](OffloadingManager::prepare_load) | protects the blocks from eviction; says where each is read from |
//! | `touch` | [`touch`](OffloadingManager::touch) | marks blocks recently used (the first block most recent) |
//! | `complete_load` | [`complete_load`](OffloadingManager::complete_load) | releases one protection per block |
//! | `prepare_store` | [`prepare_store`](OffloadingManager::prepare_store) | skips blocks stored or being stored, allocates the rest (evicting unprotected blocks, LRU first); `None` when it cannot |
//! | `complete_store` | [`complete_store`](OffloadingManager::complete_store) | success: the blocks become loadable; failure: their slots are freed |
//! | `take_events` | [`take_events`](OffloadingManager::take_events) | stored / removed events since the last call |
//!
//! Stores go to the first (fastest) offload tier; lookups and loads see
//! every offload tier, fastest first. Blocks evicted here are dropped, as
//! in vLLM (the cascade belongs to [`BlockManager`](crate::manager::BlockManager)).

use std::collections::{HashMap, HashSet};

use kvtier_core::BlockHash;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::Tier;
use crate::pool::{BlockPool, IncomingBlock, PoolEvent, Presence, SlotId};

/// Why an offloading call was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OffloadError {
    /// `prepare_load` of a block no offload tier holds (or still being
    /// stored).
    #[error("block {0} is not stored")]
    NotStored(BlockHash),
    /// `complete_load` of a block with no load prepared.
    #[error("block {0} has no load in progress")]
    NotLoading(BlockHash),
    /// No offload tier was given.
    #[error("an offloading manager needs at least one offload tier")]
    NoTiers,
}

/// Where one block is read from or written to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockSlot {
    /// The block.
    pub hash: BlockHash,
    /// The tier (the vLLM "medium").
    pub tier: Tier,
    /// The slot in that tier's pool.
    pub slot: SlotId,
}

/// What the workers need to load blocks: per block, its tier and slot.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadSpec {
    /// The blocks, in the order asked.
    pub blocks: Vec<BlockSlot>,
}

/// What the workers need to store blocks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreSpec {
    /// The blocks to write, in the order asked.
    pub blocks: Vec<BlockSlot>,
}

/// The answer to [`OffloadingManager::prepare_store`] (vLLM's
/// `PrepareStoreOutput`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrepareStoreOutput {
    /// The blocks that need storing (`block_hashes_to_store`): those asked
    /// for less the ones stored or being stored already.
    pub to_store: Vec<BlockHash>,
    /// Where to write them (`store_spec`).
    pub store_spec: StoreSpec,
    /// Blocks evicted to make room (`block_hashes_evicted`).
    pub evicted: Vec<BlockHash>,
}

/// Blocks stored in or removed from a medium (vLLM's `OffloadingEvent`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffloadingEvent {
    /// The blocks.
    pub block_hashes: Vec<BlockHash>,
    /// Tokens per block.
    pub block_size: usize,
    /// The medium: `GPU`, `CPU`, `DISK` or `REMOTE`.
    pub medium: String,
    /// Whether the blocks were removed (else stored).
    pub removed: bool,
}

/// The vLLM medium name of a tier.
pub fn medium(tier: Tier) -> &'static str {
    match tier {
        Tier::G1 => "GPU",
        Tier::G2 => "CPU",
        Tier::G3 => "DISK",
        Tier::G4 => "REMOTE",
    }
}

struct Books {
    /// Protections from `prepare_load` (a pin each), per block: the
    /// index of the pool pinned.
    loading: HashMap<BlockHash, Vec<usize>>,
    /// Slots reserved by `prepare_store`, not yet completed.
    storing: HashMap<BlockHash, IncomingBlock>,
    /// Events drained from the pools, not yet taken.
    events: Vec<OffloadingEvent>,
}

/// vLLM's `OffloadingManager` over kvtier pools: see the [module docs](self).
pub struct OffloadingManager {
    /// Offload tiers, fastest first; stores go to the first.
    pools: Vec<BlockPool>,
    books: Mutex<Books>,
}

impl std::fmt::Debug for OffloadingManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OffloadingManager")
            .field(
                "tiers",
                &self.pools.iter().map(BlockPool::tier).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl OffloadingManager {
    /// A manager over `pools` (offload tiers, fastest first). The pools
    /// must record events ([`PoolConfig::record_events`](crate::pool::PoolConfig::record_events))
    /// for [`take_events`](Self::take_events) to report anything.
    pub fn new(mut pools: Vec<BlockPool>) -> Result<Self, OffloadError> {
        if pools.is_empty() {
            return Err(OffloadError::NoTiers);
        }
        pools.sort_by_key(BlockPool::tier);
        Ok(Self {
            pools,
            books: Mutex::new(Books {
                loading: HashMap::new(),
                storing: HashMap::new(),
                events: Vec::new(),
            }),
        })
    }

    /// The tier stores go to.
    pub fn store_tier(&self) -> Tier {
        self.pools[0].tier()
    }

    /// How many blocks, from the first, are stored and loadable.
    pub fn lookup(&self, hashes: &[BlockHash]) -> usize {
        let mut tiers = vec![None; hashes.len()];
        for p in &self.pools {
            p.fill_ready(hashes, &mut tiers);
        }
        tiers.iter().take_while(|t| t.is_some()).count()
    }

    /// Protects `hashes` from eviction until [`complete_load`](Self::complete_load)
    /// and says where each is read from. All or nothing: a block not
    /// stored fails the call and protects nothing.
    pub fn prepare_load(&self, hashes: &[BlockHash]) -> Result<LoadSpec, OffloadError> {
        let mut pinned: Vec<(usize, BlockSlot)> = Vec::with_capacity(hashes.len());
        for &h in hashes {
            // A pin protects without counting as a use: the LRU order is
            // `touch`'s, as in vLLM.
            let found = self.pools.iter().enumerate().find_map(|(i, p)| {
                let slot = p.slot_of(h)?;
                (p.presence(h) == Some(Presence::Ready) && p.pin(h).is_ok()).then_some((
                    i,
                    BlockSlot {
                        hash: h,
                        tier: p.tier(),
                        slot,
                    },
                ))
            });
            match found {
                Some(f) => pinned.push(f),
                None => {
                    for (i, b) in pinned {
                        let _ = self.pools[i].unpin(b.hash);
                    }
                    return Err(OffloadError::NotStored(h));
                }
            }
        }
        let mut books = self.books.lock();
        for (i, b) in &pinned {
            books.loading.entry(b.hash).or_default().push(*i);
        }
        Ok(LoadSpec {
            blocks: pinned.into_iter().map(|(_, b)| b).collect(),
        })
    }

    /// Marks `hashes` recently used, the first block most recent (vLLM
    /// touches in reverse so a prefix outlives its extensions).
    pub fn touch(&self, hashes: &[BlockHash]) {
        for &h in hashes.iter().rev() {
            for p in &self.pools {
                // An acquire is a use for the policy; the handle is dropped
                // at once.
                drop(p.acquire(h));
            }
        }
    }

    /// Releases one protection of each of `hashes`. A block with no load
    /// prepared fails the call after the others are released.
    pub fn complete_load(&self, hashes: &[BlockHash]) -> Result<(), OffloadError> {
        let mut missing = None;
        let mut released = Vec::new();
        {
            let mut books = self.books.lock();
            for &h in hashes {
                let pool = books.loading.get_mut(&h).and_then(Vec::pop);
                if books.loading.get(&h).is_some_and(Vec::is_empty) {
                    books.loading.remove(&h);
                }
                match pool {
                    Some(i) => released.push((i, h)),
                    None => missing = missing.or(Some(h)),
                }
            }
        }
        // Unpinned outside the books' lock (it takes the pools').
        for (i, h) in released {
            let _ = self.pools[i].unpin(h);
        }
        missing.map_or(Ok(()), |h| Err(OffloadError::NotLoading(h)))
    }

    /// Reserves slots for the blocks of `hashes` not stored or being
    /// stored yet, evicting unprotected blocks (policy order) as needed.
    /// `Ok(None)` when there is not enough room even so; then nothing is
    /// evicted or reserved. The reserved blocks are not loadable until
    /// [`complete_store`](Self::complete_store).
    pub fn prepare_store(
        &self,
        hashes: &[BlockHash],
    ) -> Result<Option<PrepareStoreOutput>, OffloadError> {
        let pool = &self.pools[0];
        self.collect_events();
        let mut seen = HashSet::new();
        let to_store: Vec<BlockHash> = hashes
            .iter()
            .copied()
            .filter(|h| seen.insert(*h))
            .filter(|h| self.pools.iter().all(|p| p.presence(*h).is_none()))
            .collect();
        if pool.available() < to_store.len() {
            return Ok(None);
        }
        let mut reserved = Vec::with_capacity(to_store.len());
        let mut parent = None;
        let mut reserving: HashSet<BlockHash> = to_store.iter().copied().collect();
        for &h in hashes {
            // `remove`: a hash listed twice is reserved once.
            if reserving.remove(&h) {
                match pool.begin_incoming(h, parent) {
                    Ok(r) => reserved.push(r),
                    // Counted above, so only a concurrent caller gets here;
                    // dropping the reservations frees them.
                    Err(_) => return Ok(None),
                }
            }
            parent = Some(h);
        }
        let evicted = self.collect_events_removed();
        let store_spec = StoreSpec {
            blocks: reserved
                .iter()
                .map(|r| BlockSlot {
                    hash: r.hash(),
                    tier: pool.tier(),
                    slot: r.slot(),
                })
                .collect(),
        };
        let mut books = self.books.lock();
        for r in reserved {
            books.storing.insert(r.hash(), r);
        }
        Ok(Some(PrepareStoreOutput {
            to_store,
            store_spec,
            evicted,
        }))
    }

    /// Ends the stores of `hashes` prepared earlier: on success they become
    /// loadable (and unprotected); on failure their slots are freed and
    /// nothing of them remains. Hashes with no store prepared are ignored.
    pub fn complete_store(&self, hashes: &[BlockHash], success: bool) {
        let reserved: Vec<IncomingBlock> = {
            let mut books = self.books.lock();
            hashes
                .iter()
                .filter_map(|h| books.storing.remove(h))
                .collect()
        };
        for r in reserved {
            if success {
                drop(r.finish());
            } else {
                drop(r);
            }
        }
        self.collect_events();
    }

    /// The stored / removed events since the last call, consecutive events
    /// of one kind and medium grouped.
    pub fn take_events(&self) -> Vec<OffloadingEvent> {
        self.collect_events();
        std::mem::take(&mut self.books.lock().events)
    }

    /// Moves the pools' events into the books.
    fn collect_events(&self) {
        self.drain(|_| {});
    }

    /// Like `collect_events`, returning the hashes removed.
    fn collect_events_removed(&self) -> Vec<BlockHash> {
        let mut removed = Vec::new();
        self.drain(|e| {
            if let PoolEvent::Removed { hash, .. } = e {
                removed.push(hash);
            }
        });
        removed
    }

    fn drain(&self, mut see: impl FnMut(PoolEvent)) {
        let mut drained = Vec::new();
        for p in &self.pools {
            let size = p.tokens_per_block();
            for e in p.drain_events() {
                see(e);
                drained.push((size, e));
            }
        }
        let mut books = self.books.lock();
        for (block_size, e) in drained {
            let (tier, hash, removed) = match e {
                PoolEvent::Stored { tier, hash } => (tier, hash, false),
                PoolEvent::Removed { tier, hash } => (tier, hash, true),
            };
            let medium = medium(tier);
            match books.events.last_mut() {
                Some(last) if last.removed == removed && last.medium == medium => {
                    last.block_hashes.push(hash);
                }
                _ => books.events.push(OffloadingEvent {
                    block_hashes: vec![hash],
                    block_size,
                    medium: medium.to_owned(),
                    removed,
                }),
            }
        }
    }
}
