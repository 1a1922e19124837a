//! The messages of the node protocol and their body layouts.
//!
//! Each struct's fields are encoded in declaration order (see
//! `docs/node-protocol.md` for the byte tables).

use std::fmt;
use std::sync::Arc;

use kvtier_core::{BlockHash, BlockSums, Geometry, MAX_TIERS, TierKind};

use crate::DecodeError;
use crate::keys::{KEY_BYTES, NamespaceKey};
use crate::wire::{Reader, Wire, wire_code_enum, wire_struct};

/// A protocol version: peers talk only if their majors are equal; a minor
/// bump adds message types or trailing-compatible meaning, never changes a
/// layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProtocolVersion {
    /// Incompatible revisions.
    pub major: u16,
    /// Compatible revisions within a major.
    pub minor: u16,
}
wire_struct!(ProtocolVersion {
    major: u16,
    minor: u16
});

impl fmt::Display for ProtocolVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// What a daemon stores a client's blocks under: blocks of two namespaces
/// never mix, whatever their keys.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Namespace {
    /// Model name, as the engine names it.
    pub model: String,
    /// KV element type name (`bf16`, `fp8`, ...; see `kvtier_core::Dtype`).
    pub dtype: String,
    /// Version of the engine's KV layout; a change makes old blocks foreign.
    pub layout_version: u32,
    /// Tokens per block.
    pub block_size_tokens: u32,
    /// This client's tensor-parallel rank.
    pub tp_rank: u32,
    /// Tensor-parallel world size.
    pub tp_size: u32,
    /// Optional tenant salt: tenants with different salts never share blocks.
    pub tenant_salt: Option<Vec<u8>>,
}
wire_struct!(Namespace {
    model: String,
    dtype: String,
    layout_version: u32,
    block_size_tokens: u32,
    tp_rank: u32,
    tp_size: u32,
    tenant_salt: Option<Vec<u8>>,
});

/// Seed of [`Namespace::digest`]; frozen, since the digest names the
/// metadata-service instance a namespace's blocks are published under when
/// the client names none (docs/meta-api.md §10).
const NAMESPACE_SEED: u64 = 0x6b76_7469_6572_6e73; // "kvtierns"

impl Namespace {
    /// 128-bit digest of the namespace: xxh3-128 of its wire encoding
    /// (section 4.1 of docs/node-protocol.md), seeded with a frozen seed.
    /// It names the namespace (in instance names and logs); it is public,
    /// so it is never what keys a block: see [`KeyMap`](crate::KeyMap).
    pub fn digest(&self) -> u128 {
        let mut body = Vec::new();
        self.put(&mut body);
        xxhash_rust::xxh3::xxh3_128_with_seed(&body, NAMESPACE_SEED)
    }
}

/// The block shape a client declares; the daemon refuses one that
/// contradicts what the namespace already holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WireGeometry {
    /// Layers per block.
    pub layers: u32,
    /// Bytes per block (all layers).
    pub block_bytes: u64,
    /// Bytes per layer of one block.
    pub layer_bytes: u64,
}
wire_struct!(WireGeometry {
    layers: u32,
    block_bytes: u64,
    layer_bytes: u64,
});

impl From<&Geometry> for WireGeometry {
    fn from(g: &Geometry) -> Self {
        Self {
            layers: g.layers,
            block_bytes: g.block_bytes(),
            layer_bytes: g.layer_bytes(),
        }
    }
}

/// Client -> daemon, first frame of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// The version the client speaks; always first in the body.
    pub protocol_version: ProtocolVersion,
    /// The namespace of every block on this connection.
    pub namespace: Namespace,
    /// The block shape.
    pub geometry: WireGeometry,
    /// The metadata-service instance this client's blocks belong to in the
    /// cluster-wide view (`None`: one the daemon derives from the
    /// namespace).
    pub instance: Option<String>,
}

