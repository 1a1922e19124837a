//! One sample of every message, shared by the example and property tests.

#![allow(dead_code)]

use kvtier_core::{BlockHash, BlockSums};
use kvtier_protocol::*;

/// A namespace as an engine would send it.
pub fn namespace() -> Namespace {
    Namespace {
        model: "meta-llama/Meta-Llama-3-8B".into(),
        dtype: "bf16".into(),
        layout_version: 1,
        block_size_tokens: 16,
        tp_rank: 1,
        tp_size: 2,
        tenant_salt: Some(b"tenant-a".to_vec()),
    }
}

fn keys(request_id: u64) -> KeysRequest {
    KeysRequest {
        request_id,
        keys: vec![
            BlockHash(1),
            BlockHash(u128::MAX),
            BlockHash(0x0123_4567_89ab_cdef),
        ],
    }
}

fn slot(i: u64) -> Slot {
    Slot {
        offset: i << 21,
        len: 2 << 20,
    }
}

/// The default node's tiers: the arena, the disk log, a remote store.
pub fn tier_list() -> Vec<TierInfo> {
    [
        (Tier::G2, TierKind::Memory),
        (Tier::G3, TierKind::Disk),
        (Tier::G4, TierKind::Remote),
    ]
    .map(|(tier, kind)| TierInfo { tier, kind })
    .to_vec()
}

/// One message of every type.
pub fn all() -> Vec<Message> {
    vec![
        Message::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            namespace: namespace(),
            geometry: WireGeometry {
                layers: 32,
                block_bytes: 2 << 20,
                layer_bytes: 64 << 10,
            },
            instance: Some("llama-prod".into()),
        }),
        Message::HelloOk(HelloOk {
            protocol_version: PROTOCOL_VERSION,
            session_id: 42,
            shm_name: "/dev/shm/kvtier".into(),
            arena_len: 1 << 30,
            slot_size: 2 << 20,
            namespace_key: NamespaceKey::from_bytes([0x5a; KEY_BYTES]),
            tiers: tier_list(),
        }),
        Message::Error(Error {
            request_id: 9,
            code: ErrorCode::GEOMETRY_MISMATCH,
            message: "layers 32 != 40".into(),
        }),
        Message::Lookup(keys(1)),
        Message::LookupOk(LookupOk {
            request_id: 1,
            tiers: vec![Tier::G2, Tier::G3],
        }),
        Message::Reserve(keys(2)),
        Message::ReserveOk(ReserveOk {
            request_id: 2,
            results: vec![
                ReserveResult::Slot(slot(3)),
                ReserveResult::AlreadyStored,
                ReserveResult::InFlightElsewhere,
                ReserveResult::NoSpace,
            ],
        }),
        Message::Commit(Commit {
            request_id: 3,
            entries: vec![CommitEntry {
                key: BlockHash(5),
                sums: BlockSums {
                    block: 0xdead_beef,
                    layers: vec![1, 2, 3],
                },
            }],
        }),
        Message::CommitOk(CommitOk {
            request_id: 3,
            results: vec![
                CommitResult::Stored,
                CommitResult::AlreadyStored,
                CommitResult::NotReserved,
                CommitResult::BadChecksum,
            ],
        }),
        Message::Abort(keys(4)),
        Message::Load(keys(5)),
        Message::LoadOk(LoadOk {
            request_id: 5,
            results: vec![
                LoadResult::Resident(
                    slot(6),
                    std::sync::Arc::new(BlockSums {
                        block: 0xfeed,
                        layers: vec![4, 5, 6],
                    }),
                ),
                LoadResult::Arriving(slot(7)),
                LoadResult::Miss,
            ],
        }),
        Message::LayerReady(LayerReady {
            request_id: 5,
            layer: 31,
            sums: vec![0x0123_4567_89ab_cdef],
        }),
        Message::Release(keys(6)),
        Message::Remove(keys(7)),
        Message::Stats(Stats { request_id: 8 }),
        Message::StatsOk(StatsOk {
            request_id: 8,
            counters: vec![Counter {
                name: "g2_blocks".into(),
                value: 12,
            }],
        }),
        Message::Ack(Ack { request_id: 4 }),
        Message::Opening(Opening { elapsed_ms: 2000 }),
    ]
}
