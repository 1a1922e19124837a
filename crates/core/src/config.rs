//! Configuration machinery every section shares: one TOML file, every key
//! overridable from the environment, sizes with units.
//!
//! Each `[section]` type lives in the crate that uses it (`[memory]`:
//! `kvtier_mem::MemoryConfig`; `[disk]`: `kvtier_disk::DiskConfig`;
//! `[serve]` and `[manager]`: `kvtier-node`; `[meta]`: the `kvtier` binary,
//! which builds the metadata service), and the whole file is assembled
//! where the sections come together (the node's `NodeConfig`, the binary's
//! `Config`). This module has what they all use: [`ByteSize`],
//! [`GeometryConfig`] (`[geometry]`, which every tier needs), the kinds
//! several crates pick from ([`IoEngineKind`],
//! [`RegionEvictionKind`]) and [`from_toml_with_env`], which reads a file
//! with its overrides into any of those assembled types.
//!
//! ```toml
//! [geometry]
//! preset = "llama3-8b"     # or layers / kv_heads / head_dim / latent_dim / dtype
//! tokens_per_block = 16
//!
//! [memory]
//! capacity = "1GiB"
//! shm_name = "kvtier"
//!
//! [disk]
//! dirs = ["/nvme0/kvtier", "/nvme1/kvtier"]
//! capacity_per_dir = "64GiB"
//! region_size = "64MiB"
//! io_engine = "auto"       # auto | io_uring | psync
//! ```
//!
//! An environment variable `KVTIER_<SECTION>__<KEY>` (double underscore
//! between section and key) replaces `<key>` in `[<section>]`, e.g.
//! `KVTIER_DISK__IO_ENGINE=psync` or `KVTIER_MEMORY__CAPACITY=8GiB`. The value
//! is read as a TOML value when it parses as one (`32`, `true`,
//! `["/a", "/b"]`), else as a string. Variables without `__` (such as
//! `KVTIER_CONFIG` or `KVTIER_LOG`) are not overrides. Unknown sections and
//! keys are errors, in the file and in the environment alike, so a typo never
//! passes silently (the assembled types deny unknown fields). Sizes are
//! integers (bytes) or strings with a unit (`"64MiB"`, `"4G"`, `"512k"`).

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use std::fmt;
use std::str::FromStr;

use crate::{Attention, CoreError, Dtype, Geometry, ModelPreset, Result};

/// Prefix of environment overrides.
pub const ENV_PREFIX: &str = "KVTIER_";

/// A size in bytes, written as an integer or a string with a unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// The size in bytes.
    pub const fn bytes(self) -> u64 {
        self.0
    }
}

impl FromStr for ByteSize {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self> {
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: u64 = num.parse().map_err(|_| {
            CoreError::InvalidConfig(format!("size {s:?} does not start with a number"))
        })?;
        let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" | "kib" => 1 << 10,
            "m" | "mb" | "mib" => 1 << 20,
            "g" | "gb" | "gib" => 1 << 30,
            "t" | "tb" | "tib" => 1 << 40,
            other => {
                return Err(CoreError::InvalidConfig(format!(
                    "unknown size unit {other:?} in {s:?}"
                )));
            }
        };
        n.checked_mul(mult)
            .map(ByteSize)
            .ok_or_else(|| CoreError::InvalidConfig(format!("size {s:?} overflows")))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let units = [
            (1u64 << 40, "TiB"),
            (1 << 30, "GiB"),
            (1 << 20, "MiB"),
            (1 << 10, "KiB"),
        ];
        for (m, u) in units {
            if self.0 >= m && self.0.is_multiple_of(m) {
                return write!(f, "{}{u}", self.0 / m);
            }
        }
        write!(f, "{}B", self.0)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(ByteSize(n)),
            Raw::S(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// Which I/O engine the disk tier uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IoEngineKind {
    /// io_uring where `io_uring_setup` works, else the pread/pwrite pool.
    #[default]
    Auto,
    /// io_uring only; fail if unavailable.
    IoUring,
    /// The pread/pwrite thread pool only.
    Psync,
}

/// Which region the disk tier reclaims first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RegionEvictionKind {
    /// The oldest written region.
    #[default]
    Fifo,
    /// The region read least recently.
    Lru,
}

/// `[geometry]`: a preset, optionally with fields overridden, or every field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GeometryConfig {
    /// A [`ModelPreset`] name; `None` means every field below must be set.
    pub preset: Option<String>,
    /// Tokens per block.
    pub tokens_per_block: u32,
    /// Layers (overrides the preset).
    pub layers: Option<u32>,
    /// KV heads before TP sharding (MHA; overrides the preset).
    pub kv_heads: Option<u32>,
    /// Elements per head (MHA; overrides the preset).
    pub head_dim: Option<u32>,
    /// Latent elements per token (MLA; overrides the preset).
    pub latent_dim: Option<u32>,
    /// Element type name (overrides the preset).
    pub dtype: Option<String>,
    /// Tensor-parallel size.
    pub tp_size: u32,
    /// Tensor-parallel rank.
    pub tp_rank: u32,
}

