//! Bad bytes at `kvtier serve`'s node socket: malformed, truncated,
//! oversized and unknown frames, frames over the connection's limit before
//! and after `Hello`, over-long `Hello` strings, requests before `Hello`, a
//! second `Hello`, another major version, and a few hundred seeded random
//! byte strings. Each connection gets the `Error` the protocol names
//! (docs/node-protocol.md, sections 6 and 7) or is closed; the daemon stays
//! up, counts each bad frame once, changes nothing a bad connection asked
//! for, and a well-behaved client still stores and loads.

use std::io::{ErrorKind, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::Path;

use kvtier_client::{BlockHash, ErrorCode, StoreOutcome};
use kvtier_protocol::{
    Ack, DecodeError, Hello, KeysRequest, MAX_FRAME, Message, PROTOCOL_VERSION, ProtocolVersion,
    Stats as StatsRequest, WireGeometry,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use support::node::{
    Daemon, PATIENCE, Stats, TOKENS_PER_BLOCK, block, check_block, geometry, namespace, seed,
    shm_name, wait_until,
};

mod support;

/// The daemon's `manager.max_batch` in these tests.
const MAX_BATCH: usize = 16;
/// Random connections of the fuzz test.
const RANDOM_CASES: usize = 300;

fn start(data: &Path, tag: &str) -> Daemon {
    let max_batch = MAX_BATCH.to_string();
    Daemon::start(
        data,
        &shm_name(tag),
        &[("KVTIER_MANAGER__MAX_BATCH", max_batch.as_str())],
    )
}

/// Sends `bytes` on a fresh connection, half-closes it when `eof`, and
/// reads until the daemon closes it: every frame it answered. Panics if the
/// daemon neither closes the connection nor answers within [`PATIENCE`],
/// or sends bytes that are not whole frames.
fn exchange(socket: &Path, bytes: &[u8], eof: bool) -> Vec<Message> {
    let mut stream = UnixStream::connect(socket).expect("connect");
    stream
        .set_read_timeout(Some(PATIENCE))
        .expect("read timeout");
    // The daemon may close the connection before reading everything (after
    // an error): the rest of the bytes then has nowhere to go.
    if let Err(e) = stream.write_all(bytes) {
        assert!(gone(&e), "sending: {e}");
    }
    if eof && let Err(e) = stream.shutdown(Shutdown::Write) {
        assert!(
            gone(&e) || e.kind() == ErrorKind::NotConnected,
            "half-closing: {e}"
        );
    }
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) if gone(&e) => break,
            Err(e) => panic!("the daemon neither answered nor closed the connection: {e}"),
        }
    }
    frames(&answer)
}

/// Whether an I/O error means the daemon closed the connection.
fn gone(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset)
}

/// The frames of `bytes`, which must be whole frames only.
fn frames(mut bytes: &[u8]) -> Vec<Message> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let (msg, used) = Message::decode(bytes).expect("the daemon's answer decodes");
        out.push(msg);
        bytes = &bytes[used..];
    }
    out
}

fn frame(msg: &Message) -> Vec<u8> {
    msg.to_frame().expect("encode")
}

fn hello_with(version: ProtocolVersion, geometry: WireGeometry) -> Message {
    Message::Hello(Hello {
        protocol_version: version,
        namespace: namespace(),
        geometry,
        instance: None,
    })
}

fn hello() -> Vec<u8> {
    frame(&hello_with(
        PROTOCOL_VERSION,
        WireGeometry::from(&geometry()),
    ))
}

fn lookup(request_id: u64, keys: u128) -> Vec<u8> {
    frame(&Message::Lookup(KeysRequest {
        request_id,
        keys: (0..keys).map(BlockHash).collect(),
    }))
}

