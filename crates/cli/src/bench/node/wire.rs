//! What the parent of `kvtier bench node` and its worker processes say to
//! each other: one [`Command`] per line on the worker's stdin, one
//! [`Reply`] per line on its stdout, both JSON. The parent sends a command
//! to every worker before reading any reply, so all workers run each phase
//! at the same time and the daemon's CPU over the phase is theirs alone.

use serde::{Deserialize, Serialize};

/// Keys per control round trip (the "batch of 64 keys").
pub const CONTROL_KEYS: usize = 64;

/// One phase for every worker to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Command {
    /// Copy every source block into its destination buffer, one thread.
    Memcpy,
    /// Store every source block through the daemon.
    Store,
    /// Load every block back into the destination buffers, verified.
    Load,
    /// Remove the stored blocks (untimed; makes the next store a store).
    Remove,
    /// Store the resident blocks the control rows look up and load.
    ControlBegin,
    /// Time `samples` round trips of one control row.
    Control {
        /// The row.
        row: ControlRow,
        /// Round trips to time.
        samples: usize,
    },
    /// Release the loads and remove the blocks the last control row left
    /// (outside the row's timed window and its daemon CPU).
    ControlTidy,
    /// Remove the resident blocks.
    ControlEnd,
    /// Leave.
    Exit,
}

/// A worker's answer to one command (or its greeting).
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    /// Connected, buffers allocated and touched: ready for commands.
    Ready,
    /// Figures of a data phase.
    Phase(PhaseResult),
    /// The blocks were removed.
    Removed,
    /// The resident blocks are stored (or removed).
    ControlReady,
    /// Latencies of the control round trips.
    Control(Box<ControlResult>),
}

/// One row of the control table: a kind of round trip of [`CONTROL_KEYS`]
/// keys (or none), timed `samples` times in a row. Each daemon row times
/// exactly the requests an engine waits on for that operation; each has a
/// raw-socket row with as many round trips of about its message sizes
/// ([`ControlRow::baseline`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ControlRow {
    /// One raw Unix-socket round trip of 64 bytes each way with the
    /// parent: the machine's floor.
    Raw,
    /// The raw baseline of [`ControlRow::Lookup`]: one round trip of its
    /// request's and reply's sizes.
    RawLookup,
    /// The raw baseline of [`ControlRow::ReserveCommit`]: two round trips
    /// of the `Reserve`'s and the `Commit`'s sizes.
    RawReserveCommit,
    /// The raw baseline of [`ControlRow::Load`]: one round trip of its
    /// request's and `LoadOk`'s sizes.
    RawLoad,
    /// `Lookup` of no keys.
    Floor,
    /// `Lookup` of the resident keys.
    Lookup,
    /// `Reserve` + `Commit` of new keys (filled between; removed after
    /// the row, untimed).
    ReserveCommit,
    /// `Load` of the resident keys to the last `LayerReady` (released
    /// after the row, untimed: an engine does not wait on its `Release`).
    Load,
}

/// Bytes of a key on the wire.
const KEY_BYTES: usize = 16;
/// Bytes of a message's header (length, tag, request id), about.
const HEADER_BYTES: usize = 16;

impl ControlRow {
    /// The daemon's rows, in the order of round 0 (rotated per round).
    pub const DAEMON: [ControlRow; 4] = [
        ControlRow::Floor,
        ControlRow::Lookup,
        ControlRow::ReserveCommit,
        ControlRow::Load,
    ];

    /// The raw-socket rows, in the order of round 0 (rotated per round).
    pub const RAW: [ControlRow; 4] = [
        ControlRow::Raw,
        ControlRow::RawLookup,
        ControlRow::RawReserveCommit,
        ControlRow::RawLoad,
    ];

    /// Keys per sample of this row (the raw rows and the floor carry none).
    pub fn keys(self) -> usize {
        match self {
            ControlRow::Lookup | ControlRow::ReserveCommit | ControlRow::Load => CONTROL_KEYS,
            _ => 0,
        }
    }

    /// Requests to the daemon per sample: `Reserve` and `Commit`; one
    /// `Lookup` or `Load`.
    pub fn requests(self) -> usize {
        match self {
            ControlRow::Floor | ControlRow::Lookup | ControlRow::Load => 1,
            ControlRow::ReserveCommit => 2,
            _ => 0,
        }
    }

