//! vLLM's KV-event wire format (`vllm/distributed/kv_events.py`), encoded
//! by hand with `rmp` so the bytes match what msgspec writes.
//!
//! vLLM declares its events as msgspec structs with `array_like=True`,
//! `omit_defaults=True` and `tag=True`, so on the wire
//!
//! ```text
//! KVEventBatch     = [ts: float64, events: [event...], data_parallel_rank: int]
//! BlockStored      = ["BlockStored", block_hashes: [int...], parent_block_hash: int | nil,
//!                     token_ids: [int...], block_size: int, lora_id: nil,
//!                     medium: str, lora_name: nil]
//! BlockRemoved     = ["BlockRemoved", block_hashes: [int...], medium: str]
//! AllBlocksCleared = ["AllBlocksCleared"]
//! ```
//!
//! Fields vLLM gives defaults (`extra_keys`, `group_idx`, ...) are left out,
//! as `omit_defaults` does when they hold their defaults. msgspec ignores
//! trailing elements it does not know and fills missing trailing ones from
//! defaults, so decoders of older vLLM versions (without `medium` or
//! `lora_name`) read these arrays too. See `docs/events.md`.

use kvtier_core::{BlockHash, TierKind};
use rmp::encode;

use super::{EventBatch, KvEvent};

/// The integer vLLM and Dynamo carry for a block: the low 64 bits of the
/// 128-bit hash.
///
/// vLLM turns its byte hashes into event ints with
/// `int.from_bytes(hash, "big") & (2**64 - 1)`, i.e. the low 64 bits of the
/// hash read as a big-endian number; reading a [`BlockHash`] as that number
/// gives the same rule. An engine's own 64-bit id, taken in with
/// [`BlockHash::external_u64`], comes back unchanged.
pub const fn vllm_block_hash(hash: BlockHash) -> u64 {
    hash.0 as u64
}

/// The `medium` string for a kind of tier, chosen from the names Dynamo's
/// `StorageTier::from_kv_medium` understands (a tier is named by what it
/// is, not by its position in the node's list).
pub const fn vllm_medium(kind: TierKind) -> &'static str {
    match kind {
        TierKind::Device => "GPU",
        TierKind::Memory => "CPU_TIER1",
        TierKind::Disk => "DISK",
        TierKind::Remote | TierKind::Peer => "EXTERNAL",
    }
}

/// Encodes `batch` as vLLM's msgpack `KVEventBatch`, stamped with
/// `data_parallel_rank`.
pub fn encode_kv_event_batch(batch: &EventBatch, data_parallel_rank: i64) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + 32 * batch.events.len());
    // Writes into a Vec cannot fail: `ValueWriteError` only wraps the
    // writer's I/O error, and a Vec's `io::Write` never returns one.
    let _ = write_batch(&mut out, batch, data_parallel_rank);
    out
}

type Written = Result<(), encode::ValueWriteError>;

fn write_batch(out: &mut Vec<u8>, batch: &EventBatch, data_parallel_rank: i64) -> Written {
    encode::write_array_len(out, 3)?;
    encode::write_f64(out, batch.ts)?;
    encode::write_array_len(out, len32(batch.events.len()))?;
    for event in &batch.events {
        write_event(out, event)?;
    }
    encode::write_sint(out, data_parallel_rank)?;
    Ok(())
}

fn write_event(out: &mut Vec<u8>, event: &KvEvent) -> Written {
    match event {
        KvEvent::Stored(stored) => {
            encode::write_array_len(out, 8)?;
            encode::write_str(out, "BlockStored")?;
            write_hashes(out, &stored.block_hashes)?;
            match stored.parent_hash {
                Some(parent) => {
                    encode::write_uint(out, vllm_block_hash(parent))?;
                }
                None => write_nil(out)?,
            }
            let tokens = stored.token_ids.as_deref().unwrap_or(&[]);
            encode::write_array_len(out, len32(tokens.len()))?;
            for &token in tokens {
                encode::write_uint(out, u64::from(token))?;
            }
            encode::write_uint(out, u64::from(stored.block_size))?;
            write_nil(out)?; // lora_id
            encode::write_str(out, vllm_medium(stored.kind))?;
            write_nil(out)?; // lora_name
        }
        KvEvent::Removed(removed) => {
            encode::write_array_len(out, 3)?;
            encode::write_str(out, "BlockRemoved")?;
            write_hashes(out, &removed.block_hashes)?;
            encode::write_str(out, vllm_medium(removed.kind))?;
        }
        KvEvent::AllCleared { .. } => {
            // vLLM's AllBlocksCleared has no fields: the tier is not on the
            // wire, and a consumer clears everything it holds for this worker.
            encode::write_array_len(out, 1)?;
            encode::write_str(out, "AllBlocksCleared")?;
        }
    }
    Ok(())
}

fn write_nil(out: &mut Vec<u8>) -> Written {
    encode::write_nil(out).map_err(encode::ValueWriteError::InvalidMarkerWrite)
}

fn write_hashes(out: &mut Vec<u8>, hashes: &[BlockHash]) -> Written {
    encode::write_array_len(out, len32(hashes.len()))?;
    for &hash in hashes {
        encode::write_uint(out, vllm_block_hash(hash))?;
    }
    Ok(())
}

/// msgpack lengths are 32-bit; a batch never comes near that, but saturate
/// rather than wrap if one did (the decoder then fails loudly).
fn len32(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}