fn join(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// What the daemon must answer on a connection.
#[derive(Debug, Clone, Copy)]
enum Answer {
    /// Nothing: it closes the connection.
    Closed,
    /// `Error` with this code, then it closes.
    Refused(ErrorCode),
    /// `HelloOk`, then it closes.
    Greeted,
    /// `HelloOk`, then `Error` with this code, then it closes.
    GreetedThenRefused(ErrorCode),
}

/// One bad connection: what is sent, whether the client then half-closes,
/// what the daemon must answer, and whether it counts a bad frame.
struct Case {
    name: &'static str,
    bytes: Vec<u8>,
    eof: bool,
    answer: Answer,
    bad_frame: bool,
}

fn case(name: &'static str, bytes: Vec<u8>, eof: bool, answer: Answer, bad_frame: bool) -> Case {
    Case {
        name,
        bytes,
        eof,
        answer,
        bad_frame,
    }
}

/// Every targeted case. Cases without `eof` prove that the daemon judges
/// the frame and closes on its own, without waiting for more bytes.
fn cases() -> Vec<Case> {
    use Answer::*;
    let bad = ErrorCode::BAD_FRAME;
    let handshake = ErrorCode::HANDSHAKE;
    let wire = WireGeometry::from(&geometry());
    let oversized = (MAX_FRAME + 1).to_le_bytes().to_vec();
    let unknown_type = vec![1, 0, 0, 0, 0xee];
    // A count of 1000 keys in a body that holds one.
    let mut short_list = lookup(1, 1);
    short_list[13..17].copy_from_slice(&1000u32.to_le_bytes());
    // Three bytes after a whole body, inside the frame.
    let mut trailing = lookup(1, 1);
    trailing.extend_from_slice(&[1, 2, 3]);
    let len = (trailing.len() - 4) as u32;
    trailing[..4].copy_from_slice(&len.to_le_bytes());
    // The tenant salt's option tag (just before the 20-byte geometry and
    // the 1-byte tag of an absent instance) set to neither 0 nor 1.
    let mut bad_tag = hello();
    let tag = bad_tag.len() - 22;
    bad_tag[tag] = 7;
    let mut other_shape = wire;
    other_shape.block_bytes *= 2;
    other_shape.layer_bytes *= 2;
    let major = |major| frame(&hello_with(ProtocolVersion { major, minor: 0 }, wire));
    // Past what the connection may send, below MAX_FRAME.
    let over_hello = (kvtier_node::HELLO_FRAME_MAX as u32).to_le_bytes().to_vec();
    let over_batch = (request_limit() as u32).to_le_bytes().to_vec();
    let mut long_model = namespace();
    long_model.model = "m".repeat(kvtier_node::HELLO_STRING_MAX + 1);
    let long_hello = frame(&Message::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        namespace: long_model,
        geometry: wire,
        instance: None,
    }));
    let stats = frame(&Message::Stats(StatsRequest { request_id: 1 }));
    vec![
        case("zero length", vec![0; 4], false, Refused(bad), true),
        case(
            "unknown type",
            unknown_type.clone(),
            false,
            Refused(bad),
            true,
        ),
        case("oversized", oversized.clone(), false, Refused(bad), true),
        case("u32::MAX length", vec![0xff; 4], false, Refused(bad), true),
        case(
            "over the Hello limit",
            over_hello,
            false,
            Refused(bad),
            true,
        ),
        case(
            "over the request limit after Hello",
            join(&[&hello(), &over_batch]),
            false,
            GreetedThenRefused(bad),
            true,
        ),
        case(
            "an over-long Hello string",
            long_hello,
            false,
            Refused(handshake),
            false,
        ),
        case("count past the body", short_list, false, Refused(bad), true),
        case("trailing bytes", trailing, false, Refused(bad), true),
        case("bad option tag", bad_tag, false, Refused(bad), true),
        case(
            "truncated Hello",
            hello()[..10].to_vec(),
            true,
            Closed,
            false,
        ),
        case(
            "Lookup before Hello",
            lookup(1, 2),
            false,
            Refused(handshake),
            false,
        ),
        case(
            "Stats before Hello",
            stats,
            false,
            Refused(handshake),
            false,
        ),
        case(
            "second Hello",
            join(&[&hello(), &hello()]),
            false,
            GreetedThenRefused(handshake),
            false,
        ),
        case(
            "the next major",
            major(PROTOCOL_VERSION.major + 1),
            false,
            Refused(ErrorCode::WRONG_VERSION),
            true,
        ),
        case(
            "the previous major",
            major(PROTOCOL_VERSION.major - 1),
            false,
            Refused(ErrorCode::WRONG_VERSION),
            true,
        ),
        case(
            "major 0",
            major(0),
            false,
            Refused(ErrorCode::WRONG_VERSION),
            true,
        ),
        case(
            "another geometry",
            frame(&hello_with(PROTOCOL_VERSION, other_shape)),
            false,
            Refused(ErrorCode::GEOMETRY_MISMATCH),
            false,
        ),
        case(
            "unknown type after Hello",
            join(&[&hello(), &unknown_type]),
            false,
            GreetedThenRefused(bad),
            true,
        ),
        case(
            "oversized after Hello",
            join(&[&hello(), &oversized]),
            false,
            GreetedThenRefused(bad),
            true,
        ),
        case(
            "truncated Lookup after Hello",
            join(&[&hello(), &lookup(1, 3)[..20]]),
            true,
            Greeted,
            false,
        ),
    ]
}

