//! Admission in front of the disk tier: a block is written to G3 only
//! after it was reused `min_reuses` times, so blocks used once do not wear
//! the SSD.
//!
//! Uses are counted in a count-min sketch (TinyLFU, Einziger et al.): `depth`
//! rows of `width` saturating 8-bit counters, each row indexed by its own
//! hash of the block; a block's estimate is the minimum of its counters,
//! which can overestimate (collisions) but never underestimate. Every
//! `reset_after` recorded uses all counters are halved, so old popularity
//! fades and the sketch follows the workload.

use kvtier_core::BlockHash;
use serde::{Deserialize, Serialize};

/// Admission configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdmissionConfig {
    /// Reuses (uses after the first) a block needs before it is written to
    /// disk; 0 admits every block. Default: 1.
    pub min_reuses: u32,
    /// Counters per row (rounded up to a power of two). Default: 65536.
    pub width: usize,
    /// Rows. Default: 4.
    pub depth: usize,
    /// Recorded uses between two halvings; 0 means ten per counter of a
    /// row. Default: 0.
    pub reset_after: u64,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        Self {
            min_reuses: 1,
            width: 1 << 16,
            depth: 4,
            reset_after: 0,
        }
    }
}

/// A count-min sketch of block uses with periodic halving.
#[derive(Debug, Clone)]
pub struct UseSketch {
    mask: u64,
    depth: usize,
    counters: Vec<u8>,
    recorded: u64,
    reset_after: u64,
}

/// Odd multipliers, one per row, so rows index independently.
const ROW_SEEDS: [u64; 8] = [
    0x9e37_79b9_7f4a_7c15,
    0xc2b2_ae3d_27d4_eb4f,
    0x1656_67b1_9e37_79f9,
    0x85eb_ca77_c2b2_ae63,
    0x27d4_eb2f_1656_67c5,
    0xff51_afd7_ed55_8ccd,
    0xc4ce_b9fe_1a85_ec53,
    0x94d0_49bb_1331_11eb,
];

impl UseSketch {
    /// A sketch of `depth` rows (1 to 8) of `width` counters.
    pub fn new(width: usize, depth: usize, reset_after: u64) -> Self {
        let width = width.max(16).next_power_of_two();
        let depth = depth.clamp(1, ROW_SEEDS.len());
        let reset_after = if reset_after == 0 {
            10 * width as u64
        } else {
            reset_after
        };
        Self {
            mask: width as u64 - 1,
            depth,
            counters: vec![0; width * depth],
            recorded: 0,
            reset_after,
        }
    }

    fn index(&self, hash: BlockHash, row: usize) -> usize {
        let x = hash.fold64().wrapping_mul(ROW_SEEDS[row]);
        // High bits of a multiplicative hash are the well-mixed ones.
        let col = (x ^ (x >> 29)).rotate_left(17) & self.mask;
        row * (self.mask as usize + 1) + col as usize
    }

    /// Counts one use of `hash`; halves every counter after `reset_after`
    /// uses.
    pub fn record(&mut self, hash: BlockHash) {
        for row in 0..self.depth {
            let i = self.index(hash, row);
            self.counters[i] = self.counters[i].saturating_add(1);
        }
        self.recorded += 1;
        if self.recorded >= self.reset_after {
            self.halve();
        }
    }

    /// Halves every counter (TinyLFU's reset).
    pub fn halve(&mut self) {
        for c in &mut self.counters {
            *c /= 2;
        }
        self.recorded /= 2;
    }

    /// Estimated uses of `hash` (never below the true count since the last
    /// halving, saturating at 255).
    pub fn estimate(&self, hash: BlockHash) -> u32 {
        (0..self.depth)
            .map(|row| u32::from(self.counters[self.index(hash, row)]))
            .min()
            .unwrap_or(0)
    }
}

/// Decides which blocks may be written to disk.
#[derive(Debug, Clone)]
pub struct AdmissionFilter {
    min_reuses: u32,
    sketch: UseSketch,
}

impl AdmissionFilter {
    /// A filter configured by `config`.
    pub fn new(config: &AdmissionConfig) -> Self {
        Self {
            min_reuses: config.min_reuses,
            sketch: UseSketch::new(config.width, config.depth, config.reset_after),
        }
    }

    /// Counts one use of `hash` (a request that contains it).
    pub fn record(&mut self, hash: BlockHash) {
        self.sketch.record(hash);
    }

    /// Whether `hash` was used often enough to be written to disk.
    pub fn admits(&self, hash: BlockHash) -> bool {
        self.min_reuses == 0 || self.sketch.estimate(hash) > self.min_reuses
    }

    /// The sketch.
    pub fn sketch(&self) -> &UseSketch {
        &self.sketch
    }

    /// The sketch, to halve it by hand.
    pub fn sketch_mut(&mut self) -> &mut UseSketch {
        &mut self.sketch
    }
}
