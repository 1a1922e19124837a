//! The NATS sink against a real `nats-server` started by the test on
//! 127.0.0.1 with a free port (Debian package `nats-server`; set
//! `NATS_SERVER_BIN` to use another binary). The tests fail with a clear
//! message when the binary is missing.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kvtier_core::{BlockHash, TierKind};
use kvtier_events::{NatsSink, NatsSinkConfig};
use kvtier_manager::Tier;
use kvtier_manager::events::{
    BlockRemoved, BlockStored, EventBatch, EventPublisher, EventSink, KvEvent, Overflow,
    PublisherConfig, QueueConfig,
};

fn nats_server_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("NATS_SERVER_BIN") {
        return PathBuf::from(path);
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("nats-server"))
        .chain([
            PathBuf::from("/usr/sbin/nats-server"),
            PathBuf::from("/usr/bin/nats-server"),
        ])
        .find(|candidate| candidate.is_file());
    on_path.unwrap_or_else(|| {
        panic!(
            "nats-server not found (looked in PATH, /usr/sbin, /usr/bin; NATS_SERVER_BIN unset). \
             Install it: `apt-get install nats-server`"
        )
    })
}

/// A `nats-server` child process, killed on drop.
struct NatsServer {
    child: Child,
    addr: SocketAddr,
}

