//! Property tests of the codec: round trips, totality of the decoder on
//! arbitrary and corrupted bytes, truncation and the size limit.

mod samples;

use std::io::{self, Read};

use kvtier_core::{BlockHash, BlockSums, MAX_TIERS};
use kvtier_protocol::*;
use proptest::collection::vec;
use proptest::prelude::*;

fn key() -> impl Strategy<Value = BlockHash> {
    any::<u128>().prop_map(BlockHash)
}

fn keys_request() -> impl Strategy<Value = KeysRequest> {
    (any::<u64>(), vec(key(), 0..20))
        .prop_map(|(request_id, keys)| KeysRequest { request_id, keys })
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![".{0,24}", Just(String::new())]
}

fn version() -> impl Strategy<Value = ProtocolVersion> {
    any::<u16>().prop_map(|minor| ProtocolVersion {
        major: PROTOCOL_VERSION.major,
        minor,
    })
}

fn namespace() -> impl Strategy<Value = Namespace> {
    (
        text(),
        text(),
        any::<[u32; 4]>(),
        proptest::option::of(vec(any::<u8>(), 0..16)),
    )
        .prop_map(|(model, dtype, n, tenant_salt)| Namespace {
            model,
            dtype,
            layout_version: n[0],
            block_size_tokens: n[1],
            tp_rank: n[2],
            tp_size: n[3],
            tenant_salt,
        })
}

fn hello() -> impl Strategy<Value = Message> {
    (
        version(),
        namespace(),
        any::<(u32, u64, u64)>(),
        proptest::option::of(text()),
    )
        .prop_map(|(v, namespace, g, instance)| {
            Message::Hello(Hello {
                protocol_version: v,
                namespace,
                geometry: WireGeometry {
                    layers: g.0,
                    block_bytes: g.1,
                    layer_bytes: g.2,
                },
                instance,
            })
        })
}

/// A tier list as a node announces it: any subset of the positions, in
/// order, each of any kind.
fn tier_list() -> impl Strategy<Value = Vec<TierInfo>> {
    let kind = proptest::option::of(proptest::sample::select(TierKind::ALL.to_vec()));
    vec(kind, MAX_TIERS).prop_map(|kinds| {
        Tier::all()
            .zip(kinds)
            .filter_map(|(tier, kind)| Some(TierInfo { tier, kind: kind? }))
            .collect()
    })
}

fn hello_ok() -> impl Strategy<Value = Message> {
    (
        version(),
        any::<u64>(),
        text(),
        any::<(u64, u64)>(),
        any::<[u8; KEY_BYTES]>(),
        tier_list(),
    )
        .prop_map(|(v, session_id, shm_name, a, key, tiers)| {
            Message::HelloOk(HelloOk {
                protocol_version: v,
                session_id,
                shm_name,
                arena_len: a.0,
                slot_size: a.1,
                namespace_key: NamespaceKey::from_bytes(key),
                tiers,
            })
        })
}

fn error() -> impl Strategy<Value = Message> {
    (any::<u64>(), any::<u16>(), text()).prop_map(|(request_id, code, message)| {
        Message::Error(Error {
            request_id,
            code: ErrorCode(code),
            message,
        })
    })
}

fn slot() -> impl Strategy<Value = Slot> {
    any::<(u64, u64)>().prop_map(|(offset, len)| Slot { offset, len })
}

fn tier() -> impl Strategy<Value = Tier> {
    prop_oneof![
        Just(Tier::G1),
        Just(Tier::G2),
        Just(Tier::G3),
        Just(Tier::G4)
    ]
}

fn reserve_result() -> impl Strategy<Value = ReserveResult> {
    prop_oneof![
        slot().prop_map(ReserveResult::Slot),
        Just(ReserveResult::AlreadyStored),
        Just(ReserveResult::InFlightElsewhere),
        Just(ReserveResult::NoSpace),
    ]
}

fn commit_result() -> impl Strategy<Value = CommitResult> {
    prop_oneof![
        Just(CommitResult::Stored),
        Just(CommitResult::AlreadyStored),
        Just(CommitResult::NotReserved),
        Just(CommitResult::BadChecksum),
    ]
}

