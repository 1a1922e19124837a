//! `kvtier shape`: the node's `[geometry]` for a Hugging Face model, as an
//! engine runs it (TP size, KV dtype, tokens per block, platform), for
//! those who configure the daemon's shape by hand rather than let the
//! first engine set it (docs/configuration.md, "Block shape").
//!
//! It computes what kvtier's vLLM integrations declare: one TP rank's
//! layer of a block is `2 x tokens x kv_heads_per_rank x head_dim x
//! dtype bytes` for multi-head attention (KV heads split over the ranks,
//! replicated when there are fewer heads than ranks), and `tokens x
//! (kv_lora_rank + qk_rope_head_dim) x dtype bytes` for latent attention
//! (MLA, the same latent on every rank). vLLM's CPU and CUDA platforms lay
//! a block's elements out differently but hold the same bytes; they
//! differ in the tokens per block they run with (below).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use kvtier_core::{Attention, Dtype, Geometry, GeometryConfig, GeometryDocument};
use serde_json::Value;

/// The platform the engine runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Platform {
    /// vLLM on CUDA GPUs: blocks of 16 tokens unless the engine sets
    /// another size.
    Cuda,
    /// vLLM's CPU platform: blocks of 128 tokens unless set (a multiple of
    /// 32); latent attention (MLA) always runs blocks of 16.
    Cpu,
}

/// What to print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// The `[geometry]` section, then the same as environment variables.
    Both,
    /// The `[geometry]` section alone.
    Toml,
    /// `KVTIER_GEOMETRY__*=value` lines alone.
    Env,
}

/// Arguments of `kvtier shape`.
#[derive(Args, Debug)]
pub struct ShapeArgs {
    /// The model's `config.json`, or the directory that holds it.
    model: PathBuf,
    /// Tensor-parallel size of the engine.
    #[arg(long, default_value_t = 1)]
    tp: u32,
    /// KV cache element type (f32, f16, bf16, fp8, ... or torch's names);
    /// `auto`: the model's `torch_dtype`.
    #[arg(long, default_value = "auto")]
    dtype: String,
    /// Tokens per block, as the engine runs (vLLM's `block_size`); default
    /// the platform's.
    #[arg(long)]
    block_size: Option<u32>,
    /// The platform the engine runs on.
    #[arg(long, value_enum, default_value_t = Platform::Cuda)]
    platform: Platform,
    /// KV heads per stored object, when the vLLM connector stores head
    /// shards (`shard_heads`); multi-head attention only.
    #[arg(long)]
    shard_heads: Option<u32>,
    /// What to print.
    #[arg(long, value_enum, default_value_t = Format::Both)]
    format: Format,
}

/// Prints the geometry `args` describe.
pub fn run(args: ShapeArgs) -> Result<()> {
    let (geometry, notes) = geometry_of(&args)?;
    print!("{}", render(&args, &geometry, &notes));
    Ok(())
}

/// The text `kvtier shape` prints for `g`.
fn render(args: &ShapeArgs, g: &Geometry, notes: &[String]) -> String {
    let mut out = String::new();
    let env = GeometryConfig::exact(g).env_lines().join("\n");
    if args.format != Format::Env {
        out.push_str(&format!("# {}: {}\n", args.model.display(), g.describe()));
        for note in notes {
            out.push_str(&format!("# {note}\n"));
        }
        out.push_str(&GeometryDocument::exact(g).to_toml());
    }
    match args.format {
        Format::Both => out.push_str(&format!("\n# or as environment variables:\n{env}\n")),
        Format::Env => out.push_str(&format!("{env}\n")),
        Format::Toml => {}
    }
    out
}