/// Daemon -> client: the handshake succeeded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelloOk {
    /// The version the daemon speaks; always first in the body.
    pub protocol_version: ProtocolVersion,
    /// Identifies this connection in logs and leases.
    pub session_id: u64,
    /// Name of the shared-memory arena file the client maps.
    pub shm_name: String,
    /// Bytes of the arena file.
    pub arena_len: u64,
    /// Bytes per arena slot (at least the block size).
    pub slot_size: u64,
    /// The key of the session's namespace, derived from the daemon's
    /// secret: the client maps its keys to stored keys with it
    /// ([`KeyMap`](crate::KeyMap)).
    pub namespace_key: NamespaceKey,
    /// The node's tiers, fastest first: what the tiers of a `LookupOk`
    /// name. Strictly increasing positions, at most [`MAX_TIERS`].
    pub tiers: Vec<TierInfo>,
}

/// One of the node's tiers, as `HelloOk` announces it: its position and
/// what kind of storage it is, so that a client shows a tier by its kind
/// (host memory, disk, remote) whatever position the node's configuration
/// gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TierInfo {
    /// The position.
    pub tier: Tier,
    /// What storage it is.
    pub kind: TierKind,
}
wire_struct!(TierInfo {
    tier: Tier,
    kind: TierKind
});

wire_code_enum!(TierKind {
    Device = 1,
    Memory = 2,
    Disk = 3,
    Remote = 4,
    Peer = 5,
});

/// Reads `HelloOk`'s tier list, which must be in strictly increasing
/// position: no position named twice, the order the node's, and so at most
/// [`MAX_TIERS`] entries. Its allocation is bounded by the frame, as any
/// list's (I3).
fn get_tier_list(r: &mut Reader<'_>) -> Result<Vec<TierInfo>, DecodeError> {
    let tiers = Vec::<TierInfo>::get(r)?;
    if tiers.windows(2).any(|w| w[0].tier >= w[1].tier) {
        return Err(r.malformed("tier list not in strictly increasing position"));
    }
    debug_assert!(tiers.len() <= MAX_TIERS);
    Ok(tiers)
}

impl Wire for NamespaceKey {
    const MIN_SIZE: usize = KEY_BYTES;
    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let mut bytes = [0u8; KEY_BYTES];
        bytes.copy_from_slice(r.take(KEY_BYTES)?);
        Ok(Self::from_bytes(bytes))
    }
}

/// Handshake messages start with the version and are decoded only when its
/// major matches, because another major may lay out the rest differently.
fn get_version(r: &mut Reader<'_>) -> Result<ProtocolVersion, DecodeError> {
    let got = ProtocolVersion::get(r)?;
    if got.major != crate::PROTOCOL_VERSION.major {
        return Err(DecodeError::WrongVersion {
            got,
            supported: crate::PROTOCOL_VERSION,
        });
    }
    Ok(got)
}

impl Wire for Hello {
    const MIN_SIZE: usize = ProtocolVersion::MIN_SIZE
        + Namespace::MIN_SIZE
        + WireGeometry::MIN_SIZE
        + Option::<String>::MIN_SIZE;
    fn put(&self, out: &mut Vec<u8>) {
        self.protocol_version.put(out);
        self.namespace.put(out);
        self.geometry.put(out);
        self.instance.put(out);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let protocol_version = get_version(r)?;
        let namespace = Namespace::get(r)?;
        let geometry = WireGeometry::get(r)?;
        let instance = Option::<String>::get(r)?;
        Ok(Self {
            protocol_version,
            namespace,
            geometry,
            instance,
        })
    }
}

impl Wire for HelloOk {
    const MIN_SIZE: usize = ProtocolVersion::MIN_SIZE + 8 + 4 + 8 + 8 + KEY_BYTES + 4;
    fn put(&self, out: &mut Vec<u8>) {
        self.protocol_version.put(out);
        self.session_id.put(out);
        self.shm_name.put(out);
        self.arena_len.put(out);
        self.slot_size.put(out);
        self.namespace_key.put(out);
        self.tiers.put(out);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Self {
            protocol_version: get_version(r)?,
            session_id: u64::get(r)?,
            shm_name: String::get(r)?,
            arena_len: u64::get(r)?,
            slot_size: u64::get(r)?,
            namespace_key: NamespaceKey::get(r)?,
            tiers: get_tier_list(r)?,
        })
    }
}

