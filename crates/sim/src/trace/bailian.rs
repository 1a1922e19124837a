//! Alibaba Qwen Bailian JSONL (`qwen_traceA_blksz_16.jsonl` and kin):
//! `chat_id`, `parent_chat_id`, `timestamp` (seconds, float), `input_length`,
//! `output_length`, `type`, `turn`, `hash_ids`.
//!
//! Its `hash_ids` are **per-block** hashes of 16 tokens, not prefix-chained:
//! two requests that share block 3's tokens but differ in block 1 carry the
//! same id at position 3. The reader chains them into prefix keys,
//! `key_i = BlockHash::chained(key_{i-1} or None, 0, [lo32(id_i), hi32(id_i)])`,
//! so that an equal key means an equal prefix, as everywhere else. The
//! request's `type` (e.g. `text`, `image`) is interned as its instance, in
//! order of first appearance starting at 0.

use hashbrown::HashMap;
use kvtier_core::BlockHash;
use serde::Deserialize;

use super::{Request, last_block_tokens, millis};

/// Tokens per block of the Bailian traces.
pub const TOKENS_PER_BLOCK: u32 = 16;

#[derive(Deserialize)]
struct Line {
    timestamp: f64,
    input_length: u32,
    #[serde(default)]
    output_length: u32,
    #[serde(default, rename = "type")]
    kind: Option<String>,
    hash_ids: Vec<u64>,
}

/// Reader state: the interned request types.
#[derive(Debug, Default)]
pub(super) struct State {
    types: HashMap<String, u32>,
}

/// Chains per-block ids into prefix keys.
pub fn chain(ids: &[u64]) -> Vec<BlockHash> {
    let mut parent = None;
    ids.iter()
        .map(|&id| {
            let key = BlockHash::chained(parent, 0, &[id as u32, (id >> 32) as u32]);
            parent = Some(key);
            key
        })
        .collect()
}

/// Parses one non-blank line.
pub(super) fn parse(line: &str, state: &mut State) -> Result<Request, String> {
    let l: Line = serde_json::from_str(line).map_err(|e| e.to_string())?;
    let instance = match l.kind {
        None => 0,
        Some(kind) => {
            let next = u32::try_from(state.types.len())
                .map_err(|_| "too many request types".to_owned())?;
            *state.types.entry(kind).or_insert(next)
        }
    };
    let keys = chain(&l.hash_ids);
    Ok(Request {
        timestamp_ms: millis(l.timestamp, 1000.0)?,
        instance,
        input_tokens: l.input_length,
        output_tokens: l.output_length,
        last_block_tokens: last_block_tokens(l.input_length, keys.len(), TOKENS_PER_BLOCK),
        keys,
        tokens_per_block: TOKENS_PER_BLOCK,
    })
}
