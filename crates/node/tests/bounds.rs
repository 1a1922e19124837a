//! Every client is bounded (docs/node-protocol.md §7, I19-I23): a client
//! that stops reading loses what it holds to the write timeout, connections
//! past the cap are refused with `BUSY`, a connection without `Hello` or
//! with a frame that never completes is closed, an idle one is closed once
//! it holds nothing, `Hello` strings and pins per session are capped. A
//! real node in the test process behind its socket; the tests wait on the
//! node's counters, never on time.

use std::io::{ErrorKind, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use kvtier_client::{
    BlockHash, Client, ClientConfig, ClientError, ErrorCode, Namespace, StoreOutcome,
};
use kvtier_node::NodeConfig;
use kvtier_node::test_support::TestNode;
use kvtier_protocol::{
    Hello, KeysRequest, Message, PROTOCOL_VERSION, ReserveResult, Stats, WireGeometry, read_frame,
};

/// Bounds any blocking read of a test: a failure, not a latency target.
const PATIENCE: Duration = Duration::from_secs(30);

fn namespace() -> Namespace {
    kvtier_node::test_support::namespace("bounds-test")
}

fn config(dir: &Path, dram_blocks: u64) -> NodeConfig {
    kvtier_node::test_support::small_config(dir, dram_blocks)
}

fn client_config(node: &TestNode, namespace: Namespace) -> ClientConfig {
    let geometry = WireGeometry::from(node.node.geometry());
    ClientConfig::new(node.socket(), namespace, geometry)
}

fn client(node: &TestNode) -> Client {
    Client::connect(client_config(node, namespace())).expect("connect")
}

fn block(k: u128, len: usize) -> Vec<u8> {
    (0..len).map(|i| (k as usize * 31 + i * 7) as u8).collect()
}

fn store(client: &mut Client, key: u128, len: usize) -> StoreOutcome {
    let bytes = block(key, len);
    let got = client.store(&[(BlockHash(key), &bytes)]).expect("store");
    got[0]
}

/// A raw connection that speaks frames itself.
struct Raw(UnixStream);

impl Raw {
    fn connect(node: &TestNode) -> Self {
        let s = UnixStream::connect(node.socket()).expect("connect");
        s.set_read_timeout(Some(PATIENCE)).expect("read timeout");
        Self(s)
    }

    fn send(&mut self, msg: &Message) {
        let frame = msg.to_frame().expect("encode");
        self.0.write_all(&frame).expect("send");
    }

    /// The next frame; `None` once the daemon closed the connection.
    fn recv(&mut self) -> Option<Message> {
        match read_frame(&mut self.0) {
            Ok(msg) => msg,
            Err(kvtier_protocol::FrameError::Io(e)) if e.kind() == ErrorKind::ConnectionReset => {
                None
            }
            Err(e) => panic!("reading the daemon's answer: {e}"),
        }
    }

    /// Says `Hello` and expects `HelloOk`.
    fn greet(node: &TestNode) -> Self {
        let mut raw = Self::connect(node);
        raw.send(&hello(node, namespace()));
        let got = raw.recv();
        assert!(matches!(got, Some(Message::HelloOk(_))), "{got:?}");
        raw
    }

    /// Expects one `Error` with `code`, then the close.
    fn expect_refusal(&mut self, code: ErrorCode) -> String {
        let got = self.recv();
        let Some(Message::Error(e)) = got else {
            panic!("expected an Error with code {code:?}, got {got:?}");
        };
        assert_eq!(e.code, code, "{}", e.message);
        assert!(self.recv().is_none(), "the connection stays open");
        e.message
    }
}

fn hello(node: &TestNode, namespace: Namespace) -> Message {
    Message::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        namespace,
        geometry: WireGeometry::from(node.node.geometry()),
        instance: None,
    })
}