/// A batched request naming blocks: `Lookup`, `Reserve`, `Abort`, `Load`,
/// `Release` and `Remove` all have this body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeysRequest {
    /// Chosen by the client; echoed in every reply and notification.
    pub request_id: u64,
    /// The blocks, in the client's order (a sequence's prefix order for
    /// `Lookup`).
    pub keys: Vec<BlockHash>,
}
wire_struct!(KeysRequest { request_id: u64, keys: Vec<BlockHash> });

/// The tier a block is held in: kvtier-core's [`Tier`], a position in the
/// node's ordered tier list and the one tier type of the block manager, the
/// wire and the Python binding. On the wire it is one byte, the position
/// plus one (`G1` = 1, `G2` = 2 ...; docs/node-protocol.md).
pub use kvtier_core::Tier;

impl Wire for Tier {
    const MIN_SIZE: usize = 1;
    fn put(&self, out: &mut Vec<u8>) {
        // A position is below MAX_TIERS (8), so position + 1 fits a byte.
        out.push(self.index() as u8 + 1);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let code = u8::get(r)?;
        (code as usize)
            .checked_sub(1)
            .and_then(Tier::at)
            .ok_or_else(|| r.malformed("unknown Tier code"))
    }
}

/// Reply to `Lookup`: the longest stored prefix of the keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookupOk {
    /// The request's id.
    pub request_id: u64,
    /// The tier of each block of the prefix, one of the tiers `HelloOk`
    /// listed (a client refuses another); its length is the prefix length,
    /// so the two cannot disagree.
    pub tiers: Vec<Tier>,
}
wire_struct!(LookupOk { request_id: u64, tiers: Vec<Tier> });

impl LookupOk {
    /// How many leading keys are stored.
    pub fn prefix_len(&self) -> usize {
        self.tiers.len()
    }
}

/// A byte range of the arena file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Slot {
    /// Offset from the start of the arena file.
    pub offset: u64,
    /// Length in bytes (the block size).
    pub len: u64,
}
wire_struct!(Slot {
    offset: u64,
    len: u64
});

/// What `Reserve` gives for one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReserveResult {
    /// Fill this slot, then `Commit` (or `Abort`). Tag 0.
    Slot(Slot),
    /// The block is stored already; nothing to write. Tag 1.
    AlreadyStored,
    /// Another client is storing it now; it is stored once. Tag 2.
    InFlightElsewhere,
    /// No slot free now. Tag 3.
    NoSpace,
}

impl Wire for ReserveResult {
    const MIN_SIZE: usize = 1;
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            Self::Slot(slot) => {
                out.push(0);
                slot.put(out);
            }
            Self::AlreadyStored => out.push(1),
            Self::InFlightElsewhere => out.push(2),
            Self::NoSpace => out.push(3),
        }
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match u8::get(r)? {
            0 => Ok(Self::Slot(Slot::get(r)?)),
            1 => Ok(Self::AlreadyStored),
            2 => Ok(Self::InFlightElsewhere),
            3 => Ok(Self::NoSpace),
            _ => Err(r.malformed("unknown ReserveResult tag")),
        }
    }
}

/// Reply to `Reserve`: one result per key, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReserveOk {
    /// The request's id.
    pub request_id: u64,
    /// One per requested key.
    pub results: Vec<ReserveResult>,
}
wire_struct!(ReserveOk { request_id: u64, results: Vec<ReserveResult> });

/// One block of a `Commit`: its key and the checksums of the bytes the
/// client wrote (see `kvtier_core::BlockSums`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitEntry {
    /// The block.
    pub key: BlockHash,
    /// Combined checksum and one checksum per layer.
    pub sums: BlockSums,
}

impl Wire for CommitEntry {
    const MIN_SIZE: usize = 16 + 8 + 4;
    fn put(&self, out: &mut Vec<u8>) {
        self.key.put(out);
        self.sums.block.put(out);
        self.sums.layers.put(out);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let key = BlockHash::get(r)?;
        let block = u64::get(r)?;
        let layers = Vec::<u64>::get(r)?;
        Ok(Self {
            key,
            sums: BlockSums { block, layers },
        })
    }
}

/// Client -> daemon: make reserved, filled slots readable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    /// Chosen by the client.
    pub request_id: u64,
    /// The blocks with their checksums.
    pub entries: Vec<CommitEntry>,
}
wire_struct!(Commit { request_id: u64, entries: Vec<CommitEntry> });

