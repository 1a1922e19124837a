//! What a caller submits ([`TransferRequest`]) and what it gets back
//! ([`TransferHandle`], [`BlockResult`] per block).

use std::ops::Range;
use std::sync::Arc;

use kvtier_core::{BlockHash, BlockSums, Geometry};

use super::completion::{CompletionCell, WaitAll, WaitBlock};
use super::landing::HostLanding;
use crate::tier::TransferPath;

/// Which bytes of each block a transfer moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Span {
    /// The whole block (`geometry.block_bytes()`).
    Block,
    /// One layer (`geometry.layer_bytes()`, at `geometry.layer_range(l)`):
    /// layer-wise onboarding into host landings.
    Layer(u32),
}

impl Span {
    /// The byte range of this span inside a block of `geometry`, or `None`
    /// when the layer is out of range.
    pub fn range(self, geometry: &Geometry) -> Option<Range<u64>> {
        match self {
            Span::Block => Some(0..geometry.block_bytes()),
            Span::Layer(l) if l < geometry.layers => Some(geometry.layer_range(l)),
            Span::Layer(_) => None,
        }
    }

    /// Bytes of this span for blocks of `geometry` (0 for a bad layer).
    pub fn bytes(self, geometry: &Geometry) -> u64 {
        self.range(geometry).map_or(0, |r| r.end - r.start)
    }
}

/// One block of a transfer.
#[derive(Debug, Clone)]
pub struct BlockMove {
    /// The block's key (its identity in every tier).
    pub key: BlockHash,
    /// The checksums the block carries, when the caller knows them: the
    /// bytes are verified against them before they are stored.
    pub sums: Option<BlockSums>,
    /// The arena slot a block read from a lower tier layer by layer lands
    /// in (a read into the arena with layer spans); `None` elsewhere.
    pub landing: Option<Arc<HostLanding>>,
}

impl PartialEq for BlockMove {
    fn eq(&self, other: &Self) -> bool {
        let same_landing = match (&self.landing, &other.landing) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        self.key == other.key && self.sums == other.sums && same_landing
    }
}

impl Eq for BlockMove {}

impl BlockMove {
    /// A block moved whole, by its key.
    pub fn key(key: BlockHash) -> Self {
        Self {
            key,
            sums: None,
            landing: None,
        }
    }

    /// A block read from the disk layer by layer into `landing`.
    pub fn landing(landing: Arc<HostLanding>) -> Self {
        Self {
            landing: Some(landing.clone()),
            ..Self::key(landing.key())
        }
    }
}

/// A batch of blocks to move along one path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferRequest {
    /// The path.
    pub path: TransferPath,
    /// Which bytes of each block: whole blocks, or one layer (from a lower
    /// tier into landings in the arena).
    pub span: Span,
    /// The blocks.
    pub blocks: Vec<BlockMove>,
}

impl TransferRequest {
    /// Whole blocks along `path`.
    pub fn blocks(path: TransferPath, blocks: Vec<BlockMove>) -> Self {
        Self {
            path,
            span: Span::Block,
            blocks,
        }
    }
}

/// Why one block of a transfer was not delivered. The destination never
/// holds (visibly) the bytes of a failed block: a failure is a miss.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockFailure {
    /// The source tier does not hold the block.
    #[error("source does not hold the block")]
    Miss,
    /// The bytes failed verification against the block's checksums (the
    /// source dropped its copy where it could).
    #[error("checksum mismatch")]
    Corrupt,
    /// The destination has no room (and nothing evictable).
    #[error("destination full")]
    Full,
    /// The request cannot be carried out as asked (layer span on an
    /// offload, bad layer, a layer read without a landing).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// No executor serves this path (a tier the engine was built without).
    #[error("path {0} is not served")]
    Unsupported(TransferPath),
    /// A tier reported an I/O or storage error.
    #[error("tier: {0}")]
    Tier(String),
    /// The engine shut down before the block completed.
    #[error("transfer abandoned")]
    Abandoned,
}

/// The outcome of one block: `Ok` once its bytes are readable at the
/// destination (verified), or why not.
pub type BlockResult = Result<(), BlockFailure>;

/// The outcome of a whole transfer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferOutcome {
    /// The path taken.
    pub path: TransferPath,
    /// Every block with its result, in request order.
    pub blocks: Vec<(BlockHash, BlockResult)>,
}

impl TransferOutcome {
    /// Blocks delivered.
    pub fn delivered(&self) -> usize {
        self.blocks.iter().filter(|(_, r)| r.is_ok()).count()
    }

    /// Whether every block was delivered.
    pub fn all_delivered(&self) -> bool {
        self.delivered() == self.blocks.len()
    }

    /// The blocks that failed, with why.
    pub fn failures(&self) -> Vec<(BlockHash, BlockFailure)> {
        self.blocks
            .iter()
            .filter_map(|(k, r)| r.as_ref().err().map(|e| (*k, e.clone())))
            .collect()
    }
}

/// A submitted transfer: await it whole ([`wait`](Self::wait)) or block by
/// block ([`block`](Self::block)). Cheap to clone; every clone sees the
/// same results. Dropping it does not cancel the transfer.
#[derive(Debug, Clone)]
pub struct TransferHandle {
    path: TransferPath,
    keys: Arc<[BlockHash]>,
    cell: Arc<CompletionCell>,
}

impl TransferHandle {
    pub(crate) fn new(
        path: TransferPath,
        keys: Arc<[BlockHash]>,
        cell: Arc<CompletionCell>,
    ) -> Self {
        Self { path, keys, cell }
    }

    /// The path.
    pub fn path(&self) -> TransferPath {
        self.path
    }

    /// The blocks' keys, in request order.
    pub fn keys(&self) -> &[BlockHash] {
        &self.keys
    }

    /// Whether every block has completed (delivered or failed).
    pub fn is_done(&self) -> bool {
        self.cell.is_done()
    }

    /// Blocks completed so far.
    pub fn completed_blocks(&self) -> usize {
        self.cell.done_count()
    }

    /// The outcome, if every block has completed.
    pub fn try_outcome(&self) -> Option<TransferOutcome> {
        self.cell.try_all().map(|r| self.outcome(r))
    }

    /// Waits for every block.
    pub async fn wait(&self) -> TransferOutcome {
        let results = WaitAll::new(self.cell.clone()).await;
        self.outcome(results)
    }

    /// A future for block `index` alone (an `InvalidRequest` failure for an
    /// index past the end).
    pub fn block(&self, index: usize) -> WaitBlock {
        WaitBlock::new(self.cell.clone(), index)
    }

    fn outcome(&self, results: Vec<BlockResult>) -> TransferOutcome {
        TransferOutcome {
            path: self.path,
            blocks: self.keys.iter().copied().zip(results).collect(),
        }
    }
}
