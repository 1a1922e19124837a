//! A node without a shape opens on the first engine's `Hello`, which on a
//! new disk tier can outlast a client's timeout (the data file is written
//! through first). Meanwhile the daemon tells 4.2 clients `Opening` every
//! second, and they keep waiting (the blocking and the async client); a 4.1 client gets nothing but its answer
//! (docs/node-protocol.md §4.14, I29). The open is held here by the node's
//! open hook, released by the test once the clients have waited longer
//! than their timeout: the test waits on frames, never on time.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kvtier_client::{AsyncClient, Client, ClientConfig};
use kvtier_node::{NodeConfig, NodeHost, NodeServer};
use kvtier_protocol::{Hello, Message, Opening, PROTOCOL_VERSION, ProtocolVersion, WireGeometry};
use tokio::sync::oneshot;

/// Bounds any blocking read of a test: a failure, not a latency target.
const PATIENCE: Duration = Duration::from_secs(60);

/// How long the open is held at least, in the raw 4.2 client's `Opening`
/// time: longer than [`CLIENT_TIMEOUT`], so a client that did not keep
/// waiting would fail.
const HELD_MS: u64 = 3000;

/// The library client's timeout for each frame, below [`HELD_MS`].
const CLIENT_TIMEOUT: Duration = Duration::from_millis(1500);

fn unshaped_config(dir: &Path) -> NodeConfig {
    let mut c = kvtier_node::test_support::small_config(dir, 8);
    c.geometry = None;
    c
}

/// The block shape of `small_config`'s engines, on the wire.
fn wire_geometry() -> WireGeometry {
    let g = kvtier_core::GeometryConfig {
        preset: Some("tiny".into()),
        tokens_per_block: 16,
        ..Default::default()
    }
    .resolve()
    .expect("the tiny preset");
    WireGeometry::from(&g)
}

fn namespace() -> kvtier_protocol::Namespace {
    kvtier_node::test_support::namespace("opening-test")
}

/// A connection that says `Hello` of version `minor` and reads frames.
struct Raw(UnixStream);

impl Raw {
    fn hello(socket: &Path, minor: u16) -> Self {
        let mut s = UnixStream::connect(socket).expect("connect");
        s.set_read_timeout(Some(PATIENCE)).expect("read timeout");
        let hello = Message::Hello(Hello {
            protocol_version: ProtocolVersion {
                major: PROTOCOL_VERSION.major,
                minor,
            },
            namespace: namespace(),
            geometry: wire_geometry(),
            instance: None,
        });
        s.write_all(&hello.to_frame().expect("encode"))
            .expect("send Hello");
        Self(s)
    }

    fn recv(&mut self) -> Message {
        kvtier_protocol::read_frame(&mut self.0)
            .expect("a frame")
            .expect("the daemon closed the connection")
    }
}

#[test]
fn clients_wait_through_a_slow_first_open_told_by_opening() {
    let dir = tempfile::tempdir().unwrap();
    let config = unshaped_config(dir.path());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (release, held) = oneshot::channel::<()>();
    let (host, server) = rt.block_on(async {
        let host = NodeHost::open(&config, vec![])
            .await
            .expect("open the host");
        assert!(host.node().is_none(), "no shape yet");
        // Runs inside the first Hello's open, before it is answered.
        host.when_open(Box::new(move |_node| {
            Box::pin(async move {
                let _ = held.await;
            })
        }))
        .await;
        let server = NodeServer::bind_host(host.clone(), &config.node_socket())
            .await
            .expect("bind the node socket");
        (host, server)
    });
    let socket = config.node_socket();

    let old = Raw::hello(&socket, 1);
    let library_config =
        ClientConfig::new(&socket, namespace(), wire_geometry()).with_timeout(CLIENT_TIMEOUT);
    let library = std::thread::spawn({
        let config = library_config.clone();
        move || Client::connect(config)
    });
    let library_async = rt.spawn(AsyncClient::connect(library_config));
    let mut new = Raw::hello(&socket, 2);
    let mut last = 0;
    while last < HELD_MS {
        match new.recv() {
            Message::Opening(Opening { elapsed_ms }) => {
                assert!(elapsed_ms >= last, "{elapsed_ms} after {last}");
                last = elapsed_ms;
            }
            other => panic!("a 4.2 client got {} while the node opens", other.name()),
        }
    }
    release.send(()).expect("the open is held");

    let answer = loop {
        match new.recv() {
            Message::Opening(_) => continue,
            other => break other,
        }
    };
    assert!(matches!(answer, Message::HelloOk(_)), "{answer:?}");
    let mut old = old;
    let answer = old.recv();
    assert!(
        matches!(answer, Message::HelloOk(_)),
        "a 4.1 client got {answer:?} first"
    );
    let client = library
        .join()
        .expect("the library client's thread")
        .expect("the library client waited through the open");
    assert_eq!(client.tiers(), host_tiers(&host).as_slice());
    let async_client = rt
        .block_on(library_async)
        .expect("the async client's task")
        .expect("the async client waited through the open");
    assert_eq!(async_client.tiers(), client.tiers());
    drop((client, async_client));
    rt.block_on(server.shutdown());
}

/// The tiers a client of `host`'s open node is told.
fn host_tiers(host: &Arc<NodeHost>) -> Vec<kvtier_protocol::TierInfo> {
    let node = host.node().expect("the node is open");
    node.tier_list()
        .into_iter()
        .map(|(tier, kind)| kvtier_protocol::TierInfo { tier, kind })
        .collect()
}
