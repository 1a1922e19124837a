//! Example tests: every message round-trips, byte layouts are pinned, and
//! every decoding failure is the typed error the docs promise.

mod samples;

use std::collections::HashSet;
use std::io::{self, Cursor, Read};

use kvtier_core::{BlockHash, MAX_TIERS, ModelPreset};
use kvtier_protocol::*;

#[test]
fn every_message_round_trips() {
    for msg in samples::all() {
        let frame = msg.to_frame().unwrap();
        assert_eq!(Message::from_frame(&frame).unwrap(), msg, "{}", msg.name());
        assert_eq!(frame[4], msg.type_byte());
        let len = u32::from_le_bytes(frame[..4].try_into().unwrap()) as usize;
        assert_eq!(len + LEN_BYTES, frame.len());
    }
}

#[test]
fn type_bytes_are_distinct() {
    let all = samples::all();
    let codes: HashSet<u8> = all.iter().map(Message::type_byte).collect();
    assert_eq!(codes.len(), all.len());
}

#[test]
fn frames_stream_through_read_and_write() {
    let mut stream = Vec::new();
    for msg in samples::all() {
        write_frame(&mut stream, &msg).unwrap();
    }
    let mut cursor = Cursor::new(stream);
    for msg in samples::all() {
        assert_eq!(read_frame(&mut cursor).unwrap(), Some(msg));
    }
    assert!(read_frame(&mut cursor).unwrap().is_none(), "clean EOF");
}

#[test]
fn decode_leaves_the_next_frame() {
    let all = samples::all();
    let mut buf = Vec::new();
    for msg in &all {
        msg.encode(&mut buf).unwrap();
    }
    let mut at = 0;
    for msg in &all {
        let (got, used) = Message::decode(&buf[at..]).unwrap();
        assert_eq!(&got, msg);
        at += used;
    }
    assert_eq!(at, buf.len());
}

#[test]
fn lookup_layout_is_pinned() {
    let msg = Message::Lookup(KeysRequest {
        request_id: 0x0102,
        keys: vec![BlockHash(0xaa)],
    });
    let mut want = vec![
        29, 0, 0, 0, 0x10, 0x02, 0x01, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0xaa,
    ];
    want.extend([0; 15]);
    assert_eq!(msg.to_frame().unwrap(), want);
}

#[test]
fn hello_starts_with_the_version() {
    let frame = samples::all()[0].to_frame().unwrap();
    assert_eq!(frame[4], 0x01);
    assert_eq!(&frame[5..9], &[4, 0, 2, 0], "major 4, minor 2");
}

/// 3.0 and later always carry `instance` at the end of `Hello` (2.0 had none, 2.1
/// had it only when announcing minor 1): a Hello without it is malformed.
#[test]
fn hello_always_carries_the_instance() {
    let Message::Hello(mut hello) = samples::all()[0].clone() else {
        panic!("not a hello");
    };
    hello.instance = None;
    let frame = Message::Hello(hello.clone()).to_frame().unwrap();
    assert_eq!(Message::from_frame(&frame).unwrap(), Message::Hello(hello));
    // Drop the absent option's tag: the body ends inside a field.
    let mut cut = frame[..frame.len() - 1].to_vec();
    let len = u32::from_le_bytes(cut[..4].try_into().unwrap()) - 1;
    cut[..4].copy_from_slice(&len.to_le_bytes());
    let err = Message::from_frame(&cut).unwrap_err();
    assert!(matches!(err, DecodeError::Malformed { .. }), "{err}");
}

fn with_version(frame: &[u8], major: u16, minor: u16) -> Vec<u8> {
    let mut f = frame.to_vec();
    f[5..7].copy_from_slice(&major.to_le_bytes());
    f[7..9].copy_from_slice(&minor.to_le_bytes());
    f
}

#[test]
fn another_major_is_a_version_error_for_both_handshake_messages() {
    for msg in &samples::all()[..2] {
        let frame = with_version(&msg.to_frame().unwrap(), 2, 1);
        let err = Message::from_frame(&frame).unwrap_err();
        assert!(
            matches!(err, DecodeError::WrongVersion { got, .. } if got.major == 2),
            "{err}"
        );
    }
}

#[test]
fn a_newer_major_is_refused_whatever_its_body() {
    // A version-5 hello may have any layout after the version.
    let frame = [5, 0, 0, 0, 0x01, 5, 0, 9, 9];
    assert!(matches!(
        Message::from_frame(&frame),
        Err(DecodeError::WrongVersion { .. })
    ));
}

