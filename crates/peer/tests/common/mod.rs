//! What the loopback tests share: identities, a started server, blocks, and
//! a raw authenticated stream for sending frames the client never would.

#![allow(dead_code)] // each test file uses its own part

use std::sync::Arc;
use std::time::Duration;

use kvtier_core::{BlockHash, BlockSums};
use kvtier_peer::frame::{Frame, Hello, PEER_VERSION, read_frame, write_frame};
use kvtier_peer::{
    BlockSource, ClusterSecret, Identity, PeerServer, Role, ServerConfig, ServerHandle, Transcript,
};
use tokio::net::{TcpListener, TcpStream};

/// Bytes of one layer in the test blocks.
pub const LAYER: u32 = 1000;
/// Layers of a test block (the last one shorter).
pub const LAYERS: usize = 5;

/// A node of cluster `cluster` whose secret is 32 copies of `secret`.
pub fn identity(node: &str, cluster: &str, secret: u8) -> Identity {
    Identity {
        cluster: cluster.into(),
        node: node.into(),
        secret: ClusterSecret::from_bytes([secret; 32]),
    }
}

/// The server node "a" of cluster "c", secret 1.
pub fn server_id() -> Identity {
    identity("a", "c", 1)
}

/// The client node "b" of cluster "c", secret 1.
pub fn client_id() -> Identity {
    identity("b", "c", 1)
}

/// A server of `config` over `source` on a fresh loopback port.
pub async fn start_with(config: ServerConfig, source: Arc<dyn BlockSource>) -> ServerHandle {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    PeerServer::start(listener, config, source).unwrap()
}

/// A server node "a" over `source`.
pub async fn start(source: Arc<dyn BlockSource>) -> ServerHandle {
    start_with(ServerConfig::new(server_id()), source).await
}

/// The bytes of test block `n`: distinct per block and per byte, with a
/// shorter last layer.
pub fn block_bytes(n: u8) -> Vec<u8> {
    let len = LAYER as usize * (LAYERS - 1) + 321;
    (0..len).map(|i| (i as u8).wrapping_mul(31) ^ n).collect()
}

/// The sums block `n` is stored with, as key `BlockHash(n)`.
pub fn sums(n: u8) -> BlockSums {
    BlockSums::compute(BlockHash(n as u128), LAYER as usize, &block_bytes(n))
}

/// A generous deadline: tests that must not time out use it.
pub fn later() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(30)
}

/// A raw connection to `server` that has done the handshake as `me`, to
/// send frames a `PeerClient` would never send.
pub async fn raw_authenticated(addr: std::net::SocketAddr, me: &Identity) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let nonce = [7u8; 32];
    let hello = Hello {
        version: PEER_VERSION,
        cluster: me.cluster.clone(),
        node: me.node.clone(),
        nonce,
    };
    write_frame(&mut s, &Frame::Hello(hello)).await.unwrap();
    let Some(Frame::HelloOk(ok)) = read_frame(&mut s).await.unwrap() else {
        panic!("no HelloOk");
    };
    let t = Transcript {
        cluster: &me.cluster,
        client: &me.node,
        server: &ok.node,
        client_nonce: &nonce,
        server_nonce: &ok.nonce,
    };
    let proof = t.proof(&me.secret, Role::Client);
    write_frame(&mut s, &Frame::Proof(proof)).await.unwrap();
    assert_eq!(read_frame(&mut s).await.unwrap(), Some(Frame::Ready));
    s
}