/// What `Commit` did with one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CommitResult {
    /// Stored and readable.
    Stored,
    /// Another copy was stored first; this one was dropped.
    AlreadyStored,
    /// This client holds no reservation for the key.
    NotReserved,
    /// The checksums are inconsistent or do not match the bytes; nothing
    /// was stored.
    BadChecksum,
}
wire_code_enum!(CommitResult {
    Stored = 0,
    AlreadyStored = 1,
    NotReserved = 2,
    BadChecksum = 3,
});

/// Reply to `Commit`: one result per entry, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitOk {
    /// The request's id.
    pub request_id: u64,
    /// One per entry.
    pub results: Vec<CommitResult>,
}
wire_struct!(CommitOk { request_id: u64, results: Vec<CommitResult> });

/// What `Load` gives for one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadResult {
    /// Arriving from a lower tier into this slot, pinned for the client
    /// until `Release`; each layer's checksums come with its `LayerReady`.
    /// Tag 0.
    Arriving(Slot),
    /// Not stored, or failed verification. Tag 1.
    Miss,
    /// Resident in this slot, pinned for the client until `Release`, with
    /// the checksums the daemon holds for it: what the client verifies
    /// its copy against. Tag 2. Shared, so the daemon answers with the
    /// sums it holds rather than a copy per load.
    Resident(Slot, Arc<BlockSums>),
}

impl LoadResult {
    /// The slot, unless a miss.
    pub fn slot(&self) -> Option<Slot> {
        match self {
            Self::Arriving(slot) | Self::Resident(slot, _) => Some(*slot),
            Self::Miss => None,
        }
    }

    /// The block's checksums, when the answer carried them (resident).
    pub fn sums(&self) -> Option<&BlockSums> {
        match self {
            Self::Resident(_, sums) => Some(sums),
            Self::Arriving(_) | Self::Miss => None,
        }
    }
}

impl Wire for LoadResult {
    const MIN_SIZE: usize = 1;
    fn put(&self, out: &mut Vec<u8>) {
        match self {
            Self::Arriving(slot) => {
                out.push(0);
                slot.put(out);
            }
            Self::Miss => out.push(1),
            Self::Resident(slot, sums) => {
                out.push(2);
                slot.put(out);
                sums.block.put(out);
                sums.layers.put(out);
            }
        }
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match u8::get(r)? {
            0 => Ok(Self::Arriving(Slot::get(r)?)),
            1 => Ok(Self::Miss),
            2 => {
                let slot = Slot::get(r)?;
                let block = u64::get(r)?;
                let layers = Vec::<u64>::get(r)?;
                Ok(Self::Resident(slot, Arc::new(BlockSums { block, layers })))
            }
            _ => Err(r.malformed("unknown LoadResult tag")),
        }
    }
}

/// Reply to `Load`: one result per key; `LayerReady` notifications follow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadOk {
    /// The request's id.
    pub request_id: u64,
    /// One per requested key.
    pub results: Vec<LoadResult>,
}
wire_struct!(LoadOk { request_id: u64, results: Vec<LoadResult> });

/// Daemon -> client: layers `0..=layer` of the first `sums.len()` slots
/// of a `Load` are in place and were verified; the slots after them failed
/// and are misses from now on. `sums[i]` is the checksum of layer `layer`
/// of slot `i`, which a reader verifies the layer's bytes against (a block
/// still arriving has no checksums in the slot table yet).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LayerReady {
    /// The `Load` request's id.
    pub request_id: u64,
    /// The highest layer now ready.
    pub layer: u32,
    /// Layer `layer`'s checksum of each leading slot still good.
    pub sums: Vec<u64>,
}
wire_struct!(LayerReady {
    request_id: u64,
    layer: u32,
    sums: Vec<u64>
});

/// Client -> daemon: ask for the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stats {
    /// Chosen by the client.
    pub request_id: u64,
}
wire_struct!(Stats { request_id: u64 });

/// One named counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Counter {
    /// Name, e.g. `g2_blocks`; new names need no new version.
    pub name: String,
    /// Value.
    pub value: u64,
}
wire_struct!(Counter {
    name: String,
    value: u64
});

