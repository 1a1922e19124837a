//! The vLLM-format ZMQ sink: the msgpack layout of `KVEventBatch`, the
//! `[topic, seq, payload]` multipart message as a ZMQ SUB socket receives
//! it, and (when `python3` with `msgspec` and `pyzmq` is installed) vLLM's
//! own msgspec classes decoding what we publish.

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use kvtier_core::{BlockHash, TierKind};
use kvtier_events::{ZmqSink, ZmqSinkConfig};
use kvtier_manager::Tier;
use kvtier_manager::events::vllm::{encode_kv_event_batch, vllm_block_hash, vllm_medium};
use kvtier_manager::events::{
    BlockLocation, BlockRemoved, BlockStored, EventBatch, EventPublisher, EventSink, KvEvent,
    PublisherConfig,
};
use rmpv::Value;
use zeromq::{Socket, SocketRecv, SubSocket};

/// A 128-bit hash whose high half must not reach the wire.
const WIDE: u128 = 0xdead_beef_0000_0001_0123_4567_89ab_cdef;

fn stored() -> KvEvent {
    KvEvent::Stored(BlockStored {
        block_hashes: vec![BlockHash::external_u64(u64::MAX), BlockHash(WIDE)],
        parent_hash: Some(BlockHash::external_u64(46)),
        tier: Tier::G2,
        kind: TierKind::Memory,
        bytes: 2 * 65536,
        location: Some(BlockLocation::ArenaSlot { slot: 9 }),
        token_ids: Some((1..=8).collect()),
        block_size: 4,
    })
}

fn removed() -> KvEvent {
    KvEvent::Removed(BlockRemoved {
        block_hashes: vec![BlockHash(WIDE)],
        tier: Tier::G3,
        kind: TierKind::Disk,
    })
}

fn events() -> Vec<KvEvent> {
    vec![stored(), removed(), KvEvent::AllCleared { tier: Tier::G1 }]
}

fn s(text: &str) -> Value {
    Value::from(text)
}

fn u(n: u64) -> Value {
    Value::from(n)
}

/// The exact msgpack structure vLLM's msgspec classes produce for
/// `events()` (array_like, tagged, defaults omitted).
fn expected_payload(ts: f64, dp_rank: i64) -> Value {
    Value::Array(vec![
        Value::F64(ts),
        Value::Array(vec![
            Value::Array(vec![
                s("BlockStored"),
                Value::Array(vec![u(u64::MAX), u(0x0123_4567_89ab_cdef)]),
                u(46),
                Value::Array((1..=8).map(u).collect()),
                u(4),
                Value::Nil,
                s("CPU_TIER1"),
                Value::Nil,
            ]),
            Value::Array(vec![
                s("BlockRemoved"),
                Value::Array(vec![u(0x0123_4567_89ab_cdef)]),
                s("DISK"),
            ]),
            Value::Array(vec![s("AllBlocksCleared")]),
        ]),
        Value::from(dp_rank),
    ])
}

#[test]
fn hashes_map_to_their_low_64_bits_and_external_ids_pass_through() {
    assert_eq!(vllm_block_hash(BlockHash::external_u64(46)), 46);
    assert_eq!(vllm_block_hash(BlockHash::external_u64(u64::MAX)), u64::MAX);
    assert_eq!(vllm_block_hash(BlockHash(WIDE)), 0x0123_4567_89ab_cdef);
    // vLLM: int.from_bytes(hash, "big") & (2**64 - 1), on the big-endian bytes.
    let be = WIDE.to_be_bytes();
    let mut low = [0u8; 8];
    low.copy_from_slice(&be[8..]);
    assert_eq!(vllm_block_hash(BlockHash(WIDE)), u64::from_be_bytes(low));
    let media = TierKind::ALL.map(vllm_medium);
    assert_eq!(media, ["GPU", "CPU_TIER1", "DISK", "EXTERNAL", "EXTERNAL"]);
}

