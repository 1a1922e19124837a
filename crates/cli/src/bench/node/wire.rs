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
    Control(ControlResult),
}

/// One row of the control table: a kind of round trip of [`CONTROL_KEYS`]
/// keys (or none), timed `samples` times in a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ControlRow {
    /// A raw Unix-socket round trip with the parent: the baseline.
    Raw,
    /// `Lookup` of no keys.
    Floor,
    /// `Lookup` of the resident keys.
    Lookup,
    /// `Reserve` + `Commit` of new keys (filled between, then removed).
    ReserveCommit,
    /// `Load` of the resident keys, then `Release`.
    Load,
}

impl ControlRow {
    /// The daemon's rows, in the order of round 0 (rotated per round).
    pub const DAEMON: [ControlRow; 4] = [
        ControlRow::Floor,
        ControlRow::Lookup,
        ControlRow::ReserveCommit,
        ControlRow::Load,
    ];

    /// Keys per sample of this row (the raw row and the floor carry none).
    pub fn keys(self) -> usize {
        match self {
            ControlRow::Raw | ControlRow::Floor => 0,
            _ => CONTROL_KEYS,
        }
    }

    /// Requests to the daemon per sample: `Reserve`, `Commit` and the
    /// `Remove` after them; `Load` and its `Release`.
    pub fn requests(self) -> usize {
        match self {
            ControlRow::Raw => 0,
            ControlRow::Floor | ControlRow::Lookup => 1,
            ControlRow::ReserveCommit => 3,
            ControlRow::Load => 2,
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
    /// `Release` of those keys.
    pub release: Vec<u64>,
    /// `Load` plus `Release`.
    pub load_release: Vec<u64>,
}

impl ControlResult {
    /// Adds another worker's samples.
    pub fn extend(&mut self, other: ControlResult) {
        self.raw.extend(other.raw);
        self.floor.extend(other.floor);
        self.lookup.extend(other.lookup);
        self.reserve.extend(other.reserve);
        self.commit.extend(other.commit);
        self.reserve_commit.extend(other.reserve_commit);
        self.load.extend(other.load);
        self.release.extend(other.release);
        self.load_release.extend(other.load_release);
    }
}