    /// The raw-socket row a daemon row of keys is compared with.
    pub fn baseline(self) -> Option<ControlRow> {
        match self {
            ControlRow::Lookup => Some(ControlRow::RawLookup),
            ControlRow::ReserveCommit => Some(ControlRow::RawReserveCommit),
            ControlRow::Load => Some(ControlRow::RawLoad),
            _ => None,
        }
    }

    /// The round trips of a raw row, (request, reply) bytes each: about
    /// the encoded sizes of the daemon row it stands for, with blocks of
    /// `layers` layers (a key 16 bytes, a checksum 8, a slot 24).
    pub fn raw_trips(self, layers: u32) -> Vec<(usize, usize)> {
        let n = CONTROL_KEYS;
        let keys = HEADER_BYTES + n * KEY_BYTES;
        let sums = 8 + 4 + 8 * layers as usize;
        match self {
            ControlRow::Raw => vec![(64, 64)],
            ControlRow::RawLookup => vec![(keys, HEADER_BYTES + n)],
            ControlRow::RawReserveCommit => vec![
                (keys, HEADER_BYTES + n * 24),
                (HEADER_BYTES + n * (KEY_BYTES + sums), HEADER_BYTES + n),
            ],
            ControlRow::RawLoad => vec![(keys, HEADER_BYTES + n * (24 + sums))],
            _ => Vec::new(),
        }
    }
}

/// What one worker measured over one data phase.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct PhaseResult {
    /// Blocks moved.
    pub blocks: u64,
    /// Bytes moved.
    pub bytes: u64,
    /// Wall time of the phase, nanoseconds.
    pub wall_ns: u64,
    /// The worker's CPU time (user + system) over the phase, nanoseconds.
    pub cpu_ns: u64,
    /// Minor page faults the worker took over the phase.
    pub minor_faults: u64,
}

/// Per-round-trip latencies of one worker's control phase, nanoseconds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ControlResult {
    /// A raw Unix-socket round trip with the parent (no protocol, no
    /// runtime): the machine's floor.
    pub raw: Vec<u64>,
    /// The raw baseline of `Lookup` (one round trip of its sizes).
    pub raw_lookup: Vec<u64>,
    /// The raw baseline of `Reserve` + `Commit` (two round trips).
    pub raw_reserve_commit: Vec<u64>,
    /// The raw baseline of `Load` (one round trip of its sizes).
    pub raw_load: Vec<u64>,
    /// `Lookup` of no keys: the protocol's round trip itself, the floor
    /// under every other row.
    pub floor: Vec<u64>,
    /// `Lookup` of resident keys.
    pub lookup: Vec<u64>,
    /// `Reserve` of new keys.
    pub reserve: Vec<u64>,
    /// `Commit` of those keys once filled.
    pub commit: Vec<u64>,
    /// `Reserve` plus `Commit` (the fill between them not counted).
    pub reserve_commit: Vec<u64>,
    /// `Load` of resident keys up to its last `LayerReady`.
    pub load: Vec<u64>,
    /// `Release` of those keys (after the row, outside its window).
    pub release: Vec<u64>,
}

impl ControlResult {
    /// Adds another worker's samples.
    pub fn extend(&mut self, other: ControlResult) {
        self.raw.extend(other.raw);
        self.raw_lookup.extend(other.raw_lookup);
        self.raw_reserve_commit.extend(other.raw_reserve_commit);
        self.raw_load.extend(other.raw_load);
        self.floor.extend(other.floor);
        self.lookup.extend(other.lookup);
        self.reserve.extend(other.reserve);
        self.commit.extend(other.commit);
        self.reserve_commit.extend(other.reserve_commit);
        self.load.extend(other.load);
        self.release.extend(other.release);
    }

    /// The samples of a raw row.
    pub fn raw_series(&mut self, row: ControlRow) -> &mut Vec<u64> {
        match row {
            ControlRow::RawLookup => &mut self.raw_lookup,
            ControlRow::RawReserveCommit => &mut self.raw_reserve_commit,
            ControlRow::RawLoad => &mut self.raw_load,
            _ => &mut self.raw,
        }
    }
}