impl Default for GeometryConfig {
    fn default() -> Self {
        Self {
            preset: Some(ModelPreset::Llama3_8B.name().into()),
            tokens_per_block: 16,
            layers: None,
            kv_heads: None,
            head_dim: None,
            latent_dim: None,
            dtype: None,
            tp_size: 1,
            tp_rank: 0,
        }
    }
}

impl GeometryConfig {
    /// Resolves the section into a validated [`Geometry`].
    pub fn resolve(&self) -> Result<Geometry> {
        let mut g = match &self.preset {
            Some(name) => name.parse::<ModelPreset>()?.geometry(self.tokens_per_block),
            None => {
                let layers = self.layers.ok_or_else(|| {
                    CoreError::InvalidConfig("[geometry] needs a preset or layers".into())
                })?;
                let attention = match (self.kv_heads, self.head_dim, self.latent_dim) {
                    (Some(kv_heads), Some(head_dim), None) => Attention::Mha { kv_heads, head_dim },
                    (None, None, Some(latent_dim)) => Attention::Mla { latent_dim },
                    _ => {
                        return Err(CoreError::InvalidConfig(
                            "[geometry] needs kv_heads and head_dim (MHA) or latent_dim (MLA)"
                                .into(),
                        ));
                    }
                };
                Geometry {
                    layers,
                    attention,
                    dtype: Dtype::Bf16,
                    tokens_per_block: self.tokens_per_block,
                    tp_size: 1,
                    tp_rank: 0,
                }
            }
        };
        if let Some(l) = self.layers {
            g.layers = l;
        }
        match (
            &mut g.attention,
            self.kv_heads,
            self.head_dim,
            self.latent_dim,
        ) {
            (Attention::Mha { kv_heads, head_dim }, k, h, None) => {
                *kv_heads = k.unwrap_or(*kv_heads);
                *head_dim = h.unwrap_or(*head_dim);
            }
            (Attention::Mla { latent_dim }, None, None, l) => {
                *latent_dim = l.unwrap_or(*latent_dim)
            }
            _ => {
                return Err(CoreError::InvalidConfig(
                    "[geometry] mixes MHA fields (kv_heads, head_dim) with MLA (latent_dim)".into(),
                ));
            }
        }
        if let Some(d) = &self.dtype {
            g.dtype = d.parse()?;
        }
        g.tp_size = self.tp_size;
        g.tp_rank = self.tp_rank;
        g.validate()?;
        Ok(g)
    }
}

impl GeometryConfig {
    /// The section that resolves to exactly `g`: every field set, the
    /// preset only picking the attention kind (`llama3-8b` for multi-head,
    /// `deepseek-v3` for a latent), so no value comes from a preset.
    pub fn exact(g: &Geometry) -> Self {
        let (preset, kv_heads, head_dim, latent_dim) = match g.attention {
            Attention::Mha { kv_heads, head_dim } => {
                (ModelPreset::Llama3_8B, Some(kv_heads), Some(head_dim), None)
            }
            Attention::Mla { latent_dim } => {
                (ModelPreset::DeepSeekV3, None, None, Some(latent_dim))
            }
        };
        Self {
            preset: Some(preset.name().into()),
            tokens_per_block: g.tokens_per_block,
            layers: Some(g.layers),
            kv_heads,
            head_dim,
            latent_dim,
            dtype: Some(g.dtype.name().into()),
            tp_size: g.tp_size,
            tp_rank: g.tp_rank,
        }
    }

    /// The section as `KVTIER_GEOMETRY__<KEY>=<value>` lines, in the order
    /// of the TOML section; unset fields are left out.
    pub fn env_lines(&self) -> Vec<String> {
        let opt = |v: Option<u32>| v.map(|v| v.to_string());
        let fields = [
            ("preset", self.preset.clone()),
            ("tokens_per_block", Some(self.tokens_per_block.to_string())),
            ("layers", opt(self.layers)),
            ("kv_heads", opt(self.kv_heads)),
            ("head_dim", opt(self.head_dim)),
            ("latent_dim", opt(self.latent_dim)),
            ("dtype", self.dtype.clone()),
            ("tp_size", Some(self.tp_size.to_string())),
            ("tp_rank", Some(self.tp_rank.to_string())),
        ];
        fields
            .into_iter()
            .filter_map(|(k, v)| {
                v.map(|v| format!("{ENV_PREFIX}GEOMETRY__{}={v}", k.to_ascii_uppercase()))
            })
            .collect()
    }
}

