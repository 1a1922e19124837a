//! Model geometry: from a model's shape to bytes per object and per block.
//!
//! A block holds the KV of `tokens_per_block` tokens for every layer. Its
//! bytes are ordered layer by layer, and inside a layer part by part (K then
//! V for multi-head attention, one latent part for MLA):
//!
//! ```text
//! block = [layer 0: K | V][layer 1: K | V] ... [layer L-1: K | V]
//! ```
//!
//! so one layer of a block ([`Geometry::layer_range`]) is contiguous, and an
//! *object* (one layer's K or V) is `object_bytes()` long.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use crate::{CoreError, Result};

/// Element type of the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// 32-bit float.
    F32,
    /// 16-bit float.
    F16,
    /// bfloat16.
    Bf16,
    /// 8-bit float (e4m3 or e5m2; the size is what matters here).
    Fp8,
    /// 8-bit integer.
    Int8,
}

impl Dtype {
    /// Bytes per element.
    pub const fn bytes(self) -> u32 {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::Fp8 | Dtype::Int8 => 1,
        }
    }

    /// The lowercase name used in configuration and salts.
    pub const fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
            Dtype::Fp8 => "fp8",
            Dtype::Int8 => "int8",
        }
    }
}

impl FromStr for Dtype {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" | "fp32" | "float" => Dtype::F32,
            "f16" | "float16" | "fp16" | "half" => Dtype::F16,
            "bf16" | "bfloat16" => Dtype::Bf16,
            // torch's names too: engines name their KV dtype as torch does.
            "fp8" | "fp8_e4m3" | "fp8_e5m2" | "e4m3" | "e5m2" | "float8_e4m3fn"
            | "float8_e4m3fnuz" | "float8_e5m2" | "float8_e5m2fnuz" => Dtype::Fp8,
            "int8" | "i8" | "uint8" | "u8" => Dtype::Int8,
            other => {
                return Err(CoreError::InvalidGeometry(format!(
                    "unknown dtype {other:?}"
                )));
            }
        })
    }
}

/// How a layer stores its KV.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Attention {
    /// Multi-head (or grouped-query) attention: a K and a V part per layer,
    /// each `kv_heads x head_dim` per token. KV heads are split across TP
    /// ranks (replicated when there are fewer heads than ranks).
    Mha {
        /// KV heads of the whole model (before TP sharding).
        kv_heads: u32,
        /// Elements per head.
        head_dim: u32,
    },
    /// Multi-head latent attention (DeepSeek): one compressed latent part per
    /// layer of `latent_dim` elements per token, replicated on every TP rank.
    Mla {
        /// Elements per token (kv_lora_rank + rope head dim, 576 for DeepSeek-V3).
        latent_dim: u32,
    },
}

/// Which part of a layer an object is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvPart {
    /// Keys (or the latent, for MLA).
    K = 0,
    /// Values (MHA only).
    V = 1,
}

/// The shape of one engine's KV cache shard: enough to size every object and
/// block. Build one from a [`ModelPreset`] or field by field, then
/// [`validate`](Geometry::validate) it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Geometry {
    /// Transformer layers.
    pub layers: u32,
    /// Attention kind and its dimensions.
    pub attention: Attention,
    /// Element type.
    pub dtype: Dtype,
    /// Tokens per block.
    pub tokens_per_block: u32,
    /// Tensor-parallel size.
    pub tp_size: u32,
    /// Tensor-parallel rank of this shard (`< tp_size`).
    pub tp_rank: u32,
}

