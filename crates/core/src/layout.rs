//! Where each object of many blocks sits in memory (Dynamo KVBM's layouts).
//!
//! - [`Layout::FullyContiguous`]: one buffer; block `b` occupies
//!   `[b * block_stride, b * block_stride + block_bytes)` with its objects in
//!   the order of [`Geometry::object_offset`].
//! - [`Layout::LayerSeparate`]: one buffer per layer (as engines allocate one
//!   KV tensor per layer); in layer `l`'s buffer, block `b`'s parts sit at
//!   `b * layer_stride`.
//!
//! Strides are rounded up to `alignment` so every block (or block-layer) can
//! be the target of an O_DIRECT transfer.

use serde::{Deserialize, Serialize};

use crate::{Geometry, KvPart};

/// How the objects of many blocks are arranged in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layout {
    /// All layers of a block contiguous; blocks one after another.
    FullyContiguous,
    /// One buffer per layer; in each, blocks one after another.
    LayerSeparate,
}

/// A position: which buffer, and the byte offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// Buffer index (always 0 for [`Layout::FullyContiguous`]).
    pub buffer: usize,
    /// Byte offset inside that buffer.
    pub offset: u64,
}

const fn align_up(n: u64, align: u64) -> u64 {
    n.div_ceil(align) * align
}

impl Layout {
    /// Sizes of the buffers holding `blocks` blocks of `geometry`.
    pub fn buffer_sizes(self, geometry: &Geometry, blocks: u64, alignment: u64) -> Vec<u64> {
        match self {
            Layout::FullyContiguous => vec![blocks * self.stride(geometry, alignment)],
            Layout::LayerSeparate => {
                vec![blocks * self.stride(geometry, alignment); geometry.layers as usize]
            }
        }
    }

    /// Distance between consecutive blocks inside one buffer.
    pub fn stride(self, geometry: &Geometry, alignment: u64) -> u64 {
        let alignment = alignment.max(1);
        match self {
            Layout::FullyContiguous => align_up(geometry.block_bytes(), alignment),
            Layout::LayerSeparate => align_up(geometry.layer_bytes(), alignment),
        }
    }

    /// Where object (`layer`, `part`) of block `block` sits.
    pub fn object(
        self,
        geometry: &Geometry,
        alignment: u64,
        block: u64,
        layer: u32,
        part: KvPart,
    ) -> Placement {
        let stride = self.stride(geometry, alignment);
        match self {
            Layout::FullyContiguous => Placement {
                buffer: 0,
                offset: block * stride + geometry.object_offset(layer, part),
            },
            Layout::LayerSeparate => Placement {
                buffer: layer as usize,
                offset: block * stride + part as u64 * geometry.object_bytes(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ModelPreset;
    use proptest::prelude::*;

    proptest! {
        /// No two objects of any two blocks overlap, and all fit the buffers.
        #[test]
        fn objects_never_overlap(blocks in 1u64..6, align_pow in 0u32..13, separate in any::<bool>()) {
            let g = ModelPreset::Tiny.geometry(32);
            let layout = if separate { Layout::LayerSeparate } else { Layout::FullyContiguous };
            let align = 1u64 << align_pow;
            let sizes = layout.buffer_sizes(&g, blocks, align);
            let mut spans: Vec<(usize, u64, u64)> = Vec::new();
            for b in 0..blocks {
                for l in 0..g.layers {
                    for p in [KvPart::K, KvPart::V] {
                        let at = layout.object(&g, align, b, l, p);
                        prop_assert!(at.offset + g.object_bytes() <= sizes[at.buffer]);
                        spans.push((at.buffer, at.offset, at.offset + g.object_bytes()));
                    }
                }
            }
            spans.sort();
            for w in spans.windows(2) {
                prop_assert!(w[0].0 != w[1].0 || w[0].2 <= w[1].1);
            }
        }
    }
}