/// A TOML document of one `[geometry]` section: what `kvtier shape` prints
/// and what a node's shape file holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GeometryDocument {
    /// `[geometry]`.
    pub geometry: GeometryConfig,
}

impl GeometryDocument {
    /// The document of exactly `g` ([`GeometryConfig::exact`]).
    pub fn exact(g: &Geometry) -> Self {
        Self {
            geometry: GeometryConfig::exact(g),
        }
    }

    /// The document as TOML text.
    pub fn to_toml(&self) -> String {
        to_toml(self)
    }

    /// Parses `text` (no environment overrides) and resolves its section.
    pub fn parse_geometry(text: &str) -> Result<Geometry> {
        let doc: Self = from_toml_with_env(text, std::iter::empty())?;
        doc.geometry.resolve()
    }
}

/// Parses `text` (TOML), applies overrides from `env` (`(name, value)`
/// pairs; pass `std::env::vars()`), and deserializes the result as `T`.
///
/// `T` is a whole-file type assembled from sections; it checks its own
/// values afterwards (this only parses).
pub fn from_toml_with_env<T, I>(text: &str, env: I) -> Result<T>
where
    T: DeserializeOwned,
    I: IntoIterator<Item = (String, String)>,
{
    let mut root: toml::Table =
        toml::from_str(text).map_err(|e| CoreError::InvalidConfig(e.to_string()))?;
    let mut overrides: Vec<(String, String)> = env
        .into_iter()
        .filter(|(k, _)| k.starts_with(ENV_PREFIX) && k.contains("__"))
        .collect();
    // Apply in a fixed order so the result does not depend on the
    // environment's iteration order.
    overrides.sort();
    for (var, value) in overrides {
        apply_override(&mut root, &var, &value)?;
    }
    toml::Value::Table(root)
        .try_into()
        .map_err(|e: toml::de::Error| CoreError::InvalidConfig(e.to_string()))
}

/// `config` as TOML text (empty if it does not serialize, which the
/// configuration types always do).
pub fn to_toml<T: Serialize>(config: &T) -> String {
    toml::to_string_pretty(config).unwrap_or_default()
}

fn apply_override(root: &mut toml::Table, var: &str, value: &str) -> Result<()> {
    let err = |reason: String| CoreError::InvalidEnvOverride {
        var: var.to_owned(),
        reason,
    };
    let path = &var[ENV_PREFIX.len()..];
    let (section, key) = path
        .split_once("__")
        .ok_or_else(|| err("expected KVTIER_<SECTION>__<KEY>".into()))?;
    if section.is_empty() || key.is_empty() || key.contains("__") {
        return Err(err("expected KVTIER_<SECTION>__<KEY>".into()));
    }
    let parsed = toml::from_str::<toml::Table>(&format!("v = {value}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(value.to_owned()));
    let table = root
        .entry(section.to_ascii_lowercase())
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    match table {
        toml::Value::Table(t) => {
            t.insert(key.to_ascii_lowercase(), parsed);
            Ok(())
        }
        _ => Err(err(format!("{section} is not a section"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_round_trip() {
        for s in ["0", "512", "4KiB", "64MiB", "3GiB", "1TiB"] {
            let b: ByteSize = s.parse().unwrap();
            let again: ByteSize = b.to_string().parse().unwrap();
            assert_eq!(b, again);
        }
        assert_eq!("4g".parse::<ByteSize>().unwrap(), ByteSize(4 << 30));
        assert!("99999999999999999999T".parse::<ByteSize>().is_err());
    }

    #[test]
    fn an_exact_section_resolves_to_its_geometry_in_toml_and_env() {
        let mut mha = ModelPreset::Llama3_70B.geometry(32);
        mha.tp_size = 4;
        mha.tp_rank = 1;
        mha.dtype = Dtype::F16;
        let mut mla = ModelPreset::DeepSeekV3.geometry(16);
        mla.layers = 2;
        mla.dtype = Dtype::F32;
        for g in [mha, mla, ModelPreset::Tiny.geometry(32)] {
            let text = GeometryDocument::exact(&g).to_toml();
            assert_eq!(
                GeometryDocument::parse_geometry(&text).unwrap(),
                g,
                "{text}"
            );
            let env = GeometryConfig::exact(&g).env_lines().into_iter().map(|l| {
                let (k, v) = l.split_once('=').unwrap();
                (k.to_owned(), v.to_owned())
            });
            let doc: GeometryDocument = from_toml_with_env("", env).unwrap();
            assert_eq!(doc.geometry.resolve().unwrap(), g);
        }
    }
}