fn load_result() -> impl Strategy<Value = LoadResult> {
    prop_oneof![
        slot().prop_map(LoadResult::Arriving),
        Just(LoadResult::Miss),
        (slot(), any::<u64>(), vec(any::<u64>(), 0..8)).prop_map(|(s, block, layers)| {
            LoadResult::Resident(s, std::sync::Arc::new(BlockSums { block, layers }))
        }),
    ]
}

fn commit_entry() -> impl Strategy<Value = CommitEntry> {
    (key(), any::<u64>(), vec(any::<u64>(), 0..8)).prop_map(|(key, block, layers)| CommitEntry {
        key,
        sums: BlockSums { block, layers },
    })
}

fn replies() -> impl Strategy<Value = Message> {
    let id = any::<u64>();
    prop_oneof![
        (id, vec(tier(), 0..20))
            .prop_map(|(request_id, tiers)| Message::LookupOk(LookupOk { request_id, tiers })),
        (id, vec(reserve_result(), 0..20)).prop_map(|(request_id, results)| Message::ReserveOk(
            ReserveOk {
                request_id,
                results
            }
        )),
        (id, vec(commit_result(), 0..20)).prop_map(|(request_id, results)| Message::CommitOk(
            CommitOk {
                request_id,
                results
            }
        )),
        (id, vec(load_result(), 0..20)).prop_map(|(request_id, results)| Message::LoadOk(LoadOk {
            request_id,
            results
        })),
        (id, any::<u32>(), vec(any::<u64>(), 0..20)).prop_map(|(request_id, layer, sums)| {
            Message::LayerReady(LayerReady {
                request_id,
                layer,
                sums,
            })
        }),
        (id, vec((text(), any::<u64>()), 0..8)).prop_map(|(request_id, c)| Message::StatsOk(
            StatsOk {
                request_id,
                counters: c
                    .into_iter()
                    .map(|(name, value)| Counter { name, value })
                    .collect(),
            }
        )),
        id.prop_map(|request_id| Message::Ack(Ack { request_id })),
        any::<u64>().prop_map(|elapsed_ms| Message::Opening(Opening { elapsed_ms })),
    ]
}

fn requests() -> impl Strategy<Value = Message> {
    prop_oneof![
        keys_request().prop_map(Message::Lookup),
        keys_request().prop_map(Message::Reserve),
        (any::<u64>(), vec(commit_entry(), 0..8)).prop_map(
            |(request_id, entries)| Message::Commit(Commit {
                request_id,
                entries
            })
        ),
        keys_request().prop_map(Message::Abort),
        keys_request().prop_map(Message::Load),
        keys_request().prop_map(Message::Release),
        keys_request().prop_map(Message::Remove),
        any::<u64>().prop_map(|request_id| Message::Stats(Stats { request_id })),
    ]
}

/// Any message of the protocol.
fn message() -> impl Strategy<Value = Message> {
    prop_oneof![hello(), hello_ok(), error(), requests(), replies()]
}