/// Checks the daemon's answer to one case.
fn check(case: &Case, got: &[Message]) {
    let name = case.name;
    let refused = |m: &Message, code: ErrorCode| matches!(m, Message::Error(e) if e.code == code && e.request_id == 0);
    let ok = match (case.answer, got) {
        (Answer::Closed, []) => true,
        (Answer::Refused(code), [e]) => refused(e, code),
        (Answer::Greeted, [Message::HelloOk(_)]) => true,
        (Answer::GreetedThenRefused(code), [Message::HelloOk(_), e]) => refused(e, code),
        _ => false,
    };
    assert!(ok, "{name}: expected {:?}, got {got:?}", case.answer);
}

#[test]
fn each_bad_frame_gets_its_error_or_a_close_and_changes_nothing() {
    let data = tempfile::tempdir().expect("data dir");
    let daemon = start(data.path(), "frames");
    let mut client = daemon.client();
    let before = Stats::of(&mut client);
    let cases = cases();
    for case in &cases {
        let got = exchange(&daemon.socket(), &case.bytes, case.eof);
        check(case, &got);
    }
    // Kept open: a reply type is UNEXPECTED, a batch over max_batch is
    // BAD_REQUEST, and the same connection still serves.
    let kept = join(&[
        &hello(),
        &frame(&Message::Ack(Ack { request_id: 1 })),
        &lookup(2, MAX_BATCH as u128 + 1),
        &frame(&Message::Stats(StatsRequest { request_id: 3 })),
    ]);
    let got = exchange(&daemon.socket(), &kept, true);
    assert!(
        matches!(
            &got[..],
            [
                Message::HelloOk(_),
                Message::Error(unexpected),
                Message::Error(too_many),
                Message::StatsOk(stats),
            ] if unexpected.code == ErrorCode::UNEXPECTED
                && too_many.code == ErrorCode::BAD_REQUEST
                && too_many.request_id == 2
                && stats.request_id == 3
        ),
        "{got:?}"
    );

    let bad_frames = cases.iter().filter(|c| c.bad_frame).count() as u64;
    let after = settled(&mut client);
    assert_eq!(
        after.get("bad_frames") - before.get("bad_frames"),
        bad_frames
    );
    assert_eq!(
        after.get("handshake_refusals") - before.get("handshake_refusals"),
        2
    );
    unchanged(&before, &after);
    still_serves(&mut client);
}

/// The daemon's counters once only `client`'s session is open.
fn settled(client: &mut kvtier_client::Client) -> Stats {
    wait_until("the bad connections to end", || {
        let s = Stats::of(client);
        (s.get("sessions_open") == 1).then_some(s)
    })
}

/// Nothing was reserved, committed or stored by the bad connections.
fn unchanged(before: &Stats, after: &Stats) {
    for name in ["reserved", "committed", "aborted", "blocks_g2", "blocks_g3"] {
        assert_eq!(after.get(name), before.get(name), "{name} changed");
    }
}

/// A well-behaved client stores and loads.
fn still_serves(client: &mut kvtier_client::Client) {
    let key = 424_242;
    let bytes = block(key);
    let outcome = client.store(&[(BlockHash(key), &bytes)]).expect("store");
    assert_eq!(outcome, vec![StoreOutcome::Stored]);
    assert!(check_block(client, key), "block {key} not readable");
}

/// How the daemon ends a connection, as the connection rules say.
#[derive(Debug, Clone, Copy, PartialEq)]
enum End {
    /// It closes when the client does (the bytes ended between frames or
    /// inside one).
    Eof,
    /// It answers `Error` with this code and closes.
    Refused(ErrorCode),
}

/// The daemon's connection rules applied to `sent` (docs/node-protocol.md
/// section 7): how the connection ends and whether that counts a bad
/// frame. Frames are decoded with the protocol crate, as the daemon does.
fn model(mut sent: &[u8]) -> (End, bool) {
    let mut greeted = false;
    loop {
        let limit = if greeted {
            request_limit()
        } else {
            kvtier_node::HELLO_FRAME_MAX
        };
        if let Some(prefix) = sent.first_chunk::<4>() {
            let len = 4 + u32::from_le_bytes(*prefix) as usize;
            if len > limit && len <= 4 + MAX_FRAME as usize {
                return (End::Refused(ErrorCode::BAD_FRAME), true);
            }
        }
        let msg = match Message::decode(sent) {
            Ok((msg, used)) => {
                sent = &sent[used..];
                msg
            }
            Err(DecodeError::Truncated { .. }) => return (End::Eof, false),
            Err(DecodeError::WrongVersion { .. }) => {
                return (End::Refused(ErrorCode::WRONG_VERSION), true);
            }
            Err(_) => return (End::Refused(ErrorCode::BAD_FRAME), true),
        };
        match (msg, greeted) {
            (Message::Hello(h), false) if !short_strings(&h) => {
                return (End::Refused(ErrorCode::HANDSHAKE), false);
            }
            (Message::Hello(h), false) if acceptable(&h) => greeted = true,
            (Message::Hello(_), false) => {
                return (End::Refused(ErrorCode::GEOMETRY_MISMATCH), false);
            }
            (_, false) | (Message::Hello(_), true) => {
                return (End::Refused(ErrorCode::HANDSHAKE), false);
            }
            // Served, or refused with the connection kept.
            (_, true) => {}
        }
    }
}