impl NatsServer {
    fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("pick a free port")
            .port();
        Self::start_on(port)
    }

    fn start_on(port: u16) -> Self {
        let binary = nats_server_binary();
        let child = Command::new(&binary)
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let server = Self { child, addr };
        // Ready when the port accepts connections.
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_err() {
            assert!(
                Instant::now() < deadline,
                "nats-server did not listen on {addr} within 10 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    fn url(&self) -> String {
        format!("nats://{}", self.addr)
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn event(n: u64) -> KvEvent {
    if n.is_multiple_of(2) {
        KvEvent::Stored(BlockStored {
            block_hashes: vec![BlockHash(u128::from(n) << 64 | 1), BlockHash(u128::from(n))],
            parent_hash: Some(BlockHash(7)),
            tier: Tier::G3,
            kind: TierKind::Disk,
            bytes: 1 << 20,
            location: Some(kvtier_manager::events::BlockLocation::DiskRegion {
                segment: 2,
                offset: n * 4096,
                len: 4096,
            }),
            token_ids: Some(vec![1, 2, 3]),
            block_size: 16,
        })
    } else {
        KvEvent::Removed(BlockRemoved {
            block_hashes: vec![BlockHash(u128::MAX - u128::from(n))],
            tier: Tier::G2,
            kind: TierKind::Memory,
        })
    }
}

async fn subscribe(url: &str, subject: &str) -> (async_nats::Client, async_nats::Subscriber) {
    let client = async_nats::connect(url).await.expect("subscriber connects");
    let subscriber = client
        .subscribe(subject.to_owned())
        .await
        .expect("subscribe");
    // The server has the subscription once a flush round-trip is done.
    client.flush().await.expect("flush subscription");
    (client, subscriber)
}

async fn next_batch(subscriber: &mut async_nats::Subscriber) -> EventBatch {
    let message = tokio::time::timeout(Duration::from_secs(10), subscriber.next())
        .await
        .expect("a batch within 10 s")
        .expect("subscription open");
    serde_json::from_slice(&message.payload).expect("payload is a JSON EventBatch")
}

#[tokio::test]
async fn batches_arrive_on_the_node_subject_as_json() {
    let server = NatsServer::start();
    let (_client, mut subscriber) = subscribe(&server.url(), "kvtier.events.node-a").await;

    let config = NatsSinkConfig::for_node(server.url(), "node-a");
    assert_eq!(config.subject, "kvtier.events.node-a");
    let sink = Arc::new(NatsSink::connect(config).await.expect("sink connects"));
    let publisher = EventPublisher::new(
        PublisherConfig {
            max_batch_events: 2,
            max_batch_delay: Duration::from_secs(3600),
        },
        vec![sink.clone() as Arc<dyn EventSink>],
    )
    .unwrap();
    for n in 0..5 {
        publisher.emit(event(n));
    }
    publisher.close();
    sink.close_and_wait().await;

    let mut events = Vec::new();
    for seq in 0..3 {
        let batch = next_batch(&mut subscriber).await;
        assert_eq!(batch.seq, seq);
        assert!(batch.ts > 1.6e9);
        events.extend(batch.events);
    }
    assert_eq!(events, (0..5).map(event).collect::<Vec<_>>());
    let counts = sink.counts();
    assert_eq!((counts.delivered, counts.dropped, counts.errors), (3, 0, 0));
}

#[tokio::test]
async fn an_unreachable_server_is_a_connect_error() {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let result = NatsSink::connect(NatsSinkConfig::for_node(
        format!("nats://127.0.0.1:{port}"),
        "x",
    ))
    .await;
    assert!(matches!(
        result,
        Err(kvtier_events::SinkError::NatsConnect { .. })
    ));
}

#[tokio::test]
async fn a_server_outage_drops_and_counts_then_the_client_reconnects() {
    let mut server = NatsServer::start();
    let port = server.addr.port();
    let sink = Arc::new(
        NatsSink::connect(NatsSinkConfig {
            url: server.url(),
            subject: "kvtier.events.node-b".into(),
            queue: QueueConfig {
                capacity: 16,
                overflow: Overflow::DropOldest,
            },
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

    server.stop();
    // The data path keeps going while the server is down: 1000 batches
    // against a 16-batch queue, none of them waiting on the network. (The
    // test runtime is single-threaded, so the worker cannot drain during
    // the loop: exactly the oldest 984 are dropped.)
    for n in 0..1000 {
        publisher.emit(event(n));
    }
    assert_eq!(sink.counts().dropped, 984, "{:?}", sink.counts());

    // The client reconnects by itself once the server is back.
    let server = NatsServer::start_on(port);
    let (_client, mut subscriber) = subscribe(&server.url(), "kvtier.events.node-b").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let marker = KvEvent::AllCleared { tier: Tier::G4 };
    let received = loop {
        publisher.emit(marker.clone());
        if let Ok(Some(message)) =
            tokio::time::timeout(Duration::from_millis(200), subscriber.next()).await
        {
            break serde_json::from_slice::<EventBatch>(&message.payload).unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "the sink did not deliver within 30 s of the server's return: {:?}",
            sink.counts()
        );
    };
    // Either one of the 16 batches queued during the outage (the client
    // flushed it after our subscription) or a marker cut after it.
    let queued_in_outage = (984..1000).contains(&received.seq);
    let marker_after = received.seq >= 1000 && received.events == vec![marker];
    assert!(
        queued_in_outage || marker_after,
        "unexpected batch {received:?}"
    );
    publisher.close();
}

/// The JSON published on NATS, field by field (the schema in
/// `docs/events.md`).
#[test]
fn json_schema_of_a_batch() {
    let batch = EventBatch {
        seq: 9,
        ts: 1.5,
        events: vec![event(2), event(3), KvEvent::AllCleared { tier: Tier::G1 }],
    };
    let json = serde_json::to_value(&batch).unwrap();
    let expected = serde_json::json!({
        "seq": 9,
        "ts": 1.5,
        "events": [
            {
                "type": "stored",
                "block_hashes": ["00000000000000020000000000000001", "00000000000000000000000000000002"],
                "parent_hash": "00000000000000000000000000000007",
                "tier": "G3",
                "kind": "disk",
                "bytes": 1048576,
                "location": {"kind": "disk_region", "segment": 2, "offset": 8192, "len": 4096},
                "token_ids": [1, 2, 3],
                "block_size": 16
            },
            {
                "type": "removed",
                "block_hashes": ["fffffffffffffffffffffffffffffffc"],
                "tier": "G2",
                "kind": "memory"
            },
            {"type": "all_cleared", "tier": "G1"}
        ]
    });
    assert_eq!(json, expected);
    let back: EventBatch = serde_json::from_value(json).unwrap();
    assert_eq!(back, batch);
    let bad = serde_json::json!({"seq": 0, "ts": 0.0, "events": [
        {"type": "removed", "block_hashes": ["xyz"], "tier": "G2", "kind": "memory"}
    ]});
    assert!(serde_json::from_value::<EventBatch>(bad).is_err());
}
