//! The reading side: [`PeerClient`] connects to a peer's
//! [`crate::PeerServer`], authenticates both ways, and reads blocks, each
//! verified before it is returned (docs/peer-protocol.md §5).

use std::net::SocketAddr;
use std::time::Duration;

use kvtier_core::BlockHash;
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout, timeout_at};

use crate::auth::{ClusterSecret, Role, Transcript, nonce};
use crate::error::PeerError;
use crate::frame::{
    BlockData, BlockReply, Frame, Hello, HelloOk, LayerRange, MAX_HANDSHAKE_FRAME, MAX_KEYS,
    PEER_VERSION, Read, read_frame, read_frame_up_to, write_frame,
};
use crate::verify::{Expect, verify};

/// Who this node is in its cluster: what both ends of a connection prove.
#[derive(Debug, Clone)]
pub struct Identity {
    /// The cluster's name; peers of other clusters are refused.
    pub cluster: String,
    /// This node's name, as the cluster knows it.
    pub node: String,
    /// The secret every node of the cluster holds.
    pub secret: ClusterSecret,
}

/// One block a read asks for, and what the reader trusts about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Want {
    /// The block.
    pub key: BlockHash,
    /// What its bytes must match.
    pub expect: Expect,
}

/// What a client's reads found, counted over its life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Blocks returned, verified.
    pub found: u64,
    /// Blocks the peer does not hold.
    pub missing: u64,
    /// Blocks the peer sent that failed verification (returned as misses).
    pub corrupt: u64,
}

/// An authenticated connection to one peer. One request at a time; a
/// connection whose request failed or timed out is not used again (a late
/// reply could still be on its way), so every later call answers
/// [`PeerError::Broken`]: connect anew.
#[derive(Debug)]
pub struct PeerClient {
    stream: TcpStream,
    peer: String,
    next_req: u64,
    broken: bool,
    stats: ReadStats,
}

impl PeerClient {
    /// Connects to `addr` and runs the handshake as `me`, all within
    /// `within`.
    pub async fn connect(
        addr: SocketAddr,
        me: &Identity,
        within: Duration,
    ) -> Result<Self, PeerError> {
        let open = async {
            let mut stream = TcpStream::connect(addr).await?;
            // Requests are single small frames; don't hold them back.
            stream.set_nodelay(true)?;
            let peer = handshake(&mut stream, me).await?;
            Ok(Self {
                stream,
                peer,
                next_req: 0,
                broken: false,
                stats: ReadStats::default(),
            })
        };
        timeout(within, open)
            .await
            .map_err(|_| PeerError::Timeout)?
    }

    /// The peer's node name, as it proved it.
    pub fn peer_node(&self) -> &str {
        &self.peer
    }

    /// What this client's reads found so far.
    pub fn stats(&self) -> ReadStats {
        self.stats
    }

    /// Reads `wants`, each for the layers `layers`, by `deadline`: one
    /// entry per want, in order, `None` where the peer has no such block or
    /// sent one that failed verification. Past the deadline the request
    /// fails with [`PeerError::Timeout`] (and the connection is broken).
    pub async fn read(
        &mut self,
        wants: &[Want],
        layers: LayerRange,
        deadline: Instant,
    ) -> Result<Vec<Option<BlockData>>, PeerError> {
        if self.broken {
            return Err(PeerError::Broken);
        }
        if wants.len() > MAX_KEYS {
            return Err(PeerError::TooManyKeys { count: wants.len() });
        }
        let result = match timeout_at(deadline, self.exchange(wants, layers)).await {
            Ok(r) => r,
            Err(_) => Err(PeerError::Timeout),
        };
        self.broken = result.is_err();
        result
    }