/// The largest frame after `Hello`: a request of `MAX_BATCH` keys.
fn request_limit() -> usize {
    kvtier_node::request_frame_limit(MAX_BATCH, geometry().layers)
}

/// Whether every string of this `Hello` is within the daemon's cap.
fn short_strings(h: &Hello) -> bool {
    let ns = &h.namespace;
    let max = kvtier_node::HELLO_STRING_MAX;
    ns.model.len() <= max
        && ns.dtype.len() <= max
        && ns.tenant_salt.as_ref().is_none_or(|s| s.len() <= max)
        && h.instance.as_ref().is_none_or(|s| s.len() <= max)
}

/// Whether the daemon accepts this `Hello`.
fn acceptable(h: &Hello) -> bool {
    let ns = &h.namespace;
    h.geometry == WireGeometry::from(&geometry())
        && ns.block_size_tokens == TOKENS_PER_BLOCK
        && ns.tp_size > 0
        && ns.tp_rank < ns.tp_size
}

/// A random byte string: sometimes a good `Hello` first, then one to three
/// pieces, each raw random bytes, a frame of a random type byte with a
/// random body, or a good frame cut short or with one byte changed.
fn random_bytes(rng: &mut StdRng) -> Vec<u8> {
    let mut out = if rng.random_bool(0.5) {
        hello()
    } else {
        Vec::new()
    };
    for _ in 0..rng.random_range(1..=3) {
        let piece = match rng.random_range(0..4) {
            0 => random_vec(rng, 0..24),
            1 => {
                let body = random_vec(rng, 0..40);
                let mut f = ((body.len() + 1) as u32).to_le_bytes().to_vec();
                f.push(rng.random_range(0..=0x20));
                f.extend_from_slice(&body);
                f
            }
            2 => {
                let good = if rng.random_bool(0.5) {
                    hello()
                } else {
                    lookup(7, 2)
                };
                good[..rng.random_range(0..good.len())].to_vec()
            }
            _ => {
                let mut good = if rng.random_bool(0.5) {
                    hello()
                } else {
                    lookup(7, 2)
                };
                let at = rng.random_range(0..good.len());
                good[at] ^= rng.random_range(1..=255u8);
                good
            }
        };
        out.extend_from_slice(&piece);
    }
    out
}

fn random_vec(rng: &mut StdRng, len: std::ops::Range<usize>) -> Vec<u8> {
    let n = rng.random_range(len);
    (0..n).map(|_| rng.random()).collect()
}

#[test]
fn random_byte_strings_end_as_the_connection_rules_say() {
    let data = tempfile::tempdir().expect("data dir");
    let daemon = start(data.path(), "fuzz");
    let mut client = daemon.client();
    let before = Stats::of(&mut client);
    let mut rng = StdRng::seed_from_u64(seed());
    let mut bad_frames = 0;
    let mut refusals = 0;
    let mut ends: std::collections::BTreeMap<String, usize> = Default::default();
    for i in 0..RANDOM_CASES {
        let bytes = random_bytes(&mut rng);
        let (end, bad) = model(&bytes);
        *ends.entry(format!("{end:?}")).or_default() += 1;
        bad_frames += u64::from(bad);
        refusals += u64::from(end == End::Refused(ErrorCode::GEOMETRY_MISMATCH));
        let got = exchange(&daemon.socket(), &bytes, true);
        let last = got.last();
        let ok = match end {
            End::Refused(code) => {
                matches!(last, Some(Message::Error(e)) if e.code == code && e.request_id == 0)
            }
            // A connection the daemon keeps never ends with an error that
            // closes it.
            End::Eof => !matches!(last, Some(Message::Error(e)) if e.code.0 <= 4),
        };
        assert!(
            ok,
            "case {i}: sent {bytes:02x?}\nexpected {end:?}, got {got:?}"
        );
        if bytes.starts_with(&hello()) {
            assert!(
                matches!(got.first(), Some(Message::HelloOk(_))),
                "case {i}: {got:?}"
            );
        }
    }
    // What the cases exercised, for whoever reads the test's output.
    eprintln!("connection ends: {ends:?}");
    let after = settled(&mut client);
    assert_eq!(
        after.get("bad_frames") - before.get("bad_frames"),
        bad_frames
    );
    assert_eq!(
        after.get("handshake_refusals") - before.get("handshake_refusals"),
        refusals
    );
    unchanged(&before, &after);
    still_serves(&mut client);
}