/// The model's shape as `args` run it, with notes on choices made.
pub fn geometry_of(args: &ShapeArgs) -> Result<(Geometry, Vec<String>)> {
    let path = config_path(&args.model);
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading the model config {}", path.display()))?;
    let root: Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let model = HfModel::parse(&root).with_context(|| format!("in {}", path.display()))?;
    if args.tp == 0 {
        bail!("--tp must be positive");
    }
    let dtype = model.dtype(&args.dtype)?;
    let mut notes = Vec::new();
    let tokens = tokens_per_block(args, model.latent.is_some(), &mut notes)?;
    let mut g = Geometry {
        layers: model.layers,
        attention: match model.latent {
            Some(latent_dim) => Attention::Mla { latent_dim },
            None => Attention::Mha {
                kv_heads: model.kv_heads,
                head_dim: model.head_dim,
            },
        },
        dtype,
        tokens_per_block: tokens,
        tp_size: args.tp,
        tp_rank: 0,
    };
    if let Some(k) = args.shard_heads {
        shard(&mut g, k, &mut notes)?;
    }
    g.validate().context("the shape is not one kvtier holds")?;
    Ok((g, notes))
}

/// `<dir>/config.json` for a directory, else the path itself.
fn config_path(model: &Path) -> PathBuf {
    if model.is_dir() {
        model.join("config.json")
    } else {
        model.to_owned()
    }
}

/// The tokens per block the engine runs with on its platform.
fn tokens_per_block(args: &ShapeArgs, mla: bool, notes: &mut Vec<String>) -> Result<u32> {
    let tokens = match (args.platform, mla, args.block_size) {
        (Platform::Cpu, true, given) => {
            if given.is_some_and(|b| b != 16) {
                notes.push(
                    "vLLM's CPU platform runs latent attention (MLA) with blocks of 16 tokens, whatever block_size says"
                        .into(),
                );
            }
            16
        }
        (Platform::Cpu, false, given) => {
            let b = given.unwrap_or(128);
            if !b.is_multiple_of(32) {
                notes.push(format!(
                    "vLLM's CPU attention wants blocks of a multiple of 32 tokens, not {b}"
                ));
            }
            b
        }
        (Platform::Cuda, _, given) => given.unwrap_or(16),
    };
    if tokens == 0 {
        bail!("--block-size must be positive");
    }
    Ok(tokens)
}

/// Makes `g` one head shard of `k` KV heads: what the vLLM connector
/// stores with `shard_heads = k`, the same for every TP size.
fn shard(g: &mut Geometry, k: u32, notes: &mut Vec<String>) -> Result<()> {
    let Attention::Mha { head_dim, .. } = g.attention else {
        notes.push(
            "latent attention is always stored as one shard; --shard-heads changes nothing".into(),
        );
        return Ok(());
    };
    let per_rank = g.kv_heads_per_rank();
    if k == 0 || !per_rank.is_multiple_of(k) {
        bail!(
            "--shard-heads {k} must divide the {per_rank} KV heads each of {} ranks holds",
            g.tp_size
        );
    }
    g.attention = Attention::Mha {
        kv_heads: k,
        head_dim,
    };
    g.tp_size = 1;
    notes.push(format!(
        "head shards of {k} KV heads: the same shape at every TP size"
    ));
    Ok(())
}

/// What a Hugging Face `config.json` says of the KV cache.
#[derive(Debug, PartialEq)]
struct HfModel {
    layers: u32,
    kv_heads: u32,
    head_dim: u32,
    /// `kv_lora_rank + qk_rope_head_dim` for latent attention.
    latent: Option<u32>,
    torch_dtype: Option<String>,
}

impl HfModel {
    /// Reads the fields, from `text_config` for a model that nests its
    /// language model's.
    fn parse(root: &Value) -> Result<Self> {
        let c = match root.get("text_config") {
            Some(t) if root.get("num_hidden_layers").is_none() && t.is_object() => t,
            _ => root,
        };
        let layers = field(c, "num_hidden_layers")?
            .context("no num_hidden_layers: not a transformer config kvtier knows")?;
        let latent = match field(c, "kv_lora_rank")? {
            Some(rank) => {
                let rope = field(c, "qk_rope_head_dim")?
                    .context("kv_lora_rank (latent attention) without qk_rope_head_dim")?;
                Some(
                    rank.checked_add(rope)
                        .context("kv_lora_rank + qk_rope_head_dim overflows")?,
                )
            }
            None => None,
        };
        let (kv_heads, head_dim) = match latent {
            Some(_) => (1, 0),
            None => heads(c)?,
        };
        let torch_dtype = ["torch_dtype", "dtype"]
            .iter()
            .find_map(|k| c.get(*k).or_else(|| root.get(*k)))
            .and_then(Value::as_str)
            .map(str::to_owned);
        Ok(Self {
            layers,
            kv_heads,
            head_dim,
            latent,
            torch_dtype,
        })
    }