impl Geometry {
    /// Checks that every field is in range.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(CoreError::InvalidGeometry(m));
        if self.layers == 0 {
            return bad("layers must be positive".into());
        }
        if self.tokens_per_block == 0 {
            return bad("tokens_per_block must be positive".into());
        }
        if self.tp_size == 0 || self.tp_rank >= self.tp_size {
            return bad(format!(
                "tp_rank {} must be below tp_size {}",
                self.tp_rank, self.tp_size
            ));
        }
        match self.attention {
            Attention::Mha { kv_heads, head_dim } => {
                if kv_heads == 0 || head_dim == 0 {
                    return bad("kv_heads and head_dim must be positive".into());
                }
                if kv_heads >= self.tp_size && !kv_heads.is_multiple_of(self.tp_size) {
                    return bad(format!(
                        "kv_heads {kv_heads} do not split over tp_size {}",
                        self.tp_size
                    ));
                }
            }
            Attention::Mla { latent_dim } => {
                if latent_dim == 0 {
                    return bad("latent_dim must be positive".into());
                }
            }
        }
        // Blocks are addressed with u64 offsets but sized with u32 pieces;
        // refuse shapes whose object would not fit in u32.
        let elems = self.elements_per_token_per_part() as u64 * self.tokens_per_block as u64;
        if elems * self.dtype.bytes() as u64 > u32::MAX as u64 {
            return bad("object larger than 4 GiB".into());
        }
        Ok(())
    }

    /// KV heads held by this TP rank (MHA), or 1 for MLA.
    pub fn kv_heads_per_rank(&self) -> u32 {
        match self.attention {
            Attention::Mha { kv_heads, .. } => (kv_heads / self.tp_size).max(1),
            Attention::Mla { .. } => 1,
        }
    }

    fn elements_per_token_per_part(&self) -> u32 {
        match self.attention {
            Attention::Mha { head_dim, .. } => self.kv_heads_per_rank() * head_dim,
            Attention::Mla { latent_dim } => latent_dim,
        }
    }

    /// Parts per layer: 2 (K and V) for MHA, 1 for MLA.
    pub fn parts_per_layer(&self) -> u32 {
        match self.attention {
            Attention::Mha { .. } => 2,
            Attention::Mla { .. } => 1,
        }
    }

    /// Bytes of one object (one layer's K or V, or latent, of one block).
    pub fn object_bytes(&self) -> u64 {
        self.tokens_per_block as u64
            * self.elements_per_token_per_part() as u64
            * self.dtype.bytes() as u64
    }

    /// Bytes of one layer of one block (all its parts).
    pub fn layer_bytes(&self) -> u64 {
        self.object_bytes() * self.parts_per_layer() as u64
    }

    /// Bytes of one whole block.
    pub fn block_bytes(&self) -> u64 {
        self.layer_bytes() * self.layers as u64
    }

    /// Objects per block (`layers x parts_per_layer`).
    pub fn objects_per_block(&self) -> u32 {
        self.layers * self.parts_per_layer()
    }

    /// KV bytes per token of this shard.
    pub fn bytes_per_token(&self) -> u64 {
        self.block_bytes() / self.tokens_per_block as u64
    }

    /// Byte offset of object (`layer`, `part`) inside a block.
    pub fn object_offset(&self, layer: u32, part: KvPart) -> u64 {
        debug_assert!(layer < self.layers);
        debug_assert!((part as u32) < self.parts_per_layer());
        layer as u64 * self.layer_bytes() + part as u64 * self.object_bytes()
    }

    /// Byte range of `layer` inside a block.
    pub fn layer_range(&self, layer: u32) -> Range<u64> {
        let start = layer as u64 * self.layer_bytes();
        start..start + self.layer_bytes()
    }

    /// Byte range of the contiguous layers `layers` inside a block.
    pub fn layers_range(&self, layers: Range<u32>) -> Range<u64> {
        layers.start as u64 * self.layer_bytes()..layers.end as u64 * self.layer_bytes()
    }

    /// A geometry whose block is exactly `bytes` long and has `layers`
    /// layers of one part each: the shape benchmarks use for raw object sizes.
    /// `bytes` must be a positive multiple of `layers`.
    pub fn raw(layers: u32, bytes: u64) -> Result<Self> {
        if layers == 0 || bytes == 0 || !bytes.is_multiple_of(layers as u64) {
            return Err(CoreError::InvalidGeometry(format!(
                "{bytes} bytes do not split into {layers} layers"
            )));
        }
        let per_layer = bytes / layers as u64;
        let latent = u32::try_from(per_layer)
            .map_err(|_| CoreError::InvalidGeometry("layer larger than 4 GiB".into()))?;
        let g = Geometry {
            layers,
            attention: Attention::Mla { latent_dim: latent },
            dtype: Dtype::Int8,
            tokens_per_block: 1,
            tp_size: 1,
            tp_rank: 0,
        };
        g.validate()?;
        Ok(g)
    }
}

impl Geometry {
    /// The shape in the terms a model card uses: layers, KV heads and head
    /// size (or the latent), element type, tokens per block and TP, then the
    /// bytes they make.
    pub fn describe(&self) -> String {
        let kv = match self.attention {
            Attention::Mha { kv_heads, head_dim } => format!(
                "{kv_heads} KV heads of {head_dim} ({} per TP rank)",
                self.kv_heads_per_rank()
            ),
            Attention::Mla { latent_dim } => format!("a latent of {latent_dim} per token"),
        };
        format!(
            "{} layers, {kv}, {}, {} tokens per block, TP {}: {} B per layer of a block, {} B per block",
            self.layers,
            self.dtype.name(),
            self.tokens_per_block,
            self.tp_size,
            self.layer_bytes(),
            self.block_bytes()
        )
    }
}

impl fmt::Display for Geometry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} layers x {} parts x {} B objects ({} tokens/block, {}, tp {}/{}) = {} B/block",
            self.layers,
            self.parts_per_layer(),
            self.object_bytes(),
            self.tokens_per_block,
            self.dtype.name(),
            self.tp_rank,
            self.tp_size,
            self.block_bytes()
        )
    }
}

/// Geometries of a few real models (BF16 KV, TP 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ModelPreset {
    /// Llama-3-8B: 32 layers, 8 KV heads of 128 (GQA).
    Llama3_8B,
    /// Llama-3-70B: 80 layers, 8 KV heads of 128 (GQA).
    Llama3_70B,
    /// Qwen3-32B: 64 layers, 8 KV heads of 128 (GQA).
    Qwen3_32B,
    /// DeepSeek-V3 / R1: 61 layers of MLA with a 576-element latent.
    DeepSeekV3,
    /// A tiny Llama-shaped model (2 layers, 2 KV heads of 32, f32) matching
    /// the CPU vLLM test setup.
    Tiny,
}

