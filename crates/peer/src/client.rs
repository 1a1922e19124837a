//! The reading side: [`PeerClient`] connects to a peer's
//! [`crate::PeerServer`], authenticates both ways, and reads blocks, each
//! verified before it is returned (docs/peer-protocol.md §5).

use std::net::SocketAddr;
use std::time::Duration;

use kvtier_core::{BlockHash, BlockSums};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout, timeout_at};

use crate::auth::{ClusterSecret, Role, Transcript, nonce};
use crate::error::PeerError;
use crate::frame::{
    BlockData, Frame, Hello, HelloOk, LayerRange, MAX_HANDSHAKE_FRAME, MAX_KEYS, PEER_VERSION,
    Read, read_frame, read_frame_up_to, write_frame,
};
use crate::incoming::{Incoming, read_reply_into};
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
        self.usable(wants.len())?;
        let result = within(deadline, self.read_owned(wants, layers)).await;
        self.broken = result.is_err();
        result
    }

    /// Like [`read`](Self::read), but each block's bytes land in
    /// `targets[i]` (the caller's buffer, a G2 slot), which must be exactly
    /// as long as the layers asked. Entry `i` is the block's sums when
    /// `targets[i]` now holds its verified bytes; `None` is a miss (the
    /// target's contents are then undefined: a failed block may have
    /// landed there before it was checked).
    pub async fn read_into(
        &mut self,
        wants: &[Want],
        layers: LayerRange,
        targets: &mut [&mut [u8]],
        deadline: Instant,
    ) -> Result<Vec<Option<BlockSums>>, PeerError> {
        if targets.len() != wants.len() {
            return Err(PeerError::Targets {
                wants: wants.len(),
                targets: targets.len(),
            });
        }
        self.usable(wants.len())?;
        let result = within(deadline, self.read_landed(wants, layers, targets)).await;
        self.broken = result.is_err();
        result
    }

    /// Whether a read of `count` keys may go ahead on this connection.
    fn usable(&self, count: usize) -> Result<(), PeerError> {
        if self.broken {
            return Err(PeerError::Broken);
        }
        if count > MAX_KEYS {
            return Err(PeerError::TooManyKeys { count });
        }
        Ok(())
    }

    async fn read_owned(
        &mut self,
        wants: &[Want],
        layers: LayerRange,
    ) -> Result<Vec<Option<BlockData>>, PeerError> {
        let req_id = self.send_read(wants, layers).await?;
        let mut out = Vec::with_capacity(wants.len());
        for (index, want) in wants.iter().enumerate() {
            let reply = match read_frame(&mut self.stream).await? {
                Some(Frame::Block(b)) => b,
                other => return Err(not_a_block(other)),
            };
            check_order(reply.req_id, reply.index, req_id, index)?;
            let verdict = (reply.found.as_ref()).map(|d| d.verify(want.key, want.expect, layers));
            let keep = self.judge(*want, verdict);
            out.push(reply.found.filter(|_| keep));
        }
        Ok(out)
    }

    async fn read_landed(
        &mut self,
        wants: &[Want],
        layers: LayerRange,
        targets: &mut [&mut [u8]],
    ) -> Result<Vec<Option<BlockSums>>, PeerError> {
        let req_id = self.send_read(wants, layers).await?;
        let mut out = Vec::with_capacity(wants.len());
        for (index, (want, target)) in wants.iter().zip(targets.iter_mut()).enumerate() {
            let (head, landed) = match read_reply_into(&mut self.stream, target).await? {
                Some(Incoming::Block { head, landed }) => (head, landed),
                Some(Incoming::Other(f)) => return Err(not_a_block(Some(f))),
                None => return Err(PeerError::Closed),
            };
            check_order(head.req_id, head.index, req_id, index)?;
            let verdict = (head.found.as_ref()).map(|(sums, layer_bytes)| {
                landed && verify(want.key, want.expect, layers, sums, *layer_bytes, target)
            });
            let keep = self.judge(*want, verdict);
            out.push(head.found.filter(|_| keep).map(|(sums, _)| sums));
        }
        Ok(out)
    }

    /// Sends a `Read` of `wants`; returns its id.
    async fn send_read(&mut self, wants: &[Want], layers: LayerRange) -> Result<u64, PeerError> {
        let req_id = self.next_req;
        self.next_req = self.next_req.wrapping_add(1);
        let keys = wants.iter().map(|w| w.key).collect();
        let request = Frame::Read(Read {
            req_id,
            layers,
            keys,
        });
        write_frame(&mut self.stream, &request).await?;
        Ok(req_id)
    }

    /// Counts a found block (`Some(verified)`) or a miss (`None`); returns
    /// whether the block is to be used.
    fn judge(&mut self, want: Want, verified: Option<bool>) -> bool {
        match verified {
            None => self.stats.missing += 1,
            Some(true) => self.stats.found += 1,
            Some(false) => {
                self.stats.corrupt += 1;
                tracing::warn!(peer = %self.peer, key = %want.key, "a block from a peer failed verification; treated as a miss");
            }
        }
        verified == Some(true)
    }
}

/// Awaits `request` until `deadline`; past it, [`PeerError::Timeout`].
async fn within<T>(
    deadline: Instant,
    request: impl Future<Output = Result<T, PeerError>>,
) -> Result<T, PeerError> {
    timeout_at(deadline, request)
        .await
        .unwrap_or(Err(PeerError::Timeout))
}

/// The reply `got` carries `req_id`'s key `index`, as P8 requires.
fn check_order(got_req: u64, got_index: u32, req_id: u64, index: usize) -> Result<(), PeerError> {
    if got_req == req_id && got_index as usize == index {
        return Ok(());
    }
    Err(PeerError::Unexpected {
        got: "a Block of another request or position",
        expected: "the next Block of the read",
    })
}

/// The error for a reply where a `Block` was due.
fn not_a_block(got: Option<Frame>) -> PeerError {
    match got {
        Some(Frame::Error(e)) => PeerError::Server {
            code: e.code,
            message: e.message,
        },
        Some(other) => unexpected(&other, "the next Block of the read"),
        None => PeerError::Closed,
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