/// The totality property: decoding either fails with a typed error or yields
/// a message whose encoding is exactly the bytes it consumed.
fn check_total(bytes: &[u8]) -> Result<(), TestCaseError> {
    if let Ok((msg, used)) = Message::decode(bytes) {
        prop_assert!(used <= bytes.len());
        prop_assert_eq!(msg.to_frame().unwrap(), &bytes[..used]);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_message_round_trips(msg in message()) {
        let frame = msg.to_frame().unwrap();
        prop_assert_eq!(Message::decode(&frame).unwrap(), (msg.clone(), frame.len()));
        let mut stream = Vec::new();
        write_frame(&mut stream, &msg).unwrap();
        prop_assert_eq!(read_frame(&mut stream.as_slice()).unwrap(), Some(msg));
    }

    #[test]
    fn arbitrary_bytes_decode_canonically_or_fail(bytes in vec(any::<u8>(), 0..256)) {
        check_total(&bytes)?;
        // The same through the stream reader: no panic, whatever the bytes.
        let _ = read_frame(&mut bytes.as_slice());
    }

    #[test]
    fn arbitrary_bodies_of_every_type_decode_canonically_or_fail(
        kind in prop_oneof![0x01u8..=0x03, 0x10u8..=0x1e],
        body in vec(any::<u8>(), 0..128),
    ) {
        let mut frame = ((body.len() + 1) as u32).to_le_bytes().to_vec();
        frame.push(kind);
        frame.extend(&body);
        check_total(&frame)?;
    }

    #[test]
    fn every_strict_prefix_is_truncated(msg in message()) {
        let frame = msg.to_frame().unwrap();
        for cut in 0..frame.len() {
            let err = Message::decode(&frame[..cut]).unwrap_err();
            prop_assert!(
                matches!(err, DecodeError::Truncated { needed } if needed > cut),
                "cut {} of {}: {:?}", cut, frame.len(), err
            );
        }
    }

    #[test]
    fn a_corrupted_length_or_type_byte_is_an_error_or_another_message(
        msg in message(),
        at in 0..LEN_BYTES + 1,
        byte in any::<u8>(),
    ) {
        let mut frame = msg.to_frame().unwrap();
        prop_assume!(frame[at] != byte);
        frame[at] = byte;
        check_total(&frame)?;
        if let Ok((other, _)) = Message::decode(&frame) {
            prop_assert_ne!(other, msg);
        }
    }

    #[test]
    fn any_corrupted_byte_never_panics(msg in message(), at in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let mut frame = msg.to_frame().unwrap();
        let at = at.index(frame.len());
        frame[at] = byte;
        check_total(&frame)?;
    }

    #[test]
    fn oversized_lengths_are_refused_without_reading_on(
        len in MAX_FRAME + 1..=u32::MAX,
        tail in vec(any::<u8>(), 0..64),
    ) {
        let mut frame = len.to_le_bytes().to_vec();
        frame.extend(&tail);
        prop_assert_eq!(Message::decode(&frame).unwrap_err(), DecodeError::Oversized { len, max: MAX_FRAME });
        let mut reader = Tracking { data: &frame, read: 0 };
        let err = read_frame(&mut reader).unwrap_err();
        prop_assert!(matches!(err, FrameError::Decode(DecodeError::Oversized { .. })), "{}", err);
        prop_assert_eq!(reader.read, LEN_BYTES);
    }
}

proptest! {
    /// A list naming a position twice or out of order is refused, however
    /// it is permuted: the list a client keeps is the node's order.
    #[test]
    fn a_tier_list_out_of_order_is_malformed(
        tiers in tier_list().prop_filter("two tiers at least", |t| t.len() >= 2),
        (i, j) in (0..MAX_TIERS, 0..MAX_TIERS),
    ) {
        let (i, j) = (i % tiers.len(), j % tiers.len());
        let mut bad = tiers.clone();
        if i == j {
            // A duplicate: entry i named twice, in place of its neighbour.
            let k = if i + 1 < bad.len() { i + 1 } else { i - 1 };
            bad[k] = bad[i];
        } else {
            bad.swap(i, j);
        }
        let Some(Message::HelloOk(mut ok)) = samples::all().into_iter().nth(1) else {
            panic!("the second sample is HelloOk");
        };
        ok.tiers = bad;
        let err = Message::from_frame(&Message::HelloOk(ok).to_frame().unwrap()).unwrap_err();
        prop_assert!(matches!(err, DecodeError::Malformed { message: "HelloOk", .. }), "{}", err);
    }
}

/// A reader over a slice that records how many bytes were taken.
struct Tracking<'a> {
    data: &'a [u8],
    read: usize,
}

impl Read for Tracking<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut rest: &[u8] = &self.data[self.read..];
        let n = rest.read(buf)?;
        self.read += n;
        Ok(n)
    }
}

#[test]
fn samples_cover_every_type() {
    // The example set is the seed of the proptests' coverage argument: one
    // message per type byte the decoder accepts.
    let mut kinds: Vec<u8> = samples::all().iter().map(Message::type_byte).collect();
    kinds.sort_unstable();
    let mut want: Vec<u8> = (0x01..=0x04).chain(0x10..=0x1e).collect();
    want.sort_unstable();
    assert_eq!(kinds, want);
}