/// A client reserves every arena slot, then pipelines requests without
/// ever reading a reply. The daemon's writes to it stall, the write
/// timeout closes it, and its reservations go back well within their
/// lease (none lapsed); another client stores then.
#[test]
fn a_client_that_never_reads_loses_its_reservations_to_the_write_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), 8);
    c.manager.lease_secs = 60;
    c.manager.write_timeout_ms = 200;
    let node = TestNode::start(c, Vec::new());
    let len = node.node.geometry().block_bytes() as usize;
    let mut hog = Raw::greet(&node);
    hog.send(&Message::Reserve(KeysRequest {
        request_id: 1,
        keys: (0..8).map(BlockHash).collect(),
    }));
    let Some(Message::ReserveOk(ok)) = hog.recv() else {
        panic!("no ReserveOk");
    };
    assert!(
        ok.results
            .iter()
            .all(|r| matches!(r, ReserveResult::Slot(_)))
    );
    let mut other = client(&node);
    assert_eq!(store(&mut other, 100, len), StoreOutcome::NoSpace);

    let mut pipe = hog.0.try_clone().expect("clone the socket");
    let writer = std::thread::spawn(move || {
        let stats = Message::Stats(Stats { request_id: 2 })
            .to_frame()
            .expect("encode");
        // Until the daemon closes the connection: it must, as this side
        // never reads.
        while pipe.write_all(&stats).is_ok() {}
    });
    // Meanwhile the daemon serves others.
    other.stats().expect("stats while one client does not read");
    node.wait_stats("the write timeout", |s| s.write_timeouts == 1);
    writer.join().expect("the pipelining writer");
    let s = node.node.stats();
    assert_eq!(s.leases_expired, 0, "freed by the close, not the lease");
    assert!(s.aborted >= 8, "{s:?}");
    assert_eq!(store(&mut other, 100, len), StoreOutcome::Stored);
}

/// Up to `max_connections` are served; one more gets `BUSY` and is closed;
/// once one leaves, a new one is served.
#[test]
fn connections_past_the_cap_are_refused_busy_until_one_leaves() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), 4);
    c.manager.max_connections = 3;
    let node = TestNode::start(c, Vec::new());
    let mut open: Vec<Raw> = (0..3).map(|_| Raw::greet(&node)).collect();
    node.wait_stats("three connections", |s| s.connections_open == 3);

    let mut extra = Raw::connect(&node);
    extra.send(&hello(&node, namespace()));
    let why = extra.expect_refusal(ErrorCode::BUSY);
    assert!(why.contains("max_connections"), "{why}");
    let refused = Client::connect(client_config(&node, namespace()));
    assert!(
        matches!(&refused, Err(ClientError::Refused { code, .. }) if *code == ErrorCode::BUSY),
        "{refused:?}"
    );
    assert_eq!(node.node.stats().connections_refused, 2);

    drop(open.pop());
    node.wait_stats("a connection to close", |s| s.connections_open == 2);
    let _again = Raw::greet(&node);
    assert_eq!(node.node.stats().connections_open, 3);
}

/// A connection that says nothing is closed at the handshake timeout with
/// `HANDSHAKE`; one that starts a frame and stops is closed at the frame
/// timeout with `BAD_FRAME`.
#[test]
fn a_connection_without_hello_or_with_half_a_frame_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), 4);
    c.manager.handshake_timeout_secs = 1;
    c.manager.frame_timeout_secs = 1;
    let node = TestNode::start(c, Vec::new());

    let mut silent = Raw::connect(&node);
    silent.expect_refusal(ErrorCode::HANDSHAKE);
    assert_eq!(node.node.stats().handshake_timeouts, 1);

    let mut slow = Raw::greet(&node);
    let lookup = Message::Lookup(KeysRequest {
        request_id: 1,
        keys: vec![BlockHash(1), BlockHash(2)],
    })
    .to_frame()
    .expect("encode");
    slow.0.write_all(&lookup[..10]).expect("half a frame");
    slow.expect_refusal(ErrorCode::BAD_FRAME);
    let s = node.node.stats();
    assert_eq!((s.frame_timeouts, s.handshake_timeouts), (1, 1));
}

