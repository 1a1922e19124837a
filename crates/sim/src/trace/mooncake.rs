//! Mooncake FAST'25 JSONL: `{"timestamp": ms, "input_length": n,
//! "output_length": n, "hash_ids": [..]}`.
//!
//! The ids are already prefix hashes (remapped to small integers by the
//! trace's authors) over 512-token blocks, so each id becomes a key as it is.

use kvtier_core::BlockHash;
use serde::Deserialize;

use super::{Request, last_block_tokens, millis};

/// Tokens per block of every Mooncake trace.
pub const TOKENS_PER_BLOCK: u32 = 512;

#[derive(Deserialize)]
struct Line {
    timestamp: f64,
    input_length: u32,
    #[serde(default)]
    output_length: u32,
    hash_ids: Vec<u64>,
}

/// Parses one non-blank line.
pub(super) fn parse(line: &str) -> Result<Request, String> {
    let l: Line = serde_json::from_str(line).map_err(|e| e.to_string())?;
    let keys: Vec<BlockHash> = l
        .hash_ids
        .into_iter()
        .map(BlockHash::external_u64)
        .collect();
    Ok(Request {
        timestamp_ms: millis(l.timestamp, 1.0)?,
        instance: 0,
        input_tokens: l.input_length,
        output_tokens: l.output_length,
        last_block_tokens: last_block_tokens(l.input_length, keys.len(), TOKENS_PER_BLOCK),
        keys,
        tokens_per_block: TOKENS_PER_BLOCK,
    })
}