#[test]
fn payload_has_vllm_msgpack_layout() {
    let batch = EventBatch {
        seq: 3,
        ts: 1_700_000_000.25,
        events: events(),
    };
    let bytes = encode_kv_event_batch(&batch, 2);
    let mut reader = bytes.as_slice();
    let value = rmpv::decode::read_value(&mut reader).expect("valid msgpack");
    assert!(reader.is_empty(), "one value, nothing after it");
    assert_eq!(value, expected_payload(1_700_000_000.25, 2));

    // A stored event without token ids carries an empty list, as vLLM's
    // required `token_ids` field needs.
    let mut bare = stored();
    if let KvEvent::Stored(s) = &mut bare {
        s.token_ids = None;
        s.parent_hash = None;
    }
    let bytes = encode_kv_event_batch(
        &EventBatch {
            seq: 0,
            ts: 0.0,
            events: vec![bare],
        },
        0,
    );
    let value = rmpv::decode::read_value(&mut bytes.as_slice()).unwrap();
    let event = &value[1][0];
    assert_eq!(event[2], Value::Nil);
    assert_eq!(event[3], Value::Array(vec![]));
}

/// Binds a sink on a free port and connects a SUB socket to it.
async fn sink_and_subscriber(topic: &str) -> (Arc<ZmqSink>, SubSocket) {
    let sink = ZmqSink::bind(ZmqSinkConfig {
        endpoint: "tcp://127.0.0.1:0".into(),
        topic: topic.into(),
        data_parallel_rank: 1,
        ..ZmqSinkConfig::default()
    })
    .await
    .expect("bind PUB on a free port");
    let mut sub = SubSocket::new();
    sub.connect(sink.endpoint()).await.expect("SUB connects");
    sub.subscribe(topic).await.expect("subscribe");
    (Arc::new(sink), sub)
}

/// ZMQ PUB drops messages until a subscription has arrived ("slow
/// joiner"): publish warm-up batches until one is received, with a
/// deadline. Returns the first seq the real events may use.
async fn warm_up(publisher: &EventPublisher, sub: &mut SubSocket) -> u64 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        publisher.emit(KvEvent::AllCleared { tier: Tier::G4 });
        publisher.flush();
        if tokio::time::timeout(Duration::from_millis(100), sub.recv())
            .await
            .is_ok()
        {
            return publisher.next_seq();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the SUB socket never received a message from the PUB sink"
        );
    }
}

#[tokio::test]
async fn a_sub_socket_receives_topic_seq_and_a_vllm_payload() {
    let (sink, mut sub) = sink_and_subscriber("kv@node-a").await;
    let publisher = EventPublisher::new(
        PublisherConfig {
            max_batch_events: 3,
            max_batch_delay: Duration::from_secs(3600),
        },
        vec![sink.clone() as Arc<dyn EventSink>],
    )
    .unwrap();
    let first_seq = warm_up(&publisher, &mut sub).await;
    for event in events() {
        publisher.emit(event);
    }
    // Count-cut batch: exactly one message carries our three events.
    let message = loop {
        let message = tokio::time::timeout(Duration::from_secs(10), sub.recv())
            .await
            .expect("batch arrives")
            .expect("recv");
        assert_eq!(message.len(), 3, "[topic, seq, payload]");
        let seq = message.get(1).unwrap();
        let seq = u64::from_be_bytes(seq.as_ref().try_into().expect("8-byte seq"));
        if seq >= first_seq {
            assert_eq!(seq, first_seq);
            break message;
        }
    };
    assert_eq!(message.get(0).unwrap().as_ref(), b"kv@node-a");
    let value = rmpv::decode::read_value(&mut message.get(2).unwrap().as_ref()).unwrap();
    let ts = value[0].as_f64().expect("ts is a float");
    assert!(ts > 1.6e9, "ts is Unix seconds");
    assert_eq!(value, expected_payload(ts, 1));

    publisher.close();
    sink.close_and_wait().await;
    assert_eq!(sink.counts().dropped, 0);
    assert_eq!(sink.counts().errors, 0);
}