impl ModelPreset {
    /// Every preset.
    pub const ALL: [ModelPreset; 5] = [
        ModelPreset::Llama3_8B,
        ModelPreset::Llama3_70B,
        ModelPreset::Qwen3_32B,
        ModelPreset::DeepSeekV3,
        ModelPreset::Tiny,
    ];

    /// The preset's name in configuration files.
    pub const fn name(self) -> &'static str {
        match self {
            ModelPreset::Llama3_8B => "llama3-8b",
            ModelPreset::Llama3_70B => "llama3-70b",
            ModelPreset::Qwen3_32B => "qwen3-32b",
            ModelPreset::DeepSeekV3 => "deepseek-v3",
            ModelPreset::Tiny => "tiny",
        }
    }

    /// The geometry at `tokens_per_block`, TP 1, the preset's dtype.
    pub fn geometry(self, tokens_per_block: u32) -> Geometry {
        let (layers, attention, dtype) = match self {
            ModelPreset::Llama3_8B => (
                32,
                Attention::Mha {
                    kv_heads: 8,
                    head_dim: 128,
                },
                Dtype::Bf16,
            ),
            ModelPreset::Llama3_70B => (
                80,
                Attention::Mha {
                    kv_heads: 8,
                    head_dim: 128,
                },
                Dtype::Bf16,
            ),
            ModelPreset::Qwen3_32B => (
                64,
                Attention::Mha {
                    kv_heads: 8,
                    head_dim: 128,
                },
                Dtype::Bf16,
            ),
            ModelPreset::DeepSeekV3 => (61, Attention::Mla { latent_dim: 576 }, Dtype::Bf16),
            ModelPreset::Tiny => (
                2,
                Attention::Mha {
                    kv_heads: 2,
                    head_dim: 32,
                },
                Dtype::F32,
            ),
        };
        Geometry {
            layers,
            attention,
            dtype,
            tokens_per_block,
            tp_size: 1,
            tp_rank: 0,
        }
    }
}

impl FromStr for ModelPreset {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self> {
        let wanted = s.to_ascii_lowercase().replace('_', "-");
        Self::ALL
            .into_iter()
            .find(|p| p.name() == wanted)
            .ok_or_else(|| CoreError::UnknownPreset {
                name: s.to_owned(),
                known: Self::ALL.map(|p| p.name()).join(", "),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preset_sizes_match_published_figures() {
        // 2 MiB per 16-token block for Llama-3-8B (the bench's block case).
        assert_eq!(ModelPreset::Llama3_8B.geometry(16).block_bytes(), 2 << 20);
        // Llama-3-70B: 320 KiB per token -> 5.24 MB per 16-token block (seed 001).
        let g70 = ModelPreset::Llama3_70B.geometry(16);
        assert_eq!(g70.bytes_per_token(), 327_680);
        assert_eq!(g70.block_bytes(), 5_242_880);
        assert_eq!(
            ModelPreset::Qwen3_32B.geometry(16).bytes_per_token(),
            262_144
        );
        // DeepSeek-V3: 61 x 576 x 2 = 70,272 B per token (seed 002's table).
        assert_eq!(
            ModelPreset::DeepSeekV3.geometry(16).bytes_per_token(),
            70_272
        );
        assert_eq!(ModelPreset::DeepSeekV3.geometry(16).parts_per_layer(), 1);
    }

    #[test]
    fn tp_splits_kv_heads_and_replicates_when_fewer() {
        let mut g = ModelPreset::Llama3_70B.geometry(16);
        g.tp_size = 4;
        g.tp_rank = 3;
        g.validate().unwrap();
        assert_eq!(g.kv_heads_per_rank(), 2);
        g.tp_size = 16;
        g.tp_rank = 15;
        g.validate().unwrap();
        assert_eq!(g.kv_heads_per_rank(), 1);
        g.tp_rank = 16;
        assert!(g.validate().is_err());
    }

    #[test]
    fn offsets_tile_the_block() {
        let g = ModelPreset::Tiny.geometry(32);
        let mut expect = 0;
        for layer in 0..g.layers {
            for part in [KvPart::K, KvPart::V] {
                assert_eq!(g.object_offset(layer, part), expect);
                expect += g.object_bytes();
            }
            assert_eq!(g.layer_range(layer).end, expect);
        }
        assert_eq!(expect, g.block_bytes());
    }

    #[test]
    fn presets_parse_by_name() {
        for p in ModelPreset::ALL {
            assert_eq!(p.name().parse::<ModelPreset>().unwrap(), p);
        }
        let err = "gpt-9".parse::<ModelPreset>().unwrap_err().to_string();
        assert!(err.contains("llama3-8b"), "{err}");
    }

    #[test]
    fn raw_geometry_has_exact_size() {
        let g = Geometry::raw(1, 128 << 10).unwrap();
        assert_eq!(g.block_bytes(), 128 << 10);
        assert!(Geometry::raw(3, 100).is_err());
    }
}