    /// Sends one `Read` and takes its replies, one per key in order.
    async fn exchange(
        &mut self,
        wants: &[Want],
        layers: LayerRange,
    ) -> Result<Vec<Option<BlockData>>, PeerError> {
        let req_id = self.next_req;
        self.next_req += 1;
        let keys = wants.iter().map(|w| w.key).collect();
        let request = Frame::Read(Read {
            req_id,
            layers,
            keys,
        });
        write_frame(&mut self.stream, &request).await?;
        let mut out = Vec::with_capacity(wants.len());
        for (index, want) in wants.iter().enumerate() {
            let reply = self.next_block(req_id, index as u32).await?;
            out.push(self.accept(*want, layers, reply.found));
        }
        Ok(out)
    }

    /// The next reply frame, which must be `Block` `index` of `req_id`.
    async fn next_block(&mut self, req_id: u64, index: u32) -> Result<BlockReply, PeerError> {
        match read_frame(&mut self.stream).await? {
            Some(Frame::Block(b)) if b.req_id == req_id && b.index == index => Ok(b),
            Some(Frame::Error(e)) => Err(PeerError::Server {
                code: e.code,
                message: e.message,
            }),
            Some(other) => Err(unexpected(&other, "the next Block of the read")),
            None => Err(PeerError::Closed),
        }
    }

    /// A block the peer sent, if it verifies; counted either way.
    fn accept(
        &mut self,
        want: Want,
        layers: LayerRange,
        found: Option<BlockData>,
    ) -> Option<BlockData> {
        let Some(data) = found else {
            self.stats.missing += 1;
            return None;
        };
        if verify(want.key, want.expect, layers, &data) {
            self.stats.found += 1;
            return Some(data);
        }
        self.stats.corrupt += 1;
        tracing::warn!(peer = %self.peer, key = %want.key, "a block from a peer failed verification; treated as a miss");
        None
    }
}

fn unexpected(got: &Frame, expected: &'static str) -> PeerError {
    PeerError::Unexpected {
        got: got.name(),
        expected,
    }
}

/// The client's half of the handshake; returns the server's node name
/// once it has proved it holds the secret and accepted our proof.
async fn handshake(stream: &mut TcpStream, me: &Identity) -> Result<String, PeerError> {
    let ours = nonce();
    let hello = Hello {
        version: PEER_VERSION,
        cluster: me.cluster.clone(),
        node: me.node.clone(),
        nonce: ours,
    };
    write_frame(stream, &Frame::Hello(hello)).await?;
    let ok = expect_hello_ok(stream).await?;
    let t = Transcript {
        cluster: &me.cluster,
        client: &me.node,
        server: &ok.node,
        client_nonce: &ours,
        server_nonce: &ok.nonce,
    };
    if !t.verify(&me.secret, Role::Server, &ok.proof) {
        // Say nothing more: the stream closes when the caller drops it.
        return Err(PeerError::AuthFailed { node: ok.node });
    }
    write_frame(stream, &Frame::Proof(t.proof(&me.secret, Role::Client))).await?;
    match read_frame_up_to(stream, MAX_HANDSHAKE_FRAME).await? {
        Some(Frame::Ready) => Ok(ok.node),
        other => Err(handshake_failure(other, "Ready")),
    }
}

async fn expect_hello_ok(stream: &mut TcpStream) -> Result<HelloOk, PeerError> {
    match read_frame_up_to(stream, MAX_HANDSHAKE_FRAME).await? {
        Some(Frame::HelloOk(ok)) if ok.version.major != PEER_VERSION.major => {
            Err(PeerError::WrongVersion {
                got: ok.version,
                ours: PEER_VERSION,
            })
        }
        Some(Frame::HelloOk(ok)) => Ok(ok),
        other => Err(handshake_failure(other, "HelloOk")),
    }
}

/// The error for a handshake reply other than the one due.
fn handshake_failure(got: Option<Frame>, expected: &'static str) -> PeerError {
    match got {
        Some(Frame::Refused(r)) => PeerError::Refused {
            reason: r.reason,
            message: r.message,
        },
        Some(other) => unexpected(&other, expected),
        None => PeerError::Closed,
    }
}
