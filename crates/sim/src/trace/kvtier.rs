//! kvtier's own trace schema: one JSON object per line,
//!
//! ```text
//! {"timestamp_ms": 1200, "instance": 0, "input_tokens": 40, "output_tokens": 8,
//!  "tokens_per_block": 16, "last_block_tokens": 8,
//!  "keys": ["000000000000000000000000000000a1", "..."]}
//! ```
//!
//! Keys are explicit prefix keys, 32 lowercase hex digits each (a `u128`).
//! `instance` is a number, or a name (string) that the reader interns in
//! order of first appearance. Written by [`super::write_kvtier`]; reading it
//! back gives the same requests.

use std::io::Write;

use hashbrown::HashMap;
use kvtier_core::BlockHash;
use serde::{Deserialize, Serialize};

use super::Request;

#[derive(Deserialize, Serialize)]
#[serde(untagged)]
enum Instance {
    Id(u32),
    Name(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    timestamp_ms: u64,
    #[serde(default)]
    instance: Option<Instance>,
    input_tokens: u32,
    #[serde(default)]
    output_tokens: u32,
    tokens_per_block: u32,
    #[serde(default)]
    last_block_tokens: Option<u32>,
    keys: Vec<String>,
}

#[derive(Serialize)]
struct OutLine<'a> {
    timestamp_ms: u64,
    instance: u32,
    input_tokens: u32,
    output_tokens: u32,
    tokens_per_block: u32,
    last_block_tokens: u32,
    keys: &'a [String],
}

/// Reader state: the interned instance names.
#[derive(Debug, Default)]
pub(super) struct State {
    names: HashMap<String, u32>,
}

/// Parses one non-blank line.
pub(super) fn parse(line: &str, state: &mut State) -> Result<Request, String> {
    let l: Line = serde_json::from_str(line).map_err(|e| e.to_string())?;
    if l.tokens_per_block == 0 {
        return Err("tokens_per_block must be at least 1".to_owned());
    }
    let instance = match l.instance {
        None => 0,
        Some(Instance::Id(id)) => id,
        Some(Instance::Name(name)) => {
            // Names share the id space with numbers: name ids count down from
            // u32::MAX so they cannot collide with small numeric ids.
            let next = u32::MAX
                - u32::try_from(state.names.len()).map_err(|_| "too many instances".to_owned())?;
            *state.names.entry(name).or_insert(next)
        }
    };
    let keys = l
        .keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            u128::from_str_radix(k, 16)
                .map(BlockHash)
                .map_err(|e| format!("key {i} ({k:?}) is not a 128-bit hex number: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let last = l.last_block_tokens.unwrap_or(l.tokens_per_block);
    if last == 0 || last > l.tokens_per_block {
        return Err(format!(
            "last_block_tokens {last} is not in 1..={}",
            l.tokens_per_block
        ));
    }
    Ok(Request {
        timestamp_ms: l.timestamp_ms,
        instance,
        input_tokens: l.input_tokens,
        output_tokens: l.output_tokens,
        keys,
        tokens_per_block: l.tokens_per_block,
        last_block_tokens: last,
    })
}

/// Writes `requests`, one line each.
pub(super) fn write<W: Write>(w: W, requests: &[Request]) -> std::io::Result<()> {
    let mut w = std::io::BufWriter::new(w);
    let mut hex = Vec::new();
    for r in requests {
        hex.clear();
        hex.extend(r.keys.iter().map(|k| format!("{:032x}", k.0)));
        let line = OutLine {
            timestamp_ms: r.timestamp_ms,
            instance: r.instance,
            input_tokens: r.input_tokens,
            output_tokens: r.output_tokens,
            tokens_per_block: r.tokens_per_block,
            last_block_tokens: r.last_block_tokens,
            keys: &hex,
        };
        serde_json::to_writer(&mut w, &line)?;
        w.write_all(b"\n")?;
    }
    w.flush()
}
