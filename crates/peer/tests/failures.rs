//! What goes wrong between peers, over real loopback TCP: refusals on both
//! sides, silent and dying servers, malformed frames. Deadlines here are
//! real but short; nothing asserts how long anything took, only that it
//! returned, and with what.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use kvtier_core::BlockHash;
use kvtier_peer::frame::{
    ErrorCode, Frame, Hello, PEER_VERSION, RefuseReason, Version, read_frame, write_frame,
};
use kvtier_peer::{
    BlockData, BlockSource, Expect, LayerRange, MemorySource, PeerClient, PeerError, ServerConfig,
    Want,
};
use kvtier_tier::BoxFuture;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

const WITHIN: Duration = Duration::from_secs(30);
const SHORT: Duration = Duration::from_millis(200);

fn want(n: u8) -> Want {
    Want {
        key: BlockHash(n as u128),
        expect: Expect::Consistent,
    }
}

fn one_block() -> Arc<MemorySource> {
    let source = Arc::new(MemorySource::new());
    source.insert(BlockHash(0), LAYER, block_bytes(0));
    source
}

/// A good client reads block 0 from `addr`: the server still serves.
async fn still_serves(addr: std::net::SocketAddr) {
    let mut c = PeerClient::connect(addr, &client_id(), WITHIN)
        .await
        .unwrap();
    let got = c.read(&[want(0)], LayerRange::All, later()).await.unwrap();
    assert_eq!(got[0].as_ref().unwrap().bytes, block_bytes(0));
}

/// Reads frames until the server closes; returns the last one it sent.
async fn last_before_close(s: &mut TcpStream) -> Option<Frame> {
    let mut last = None;
    while let Ok(Some(f)) = read_frame(s).await {
        last = Some(f);
    }
    last
}

/// Why the server refuses a client named `me`, which it must.
async fn connect_fails(me: &kvtier_peer::Identity) -> PeerError {
    let server = start(one_block()).await;
    let err = PeerClient::connect(server.local_addr(), me, WITHIN).await;
    let err = err.expect_err("the connection is refused");
    still_serves(server.local_addr()).await;
    err
}

#[tokio::test]
async fn another_cluster_is_refused() {
    let err = connect_fails(&identity("b", "other", 1)).await;
    let wrong_cluster =
        matches!(&err, PeerError::Refused { reason, .. } if *reason == RefuseReason::WrongCluster);
    assert!(wrong_cluster, "{err}");
}

#[tokio::test]
async fn another_secret_is_refused_by_the_client() {
    let err = connect_fails(&identity("b", "c", 2)).await;
    assert!(
        matches!(&err, PeerError::AuthFailed { node } if node == "a"),
        "{err}"
    );
}

#[tokio::test]
async fn another_secret_is_refused_by_the_server() {
    let server = start(one_block()).await;
    let mut s = TcpStream::connect(server.local_addr()).await.unwrap();
    let hello = Hello {
        version: PEER_VERSION,
        cluster: "c".into(),
        node: "b".into(),
        nonce: [3; 32],
    };
    write_frame(&mut s, &Frame::Hello(hello)).await.unwrap();
    assert!(matches!(
        read_frame(&mut s).await,
        Ok(Some(Frame::HelloOk(_)))
    ));
    // A proof made without the secret.
    write_frame(&mut s, &Frame::Proof([0; 32])).await.unwrap();
    let last = last_before_close(&mut s).await;
    assert!(
        matches!(&last, Some(Frame::Refused(r)) if r.reason == RefuseReason::BadProof),
        "{last:?}"
    );
    still_serves(server.local_addr()).await;
    let stats = server.stats().snapshot();
    assert_eq!((stats.auth_failures, stats.authenticated), (1, 1));
}

#[tokio::test]
async fn another_major_version_is_refused() {
    let server = start(one_block()).await;
    let mut s = TcpStream::connect(server.local_addr()).await.unwrap();
    let hello = Hello {
        version: Version {
            major: PEER_VERSION.major + 1,
            minor: 0,
        },
        cluster: "c".into(),
        node: "b".into(),
        nonce: [3; 32],
    };
    write_frame(&mut s, &Frame::Hello(hello)).await.unwrap();
    let last = last_before_close(&mut s).await;
    assert!(
        matches!(&last, Some(Frame::Refused(r)) if r.reason == RefuseReason::WrongVersion),
        "{last:?}"
    );
}

#[tokio::test]
async fn a_server_that_never_answers_times_out() {
    // Accepts (the kernel does, on the listen backlog) but never speaks.
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = PeerClient::connect(silent.local_addr().unwrap(), &client_id(), SHORT)
        .await
        .unwrap_err();
    assert!(matches!(err, PeerError::Timeout), "{err}");
}