#[test]
fn another_minor_is_accepted() {
    let major = PROTOCOL_VERSION.major;
    let frame = with_version(&samples::all()[0].to_frame().unwrap(), major, 7);
    let Message::Hello(hello) = Message::from_frame(&frame).unwrap() else {
        panic!("not a hello");
    };
    assert_eq!(hello.protocol_version, ProtocolVersion { major, minor: 7 });
}

#[test]
fn oversized_length_is_refused_from_the_prefix_alone() {
    let len = MAX_FRAME + 1;
    let err = Message::decode(&len.to_le_bytes()).unwrap_err();
    assert_eq!(
        err,
        DecodeError::Oversized {
            len,
            max: MAX_FRAME
        }
    );
    let err = Message::decode(&u32::MAX.to_le_bytes()).unwrap_err();
    assert!(matches!(err, DecodeError::Oversized { .. }));
}

/// A reader that counts the bytes handed out and has endless data.
struct Counting(usize);

impl Read for Counting {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        buf.fill(0xff);
        self.0 += buf.len();
        Ok(buf.len())
    }
}

#[test]
fn read_frame_refuses_oversized_before_reading_the_body() {
    let mut r = Counting(0);
    let err = read_frame(&mut r).unwrap_err();
    assert!(
        matches!(err, FrameError::Decode(DecodeError::Oversized { .. })),
        "{err}"
    );
    assert_eq!(r.0, LEN_BYTES, "only the prefix was read");
}

#[test]
fn read_frame_reports_a_stream_cut_inside_a_frame() {
    let frame = samples::all()[3].to_frame().unwrap();
    for cut in 1..frame.len() {
        let err = read_frame(&mut Cursor::new(&frame[..cut])).unwrap_err();
        assert!(
            matches!(&err, FrameError::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof),
            "cut {cut}: {err}"
        );
    }
}

#[test]
fn zero_length_is_malformed() {
    assert!(matches!(
        Message::decode(&[0, 0, 0, 0]),
        Err(DecodeError::Malformed { .. })
    ));
}

#[test]
fn unknown_types_are_refused() {
    for kind in [0x00, 0x05, 0x0f, 0x1f, 0xff] {
        assert_eq!(
            Message::decode(&[1, 0, 0, 0, kind]).unwrap_err(),
            DecodeError::UnknownType(kind)
        );
    }
}

#[test]
fn bytes_left_in_a_body_are_trailing() {
    let mut frame = Message::Ack(Ack { request_id: 1 }).to_frame().unwrap();
    frame.push(0);
    frame[0] += 1;
    assert_eq!(
        Message::decode(&frame).unwrap_err(),
        DecodeError::TrailingBytes {
            message: "Ack",
            count: 1
        }
    );
}

#[test]
fn bytes_after_the_frame_are_trailing_for_from_frame_only() {
    let mut frame = Message::Ack(Ack { request_id: 1 }).to_frame().unwrap();
    let len = frame.len();
    frame.extend([1, 2]);
    assert_eq!(Message::decode(&frame).unwrap().1, len);
    assert!(matches!(
        Message::from_frame(&frame),
        Err(DecodeError::TrailingBytes { count: 2, .. })
    ));
}

#[test]
fn a_count_past_the_body_is_malformed_without_allocating() {
    // Lookup claiming u32::MAX keys in a 12-byte body.
    let mut frame = vec![13, 0, 0, 0, 0x10];
    frame.extend([0; 8]);
    frame.extend(u32::MAX.to_le_bytes());
    assert!(matches!(
        Message::from_frame(&frame),
        Err(DecodeError::Malformed {
            message: "Lookup",
            ..
        })
    ));
}

fn corrupt(msg: &Message, at: usize, byte: u8) -> Result<Message, DecodeError> {
    let mut frame = msg.to_frame().unwrap();
    frame[at] = byte;
    Message::from_frame(&frame)
}

#[test]
fn bad_tags_and_strings_are_malformed() {
    let all = samples::all();
    // Hello: version 4 bytes, then model string (length 4 + bytes).
    let bad_utf8 = corrupt(&all[0], 5 + 4 + 4, 0xff);
    // LookupOk: request id 8, count 4, then the first tier code.
    let bad_tier = corrupt(&all[4], 5 + 8 + 4, 9);
    // LoadOk: request id 8, count 4, then the first result's tag.
    let bad_tag = corrupt(&all[11], 5 + 8 + 4, 3);
    for err in [bad_utf8, bad_tier, bad_tag] {
        assert!(matches!(err, Err(DecodeError::Malformed { .. })), "{err:?}");
    }
}