/// A frame larger than a `Hello` can be, before `Hello`, is refused from
/// its length prefix alone; so is, after it, a frame larger than a request
/// of `max_batch` keys.
#[test]
fn frames_over_the_connection_limit_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let node = TestNode::start(config(dir.path(), 4), Vec::new());
    let mut early = Raw::connect(&node);
    let prefix = (kvtier_node::HELLO_FRAME_MAX as u32).to_le_bytes();
    early.0.write_all(&prefix).expect("a large prefix");
    let why = early.expect_refusal(ErrorCode::BAD_FRAME);
    assert!(why.contains("before Hello"), "{why}");

    let mut late = Raw::greet(&node);
    let o = node.node.options();
    let limit = kvtier_node::request_frame_limit(o.max_batch, node.node.geometry().layers);
    late.0
        .write_all(&(limit as u32).to_le_bytes())
        .expect("a large prefix");
    let why = late.expect_refusal(ErrorCode::BAD_FRAME);
    assert!(why.contains("max_batch"), "{why}");
    assert_eq!(node.node.stats().bad_frames, 2);
}

/// A `Hello` string over 256 bytes is refused with `HANDSHAKE`.
#[test]
fn over_long_hello_strings_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let node = TestNode::start(config(dir.path(), 4), Vec::new());
    let long = "m".repeat(kvtier_node::HELLO_STRING_MAX + 1);
    let mut ns = namespace();
    ns.model = long.clone();
    let refused = Client::connect(client_config(&node, ns));
    assert!(
        matches!(&refused, Err(ClientError::Refused { code, .. }) if *code == ErrorCode::HANDSHAKE),
        "{refused:?}"
    );
    let mut ns = namespace();
    ns.tenant_salt = Some(vec![7; kvtier_node::HELLO_STRING_MAX + 1]);
    assert!(Client::connect(client_config(&node, ns)).is_err());
    let mut ns = namespace();
    ns.model = "m".repeat(kvtier_node::HELLO_STRING_MAX);
    Client::connect(client_config(&node, ns)).expect("a string at the cap is fine");
    assert_eq!(node.node.stats().handshake_refusals, 2);
}

/// A quiet connection holding a reservation is not closed while it holds
/// it: its lease lapses first, then the idle timeout closes it.
#[test]
fn an_idle_connection_is_closed_once_it_holds_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), 4);
    c.manager.idle_timeout_secs = 1;
    c.manager.lease_secs = 3;
    c.manager.write_timeout_ms = 500;
    let node = TestNode::start(c, Vec::new());
    let mut quiet = client(&node);
    let granted = quiet.reserve(&[BlockHash(5)]).expect("reserve");
    assert!(matches!(granted[0], ReserveResult::Slot(_)));
    node.wait_stats("the idle close", |s| s.idle_closed == 1);
    // Closed with the reservation would have dropped it without a lapse.
    assert_eq!(node.node.stats().leases_expired, 1);
    let after = quiet.stats();
    assert!(
        after.as_ref().is_err_and(ClientError::is_fatal),
        "{after:?}"
    );
}

/// A `Load` that could take the session past its pin cap gets
/// `BAD_REQUEST` and pins nothing; once pins are released it is served.
#[test]
fn a_load_past_the_pin_cap_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), 8);
    c.manager.max_batch = 4;
    c.manager.max_pins_per_session = 4;
    let node = TestNode::start(c, Vec::new());
    let len = node.node.geometry().block_bytes() as usize;
    let mut cl = client(&node);
    for k in 0..5 {
        assert_eq!(store(&mut cl, k, len), StoreOutcome::Stored);
    }
    let held = cl
        .load(&(0..4).map(BlockHash).collect::<Vec<_>>())
        .expect("load");
    let over = cl.load(&[BlockHash(4)]);
    assert!(
        matches!(&over, Err(ClientError::Refused { code, .. }) if *code == ErrorCode::BAD_REQUEST),
        "{over:?}"
    );
    let s = node.node.stats();
    assert_eq!((s.pin_cap_refusals, s.loaded), (1, 4));
    cl.release_load(held).expect("release");
    let next = cl.load(&[BlockHash(4)]).expect("load after the release");
    assert_eq!(node.node.stats().loaded, 5);
    cl.release_load(next).expect("release");
}