/// A source that says when it is asked and then never answers.
struct Stalled(mpsc::UnboundedSender<()>);

impl BlockSource for Stalled {
    fn read<'a>(
        &'a self,
        _: &'a [BlockHash],
        _: LayerRange,
    ) -> BoxFuture<'a, Vec<Option<BlockData>>> {
        let _ = self.0.send(());
        Box::pin(std::future::pending())
    }
}

#[tokio::test]
async fn a_read_past_its_deadline_is_a_timeout_and_breaks_the_connection() {
    let (asked, _rx) = mpsc::unbounded_channel();
    let server = start(Arc::new(Stalled(asked))).await;
    let mut c = PeerClient::connect(server.local_addr(), &client_id(), WITHIN)
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + SHORT;
    let err = c
        .read(&[want(0)], LayerRange::All, deadline)
        .await
        .unwrap_err();
    assert!(matches!(err, PeerError::Timeout), "{err}");
    let err = c
        .read(&[want(0)], LayerRange::All, later())
        .await
        .unwrap_err();
    assert!(matches!(err, PeerError::Broken), "{err}");
}

/// Answers its first call from `blocks`, then stalls like [`Stalled`].
struct FirstBatchOnly {
    blocks: MemorySource,
    stall: Stalled,
    calls: std::sync::atomic::AtomicUsize,
}

impl BlockSource for FirstBatchOnly {
    fn read<'a>(
        &'a self,
        keys: &'a [BlockHash],
        layers: LayerRange,
    ) -> BoxFuture<'a, Vec<Option<BlockData>>> {
        match self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) {
            0 => self.blocks.read(keys, layers),
            _ => self.stall.read(keys, layers),
        }
    }
}

#[tokio::test]
async fn a_server_killed_mid_transfer_is_an_error_not_a_hang() {
    let (asked, mut second_call) = mpsc::unbounded_channel();
    let blocks = MemorySource::new();
    for n in 0..20 {
        blocks.insert(BlockHash(n as u128), LAYER, block_bytes(n));
    }
    let source = FirstBatchOnly {
        blocks,
        stall: Stalled(asked),
        calls: Default::default(),
    };
    let server = start(Arc::new(source)).await;
    let mut c = PeerClient::connect(server.local_addr(), &client_id(), WITHIN)
        .await
        .unwrap();
    let reader = tokio::spawn(async move {
        let wants: Vec<Want> = (0..20).map(want).collect();
        c.read(&wants, LayerRange::All, later()).await
    });
    // The first blocks are on the wire; the server is inside its source.
    second_call.recv().await.unwrap();
    server.shutdown().await;
    let err = reader.await.unwrap().unwrap_err();
    assert!(matches!(err, PeerError::Closed | PeerError::Io(_)), "{err}");
}

#[tokio::test]
async fn malformed_frames_close_that_connection_only() {
    let server = start(one_block()).await;
    let addr = server.local_addr();
    let mut good = PeerClient::connect(addr, &client_id(), WITHIN)
        .await
        .unwrap();

    // Before the handshake: garbage, and a frame longer than any
    // handshake frame (refused before its body is buffered).
    let before: [&[u8]; 2] = [&[5, 0, 0, 0, 0x55, 1, 2, 3, 4], &[0, 0, 16, 0, 0x01]];
    for bytes in before {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(bytes).await.unwrap();
        let last = last_before_close(&mut s).await;
        assert!(matches!(last, None | Some(Frame::Error(_))), "{last:?}");
    }

    // After it: an unknown type, a lying count, a huge length.
    let bad_frames: [&[u8]; 3] = [
        &[1, 0, 0, 0, 0x55],
        &[14, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0],
        &[0xff, 0xff, 0xff, 0xff, 0x10],
    ];
    for bytes in bad_frames {
        let mut s = raw_authenticated(addr, &client_id()).await;
        s.write_all(bytes).await.unwrap();
        let last = last_before_close(&mut s).await;
        assert!(
            matches!(&last, Some(Frame::Error(e)) if e.code == ErrorCode::Malformed),
            "{bytes:?}: {last:?}"
        );
    }
    // A frame out of place (a server's frame) is refused too.
    let mut s = raw_authenticated(addr, &client_id()).await;
    write_frame(&mut s, &Frame::Ready).await.unwrap();
    let last = last_before_close(&mut s).await;
    assert!(matches!(&last, Some(Frame::Error(e)) if e.code == ErrorCode::Unexpected));

    // The connection opened before all this still reads, and new ones too.
    let got = good
        .read(&[want(0)], LayerRange::All, later())
        .await
        .unwrap();
    assert!(got[0].is_some());
    still_serves(addr).await;
}