#[test]
fn a_present_option_tag_other_than_one_is_malformed() {
    let hello = &samples::all()[0];
    let frame = hello.to_frame().unwrap();
    // The tenant salt ends the namespace; the 20-byte geometry and the
    // instance (tag, length, name) follow it.
    let salt_len = 4 + b"tenant-a".len();
    let instance_len = 1 + 4 + b"llama-prod".len();
    let tag_at = frame.len() - instance_len - 20 - salt_len - 1;
    assert_eq!(frame[tag_at], 1);
    assert!(matches!(
        corrupt(hello, tag_at, 2),
        Err(DecodeError::Malformed { .. })
    ));
}

#[test]
fn a_batch_past_max_frame_is_refused_and_leaves_the_buffer() {
    let n = (MAX_FRAME as usize) / 16 + 1;
    let msg = Message::Remove(KeysRequest {
        request_id: 1,
        keys: vec![BlockHash(0); n],
    });
    let mut out = vec![7];
    assert!(matches!(
        msg.encode(&mut out),
        Err(EncodeError::TooLarge { .. })
    ));
    assert_eq!(out, vec![7]);
    assert!(matches!(
        write_frame(&mut Vec::new(), &msg),
        Err(FrameError::Encode(_))
    ));
}

#[test]
fn the_largest_batch_that_fits_round_trips() {
    let n = (MAX_FRAME as usize - 1 - 8 - 4) / 16;
    let msg = Message::Lookup(KeysRequest {
        request_id: 1,
        keys: (0..n as u128).map(BlockHash).collect(),
    });
    let frame = msg.to_frame().unwrap();
    assert!(frame.len() - LEN_BYTES <= MAX_FRAME as usize);
    assert_eq!(Message::from_frame(&frame).unwrap(), msg);
}

#[test]
fn geometry_comes_from_kvtier_core() {
    let g = ModelPreset::Llama3_8B.geometry(16);
    let w = WireGeometry::from(&g);
    assert_eq!(w.layers, g.layers);
    assert_eq!(w.block_bytes, 2 << 20);
    assert_eq!(w.layer_bytes * u64::from(w.layers), w.block_bytes);
}

#[test]
fn lookup_prefix_len_is_the_tier_count() {
    let ok = LookupOk {
        request_id: 1,
        tiers: vec![Tier::G2, Tier::G4],
    };
    assert_eq!(ok.prefix_len(), 2);
}

/// The wire's tier is kvtier-core's `Tier` (one type for the block manager,
/// the wire and the Python binding): a position in the node's tier list,
/// whose byte is the position plus one, 1 = G1 ... 8 = G8
/// (docs/node-protocol.md); 0 and 9 are no tier.
#[test]
fn tier_codes_are_pinned_on_core_tier() {
    let tiers: Vec<kvtier_core::Tier> = kvtier_core::Tier::all().collect();
    let ok = Message::LookupOk(LookupOk {
        request_id: 7,
        tiers,
    });
    let frame = ok.to_frame().unwrap();
    // Length 4, type 1, request id 8, count 8, then one code per tier.
    assert_eq!(frame[5 + 8..5 + 8 + 4], [8, 0, 0, 0]);
    assert_eq!(frame[5 + 8 + 4..], [1, 2, 3, 4, 5, 6, 7, 8]);
    for code in [0, 9] {
        let err = corrupt(&ok, 5 + 8 + 4, code);
        assert!(matches!(err, Err(DecodeError::Malformed { .. })), "{err:?}");
    }
}

/// The sample `HelloOk` with `tiers` in place of its list.
fn hello_ok_with(tiers: Vec<TierInfo>) -> Message {
    let Some(Message::HelloOk(mut ok)) = samples::all().into_iter().nth(1) else {
        panic!("the second sample is HelloOk");
    };
    ok.tiers = tiers;
    Message::HelloOk(ok)
}