/// vLLM's event classes as plain msgspec structs: the oldest published form
/// (no `medium`) and the current fields, both `array_like` as in the
/// version the brief names. The script subscribes with pyzmq (libzmq), so it
/// also checks that the pure-Rust ZMTP speaks to libzmq.
const PY_DECODER: &str = r#"
import json, sys
import msgspec, zmq
from typing import Any

class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None

class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass

class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None

class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None

class AllBlocksCleared(KVCacheEvent):
    pass

class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]

# vllm-project/vllm@b4e69e0 (first release with KV events).
class OldBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]

class OldEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass

class OldBlockStored(OldEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None

class OldBlockRemoved(OldEvent, tag="BlockRemoved"):
    block_hashes: list[int]

class OldAllBlocksCleared(OldEvent, tag="AllBlocksCleared"):
    pass

class OldKVEventBatch(OldBatch):
    events: list[OldBlockStored | OldBlockRemoved | OldAllBlocksCleared]

def plain(batch):
    out = {f: getattr(batch, f) for f in batch.__struct_fields__ if f != "events"}
    out["events"] = [
        dict(type=type(e).__name__, **{f: getattr(e, f) for f in e.__struct_fields__})
        for e in batch.events
    ]
    return out

endpoint, topic = sys.argv[1], sys.argv[2]
sub = zmq.Context.instance().socket(zmq.SUB)
sub.connect(endpoint)
sub.setsockopt_string(zmq.SUBSCRIBE, topic)
print("subscribed", flush=True)
if not sub.poll(20000):
    sys.exit("no message within 20 s")
frames = sub.recv_multipart()
assert len(frames) == 3, frames
seq = int.from_bytes(frames[1], "big")
new = msgspec.msgpack.Decoder(KVEventBatch).decode(frames[2])
old = msgspec.msgpack.Decoder(OldKVEventBatch).decode(frames[2])
print(json.dumps({"topic": frames[0].decode(), "seq": seq, "new": plain(new), "old": plain(old)}))
"#;

fn python_with_msgspec() -> bool {
    Command::new("python3")
        .args(["-c", "import msgspec, zmq"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[tokio::test]
async fn vllm_msgspec_classes_decode_our_batches() {
    if !python_with_msgspec() {
        eprintln!(
            "SKIPPED: python3 with msgspec and pyzmq not found (pip install msgspec pyzmq); \
             the Rust-side layout test still checks the format"
        );
        return;
    }
    let sink = Arc::new(
        ZmqSink::bind(ZmqSinkConfig {
            endpoint: "tcp://127.0.0.1:0".into(),
            topic: "kv".into(),
            data_parallel_rank: 3,
            ..ZmqSinkConfig::default()
        })
        .await
        .unwrap(),
    );
    let publisher = EventPublisher::new(
        PublisherConfig {
            max_batch_events: 100,
            max_batch_delay: Duration::from_secs(3600),
        },
        vec![sink.clone() as Arc<dyn EventSink>],
    )
    .unwrap();
    let mut script = tempfile::NamedTempFile::new().unwrap();
    script.write_all(PY_DECODER.as_bytes()).unwrap();
    let child = Command::new("python3")
        .arg(script.path())
        .args([sink.endpoint(), "kv"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start python3");
    let output = tokio::task::spawn_blocking(move || child.wait_with_output());
    // Same events again and again until the subscriber has joined and exits
    // (PUB drops messages sent before the subscription arrives).
    while !output.is_finished() {
        for event in events() {
            publisher.emit(event);
        }
        publisher.flush();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let output = output.await.unwrap().unwrap();
    assert!(
        output.status.success(),
        "python decoder failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    let line = stdout.lines().last().expect("decoder output");
    let got: serde_json::Value = serde_json::from_str(line).unwrap();

    assert_eq!(got["topic"], "kv");
    let new = &got["new"];
    assert_eq!(new["data_parallel_rank"], 3);
    let events = new["events"].as_array().unwrap();
    assert_eq!(events.len(), 3);
    let stored = &events[0];
    assert_eq!(stored["type"], "BlockStored");
    assert_eq!(
        stored["block_hashes"],
        serde_json::json!([u64::MAX, 0x0123_4567_89ab_cdef_u64])
    );
    assert_eq!(stored["parent_block_hash"], 46);
    assert_eq!(
        stored["token_ids"],
        serde_json::json!([1, 2, 3, 4, 5, 6, 7, 8])
    );
    assert_eq!(stored["block_size"], 4);
    assert_eq!(stored["medium"], "CPU_TIER1");
    assert_eq!(stored["lora_id"], serde_json::Value::Null);
    assert_eq!(events[1]["type"], "BlockRemoved");
    assert_eq!(
        events[1]["block_hashes"],
        serde_json::json!([0x0123_4567_89ab_cdef_u64])
    );
    assert_eq!(events[1]["medium"], "DISK");
    assert_eq!(events[2]["type"], "AllBlocksCleared");

    let old = &got["old"]["events"];
    assert_eq!(old[0]["type"], "OldBlockStored");
    assert_eq!(old[0]["block_hashes"], stored["block_hashes"]);
    assert_eq!(old[0]["token_ids"], stored["token_ids"]);
    assert_eq!(old[1]["block_hashes"], events[1]["block_hashes"]);
    assert_eq!(old[2]["type"], "OldAllBlocksCleared");
    publisher.close();
}

#[tokio::test]
async fn the_replay_socket_resends_batches_from_a_seq_then_the_end_mark() {
    use kvtier_events::replay::END_SEQ;
    use zeromq::{DealerSocket, SocketSend, ZmqMessage};

    let sink = Arc::new(
        ZmqSink::bind(ZmqSinkConfig {
            endpoint: "tcp://127.0.0.1:0".into(),
            replay_endpoint: Some("tcp://127.0.0.1:0".into()),
            replay_batches: 4,
            ..ZmqSinkConfig::default()
        })
        .await
        .unwrap(),
    );
    let publisher = EventPublisher::new(
        PublisherConfig {
            max_batch_events: 1,
            max_batch_delay: Duration::from_secs(3600),
        },
        vec![sink.clone() as Arc<dyn EventSink>],
    )
    .unwrap();
    // Six batches, one removed block each; the buffer keeps the last four.
    for n in 0..6u64 {
        publisher.emit(KvEvent::Removed(BlockRemoved {
            block_hashes: vec![BlockHash::external_u64(100 + n)],
            tier: Tier::G2,
            kind: TierKind::Memory,
        }));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while sink.counts().delivered < 6 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "sink never sent 6 batches"
        );
        tokio::task::yield_now().await;
    }

    let mut client = DealerSocket::new();
    client
        .connect(sink.replay_endpoint().expect("replay bound"))
        .await
        .unwrap();
    let request = ZmqMessage::try_from(vec![
        bytes::Bytes::new(),
        bytes::Bytes::copy_from_slice(&3u64.to_be_bytes()),
    ])
    .unwrap();
    client.send(request).await.unwrap();
    let mut replayed = Vec::new();
    loop {
        let reply = tokio::time::timeout(Duration::from_secs(10), client.recv())
            .await
            .expect("replay reply")
            .unwrap()
            .into_vec();
        assert_eq!(reply.len(), 3, "[empty, seq, payload]");
        assert!(reply[0].is_empty());
        if reply[1].as_ref() == END_SEQ {
            assert!(reply[2].is_empty());
            break;
        }
        let seq = u64::from_be_bytes(reply[1].as_ref().try_into().unwrap());
        let value = rmpv::decode::read_value(&mut reply[2].as_ref()).unwrap();
        let hash = value[1][0][1][0]
            .as_u64()
            .expect("the removed block's hash");
        replayed.push((seq, hash));
    }
    assert_eq!(replayed, vec![(3, 103), (4, 104), (5, 105)]);
    publisher.close();
}