#[tokio::test]
async fn a_ping_is_answered_and_an_empty_range_is_an_error() {
    let server = start(one_block()).await;
    let mut s = raw_authenticated(server.local_addr(), &client_id()).await;
    write_frame(&mut s, &Frame::Ping(77)).await.unwrap();
    assert_eq!(read_frame(&mut s).await.unwrap(), Some(Frame::Pong(77)));
    let mut c = PeerClient::connect(server.local_addr(), &client_id(), WITHIN)
        .await
        .unwrap();
    let empty = LayerRange::Span { start: 2, end: 2 };
    let err = c.read(&[want(0)], empty, later()).await.unwrap_err();
    assert!(
        matches!(
            err,
            PeerError::Server {
                code: ErrorCode::BadRange,
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn a_peer_silent_in_the_handshake_is_dropped() {
    let mut config = ServerConfig::new(server_id());
    // Short, but long enough for the good client below on a loaded machine.
    config.handshake_timeout = Duration::from_secs(1);
    let server = start_with(config, one_block()).await;
    let mut s = TcpStream::connect(server.local_addr()).await.unwrap();
    // Say nothing: the server closes the connection on its own.
    assert!(last_before_close(&mut s).await.is_none());
    still_serves(server.local_addr()).await;
    assert_eq!(server.stats().snapshot().handshake_failures, 1);
}

#[tokio::test]
async fn connections_over_the_limit_are_refused_busy() {
    let mut config = ServerConfig::new(server_id());
    config.max_connections = 1;
    let server = start_with(config, one_block()).await;
    let first = PeerClient::connect(server.local_addr(), &client_id(), WITHIN)
        .await
        .unwrap();
    let err = PeerClient::connect(server.local_addr(), &client_id(), WITHIN)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            PeerError::Refused {
                reason: RefuseReason::Busy,
                ..
            }
        ),
        "{err}"
    );
    let stats = server.stats().snapshot();
    assert_eq!((stats.accepted, stats.refused, stats.open), (1, 1, 1));
    drop(first);
}

/// A peer that asks and then stops reading is dropped after the write
/// timeout, rather than holding its connection and the blocks in flight.
/// The clock is paused: the wait below passes in virtual time, and the
/// server's timeout fires first because the socket stays full.
#[tokio::test(start_paused = true)]
async fn a_peer_that_stops_reading_is_dropped() {
    const BIG: usize = 16 << 20;
    let source = Arc::new(MemorySource::new());
    source.insert(BlockHash(1), BIG as u32 / 4, vec![0x5a; BIG]);
    let mut config = ServerConfig::new(server_id());
    config.write_timeout = Duration::from_secs(10);
    let server = start_with(config, source).await;
    let mut s = raw_authenticated(server.local_addr(), &client_id()).await;
    let read = kvtier_peer::frame::Read {
        req_id: 1,
        layers: LayerRange::All,
        keys: vec![BlockHash(1); 4],
    };
    write_frame(&mut s, &Frame::Read(read)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(60)).await;
    let mut received = 0usize;
    let mut buf = vec![0u8; 1 << 20];
    // Read until the server closes, or all it would have sent came.
    while received < 4 * BIG {
        match tokio::io::AsyncReadExt::read(&mut s, &mut buf).await {
            Ok(n @ 1..) => received += n,
            _ => break,
        }
    }
    assert!(
        received < 4 * BIG,
        "a peer that stopped reading got all {received} bytes"
    );
}

/// A source that cannot tell which blocks it holds yet.
struct NotReady;

impl BlockSource for NotReady {
    fn read<'a>(
        &'a self,
        keys: &'a [BlockHash],
        _: LayerRange,
    ) -> BoxFuture<'a, Vec<Option<BlockData>>> {
        panic!("a source that is not ready is not read: {keys:?}")
    }

    fn ready(&self) -> bool {
        false
    }
}

#[tokio::test]
async fn a_source_that_is_not_ready_answers_an_error_not_misses() {
    let server = start(Arc::new(NotReady)).await;
    let mut c = PeerClient::connect(server.local_addr(), &client_id(), WITHIN)
        .await
        .unwrap();
    let err = c
        .read(&[want(0), want(1)], LayerRange::All, later())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            PeerError::Server {
                code: ErrorCode::NotReady,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(c.stats().missing, 0);
}