/// `HelloOk` ends with the node's tier list (4.0): a count, then per tier
/// its byte (position + 1) and its kind's code (1 = device, 2 = memory,
/// 3 = disk, 4 = remote, 5 = peer since 4.1).
#[test]
fn hello_ok_ends_with_the_tier_list() {
    let frame = samples::all()[1].to_frame().unwrap();
    assert_eq!(frame[frame.len() - 10..], [3, 0, 0, 0, 2, 2, 3, 3, 4, 4]);
    let device = TierInfo {
        tier: Tier::G1,
        kind: TierKind::Device,
    };
    let frame = hello_ok_with(vec![device]).to_frame().unwrap();
    assert_eq!(frame[frame.len() - 2..], [1, 1]);
    let peer = TierInfo {
        tier: Tier::at(4).unwrap(),
        kind: TierKind::Peer,
    };
    let frame = hello_ok_with(vec![peer]).to_frame().unwrap();
    assert_eq!(frame[frame.len() - 2..], [5, 5]);
    // An empty list is a list.
    let empty = hello_ok_with(Vec::new());
    assert_eq!(
        Message::from_frame(&empty.to_frame().unwrap()).unwrap(),
        empty
    );
}

#[test]
fn unknown_tier_kinds_and_positions_are_malformed() {
    let ok = &samples::all()[1];
    let len = ok.to_frame().unwrap().len();
    // The last entry's kind byte, then its tier byte.
    for (at, code) in [(len - 1, 0), (len - 1, 6), (len - 2, 0), (len - 2, 9)] {
        let err = corrupt(ok, at, code);
        assert!(
            matches!(
                err,
                Err(DecodeError::Malformed {
                    message: "HelloOk",
                    ..
                })
            ),
            "byte {at} = {code}: {err:?}"
        );
    }
}

#[test]
fn a_tier_list_out_of_order_or_too_long_is_malformed() {
    let [g2, g3, g4] = samples::tier_list()[..] else {
        panic!("three tiers");
    };
    let same_position = TierInfo {
        kind: TierKind::Disk,
        ..g2
    };
    for bad in [
        vec![g3, g2],
        vec![g2, g4, g3],
        vec![g2, g2],
        vec![g2, same_position],
    ] {
        let err = Message::from_frame(&hello_ok_with(bad.clone()).to_frame().unwrap());
        assert!(
            matches!(
                err,
                Err(DecodeError::Malformed {
                    message: "HelloOk",
                    ..
                })
            ),
            "{bad:?}: {err:?}"
        );
    }
    // Nine entries (one position twice, whatever the order) is past MAX_TIERS.
    let mut nine: Vec<TierInfo> = Tier::all()
        .map(|tier| TierInfo {
            tier,
            kind: TierKind::Remote,
        })
        .collect();
    nine.push(nine[MAX_TIERS - 1]);
    assert_eq!(nine.len(), MAX_TIERS + 1);
    let err = Message::from_frame(&hello_ok_with(nine).to_frame().unwrap());
    assert!(matches!(err, Err(DecodeError::Malformed { .. })), "{err:?}");
    // All eight, in order, is the longest list.
    let all = hello_ok_with(
        Tier::all()
            .map(|tier| TierInfo {
                tier,
                kind: TierKind::Memory,
            })
            .collect(),
    );
    assert_eq!(Message::from_frame(&all.to_frame().unwrap()).unwrap(), all);
}

#[test]
fn errors_render_their_detail() {
    let err = DecodeError::WrongVersion {
        got: ProtocolVersion { major: 5, minor: 1 },
        supported: PROTOCOL_VERSION,
    };
    assert_eq!(
        err.to_string(),
        "protocol version 5.1 is not supported (this side speaks 4.2)"
    );
}

/// A reader that yields a valid prefix declaring `MAX_FRAME` and then ends.
#[test]
fn a_large_declared_frame_that_never_arrives_is_an_eof() {
    let prefix = MAX_FRAME.to_le_bytes();
    let mut data: &[u8] = &[prefix[0], prefix[1], prefix[2], prefix[3], 0x10, 0, 0];
    let err = read_frame(&mut data).unwrap_err();
    assert!(
        matches!(&err, FrameError::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof),
        "{err}"
    );
}

#[test]
fn a_frame_larger_than_one_read_chunk_streams() {
    // 10k keys: 160 KiB, more than the 64 KiB first chunk of read_frame.
    let msg = Message::Load(KeysRequest {
        request_id: 3,
        keys: (0..10_000u128).map(BlockHash).collect(),
    });
    let frame = msg.to_frame().unwrap();
    assert_eq!(read_frame(&mut frame.as_slice()).unwrap(), Some(msg));
}