/// Reply to `Stats`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsOk {
    /// The request's id.
    pub request_id: u64,
    /// The counters.
    pub counters: Vec<Counter>,
}
wire_struct!(StatsOk { request_id: u64, counters: Vec<Counter> });

/// Reply to `Abort`, `Release` and `Remove`: done for every key (keys not
/// held or not stored are ignored).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ack {
    /// The request's id.
    pub request_id: u64,
}
wire_struct!(Ack { request_id: u64 });

/// Daemon -> client, before `HelloOk` (4.2): the node is still opening
/// for this client's `Hello` (the first engine of a node without a shape
/// makes its arena and disk tier, which on a new disk tier means writing
/// its whole data file). Sent every [`OPENING_INTERVAL_MS`] while the open
/// lasts, only to clients that announced 4.2; the client keeps waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Opening {
    /// Milliseconds since the daemon read this client's `Hello`.
    pub elapsed_ms: u64,
}
wire_struct!(Opening { elapsed_ms: u64 });

/// How often the daemon sends [`Opening`] while a node opens: well under a
/// client's default timeout (10 s), which each `Opening` restarts.
pub const OPENING_INTERVAL_MS: u64 = 1000;

/// An error code; unknown codes from a newer peer decode as they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ErrorCode(pub u16);

impl Wire for ErrorCode {
    const MIN_SIZE: usize = 2;
    fn put(&self, out: &mut Vec<u8>) {
        self.0.put(out);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Self(u16::get(r)?))
    }
}

impl ErrorCode {
    /// The frame did not decode; the connection is closed after this reply.
    pub const BAD_FRAME: Self = Self(1);
    /// The client's major version is not spoken; the connection is closed.
    pub const WRONG_VERSION: Self = Self(2);
    /// A request came before a successful `Hello`, or a second `Hello`.
    pub const HANDSHAKE: Self = Self(3);
    /// The geometry contradicts the namespace's; the connection is closed.
    pub const GEOMETRY_MISMATCH: Self = Self(4);
    /// The message is valid but not one a daemon accepts (a reply type).
    pub const UNEXPECTED: Self = Self(5);
    /// The daemon could not serve the request (I/O failure, shutting down).
    pub const INTERNAL: Self = Self(6);
    /// A request the daemon refuses as asked (too many keys, a duplicate
    /// key in one batch); the connection stays open.
    pub const BAD_REQUEST: Self = Self(7);
    /// The daemon cannot take this connection now (its connection cap, or
    /// out of file descriptors); sent before `Hello` is read, and the
    /// connection is closed. Connect again later.
    pub const BUSY: Self = Self(8);
}

/// An error reply. `request_id` is 0 for a handshake or framing error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// The failed request's id, or 0.
    pub request_id: u64,
    /// What kind of failure.
    pub code: ErrorCode,
    /// Human-readable detail.
    pub message: String,
}
wire_struct!(Error {
    request_id: u64,
    code: ErrorCode,
    message: String,
});

#[cfg(test)]
mod tests {
    use super::*;

    /// Memory per wire byte of a list element: what bounds a decoder's
    /// allocation per body byte (docs/node-protocol.md, I3).
    fn ratio<T: Wire>() -> usize {
        size_of::<T>().div_ceil(T::MIN_SIZE)
    }

    #[test]
    fn requests_allocate_at_most_two_bytes_per_body_byte() {
        assert!(ratio::<BlockHash>() <= 2);
        assert!(ratio::<CommitEntry>() <= 2);
        assert!(ratio::<u64>() <= 2);
        assert!(ratio::<u8>() <= 2);
    }

    #[test]
    fn replies_allocate_at_most_24_bytes_per_body_byte() {
        for r in [
            ratio::<Tier>(),
            ratio::<TierInfo>(),
            ratio::<ReserveResult>(),
            ratio::<CommitResult>(),
            ratio::<Counter>(),
        ] {
            assert!(r <= 24, "{r}");
        }
    }

    #[test]
    fn load_results_allocate_at_most_64_bytes_per_body_byte() {
        // A 1-byte `Miss` tag decodes into a value that can hold a
        // resident block's slot and checksums.
        assert!(ratio::<LoadResult>() <= 64, "{}", ratio::<LoadResult>());
    }
}