    /// The KV dtype: `wanted`, or the model's own for `auto`.
    fn dtype(&self, wanted: &str) -> Result<Dtype> {
        let name = match (wanted, &self.torch_dtype) {
            ("auto", Some(d)) => d.as_str(),
            ("auto", None) => bail!("the config names no torch_dtype: pass --dtype"),
            (given, _) => given,
        };
        name.parse::<Dtype>()
            .map_err(|e| anyhow::anyhow!("{e} (f32, f16, bf16, fp8, int8 or torch's names)"))
    }
}

/// KV heads (`num_key_value_heads`, else every attention head) and head
/// size (`head_dim`, else `hidden_size / num_attention_heads`).
fn heads(c: &Value) -> Result<(u32, u32)> {
    let heads = field(c, "num_attention_heads")?.context("no num_attention_heads")?;
    if heads == 0 {
        bail!("num_attention_heads must be positive");
    }
    let kv_heads = field(c, "num_key_value_heads")?.unwrap_or(heads);
    let head_dim = match field(c, "head_dim")? {
        Some(d) => d,
        None => {
            let hidden = field(c, "hidden_size")?.context("neither head_dim nor hidden_size")?;
            if !hidden.is_multiple_of(heads) {
                bail!(
                    "hidden_size {hidden} does not split into {heads} heads; the config needs head_dim"
                );
            }
            hidden / heads
        }
    };
    Ok((kv_heads, head_dim))
}

/// A non-negative integer field that fits u32; `None` when absent or null.
fn field(c: &Value, name: &str) -> Result<Option<u32>> {
    match c.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .with_context(|| format!("{name} is {v}, not a count")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn gqa_head_dim_from_hidden_size_and_mla_latent() {
        let llama = json!({"num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "hidden_size": 128, "torch_dtype": "float32"});
        let m = HfModel::parse(&llama).unwrap();
        assert_eq!(
            (m.layers, m.kv_heads, m.head_dim, m.latent),
            (2, 2, 32, None)
        );
        assert_eq!(m.dtype("auto").unwrap(), Dtype::F32);
        assert_eq!(m.dtype("bfloat16").unwrap(), Dtype::Bf16);
        let ds = json!({"num_hidden_layers": 61, "num_attention_heads": 128,
            "kv_lora_rank": 512, "qk_rope_head_dim": 64, "torch_dtype": "bfloat16"});
        assert_eq!(HfModel::parse(&ds).unwrap().latent, Some(576));
        let nested = json!({"text_config": {"num_hidden_layers": 3,
            "num_attention_heads": 8, "head_dim": 64}, "torch_dtype": "bfloat16"});
        let m = HfModel::parse(&nested).unwrap();
        assert_eq!((m.layers, m.kv_heads, m.head_dim), (3, 8, 64));
        assert_eq!(m.torch_dtype.as_deref(), Some("bfloat16"));
    }

    #[test]
    fn bad_configs_say_what_is_wrong() {
        let err = |v: Value| format!("{:#}", HfModel::parse(&v).unwrap_err());
        assert!(err(json!({"model_type": "bert"})).contains("num_hidden_layers"));
        assert!(err(json!({"num_hidden_layers": "two"})).contains("not a count"));
        let odd = json!({"num_hidden_layers": 2, "num_attention_heads": 3, "hidden_size": 128});
        assert!(err(odd).contains("head_dim"));
        let half = json!({"num_hidden_layers": 2, "kv_lora_rank": 512});
        assert!(err(half).contains("qk_rope_head_dim"));
        let m = HfModel::parse(&json!({"num_hidden_layers": 2, "num_attention_heads": 2,
            "head_dim": 32}))
        .unwrap();
        assert!(m.dtype("auto").unwrap_err().to_string().contains("--dtype"));
        assert!(m.dtype("float13").is_err());
    }
}
