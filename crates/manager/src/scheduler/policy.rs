//! [`IoPolicy`]: the scheduler's decisions as a pure state machine (no
//! I/O, no clock of its own), so every rule is tested deterministically.
//!
//! Rules, applied on every [`next`](IoPolicy::next):
//!
//! 1. Reads first: queued reads are dispatched in FIFO order up to
//!    `max_reads_in_flight`, before any write is considered. A read never
//!    waits behind a queued write.
//! 2. No read/write contention: while any read is queued or in flight,
//!    writes in flight stay within the [`WriteBudget`] (ops and bytes;
//!    zero by default: no write starts while reads are pending).
//! 3. Writes go into slack: with no read pending, writes are dispatched
//!    - when no forward pass is running (the device is idle), up to
//!      `max_writes_in_flight`;
//!    - during a forward pass, only inside a compute window (a layer is
//!      computing and nothing waits on I/O), and only as many as the
//!      learned write bandwidth says finish before the window's predicted
//!      end. Between layers, or with no estimate yet, writes wait.

use std::collections::VecDeque;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Reads (onboarding, on the critical path) or writes (offload, deferrable).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum IoClass {
    /// An onboarding read.
    Read,
    /// An offload write.
    Write,
}

/// An operation's id in the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OpId(pub u64);

/// How much writing may overlap pending reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteBudget {
    /// Write operations in flight while reads are pending. Default: 0.
    pub max_ops: usize,
    /// Write bytes in flight while reads are pending. Default: 0.
    pub max_bytes: u64,
}

/// Limits of an [`IoPolicy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyConfig {
    /// Read operations in flight (each is one batch: one layer of many
    /// blocks, or many whole blocks). Default: 4.
    pub max_reads_in_flight: usize,
    /// Write operations in flight when writes may run. Default: 4.
    pub max_writes_in_flight: usize,
    /// Writes allowed alongside pending reads. Default: none.
    pub write_budget_while_reading: WriteBudget,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            max_reads_in_flight: 4,
            max_writes_in_flight: 4,
            write_budget_while_reading: WriteBudget::default(),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Op {
    id: OpId,
    class: IoClass,
    bytes: u64,
}

/// A compute window: a layer is computing until `end` (predicted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Window {
    end: Duration,
}

/// Counters of the policy's decisions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PolicyCounters {
    /// Reads dispatched.
    pub reads_dispatched: u64,
    /// Writes dispatched.
    pub writes_dispatched: u64,
    /// Writes dispatched while reads were pending (within the budget).
    pub writes_dispatched_while_reading: u64,
    /// The most write ops in flight at once while reads were pending.
    pub max_write_ops_while_reading: u64,
    /// The most write bytes in flight at once while reads were pending.
    pub max_write_bytes_while_reading: u64,
    /// Times a queued write was held back (budget or no slack).
    pub write_deferrals: u64,
}

/// The scheduler's queues and decisions.
#[derive(Debug)]
pub struct IoPolicy {
    cfg: PolicyConfig,
    reads: VecDeque<Op>,
    writes: VecDeque<Op>,
    /// In-flight ops with their class and bytes.
    in_flight: Vec<Op>,
    forward_passes: usize,
    window: Option<Window>,
    counters: PolicyCounters,
}

impl IoPolicy {
    /// An idle policy.
    pub fn new(cfg: PolicyConfig) -> Self {
        Self {
            cfg,
            reads: VecDeque::new(),
            writes: VecDeque::new(),
            in_flight: Vec::new(),
            forward_passes: 0,
            window: None,
            counters: PolicyCounters::default(),
        }
    }

    /// Queues an operation of `bytes`.
    pub fn push(&mut self, id: OpId, class: IoClass, bytes: u64) {
        let op = Op { id, class, bytes };
        match class {
            IoClass::Read => self.reads.push_back(op),
            IoClass::Write => self.writes.push_back(op),
        }
    }

    /// Marks an in-flight operation done; returns its class and bytes.
    pub fn complete(&mut self, id: OpId) -> Option<(IoClass, u64)> {
        let i = self.in_flight.iter().position(|o| o.id == id)?;
        let op = self.in_flight.swap_remove(i);
        Some((op.class, op.bytes))
    }

    /// A forward pass started (a load is being consumed layer by layer):
    /// from now on writes need a compute window.
    pub fn begin_forward(&mut self) {
        self.forward_passes += 1;
    }

    /// A forward pass ended.
    pub fn end_forward(&mut self) {
        self.forward_passes = self.forward_passes.saturating_sub(1);
        if self.forward_passes == 0 {
            self.window = None;
        }
    }

    /// A layer started computing at `now` and is predicted to end at `end`
    /// (`None`: no prediction yet; the window then admits no write).
    pub fn open_window(&mut self, end: Option<Duration>) {
        self.window = end.map(|end| Window { end });
    }

    /// The layer finished computing.
    pub fn close_window(&mut self) {
        self.window = None;
    }

    /// Whether a read is queued or in flight.
    pub fn reads_pending(&self) -> bool {
        !self.reads.is_empty() || self.in_flight.iter().any(|o| o.class == IoClass::Read)
    }

    fn in_flight_of(&self, class: IoClass) -> (usize, u64) {
        self.in_flight
            .iter()
            .filter(|o| o.class == class)
            .fold((0, 0), |(n, b), o| (n + 1, b + o.bytes))
    }

    /// Queued (reads, writes).
    pub fn queued(&self) -> (usize, usize) {
        (self.reads.len(), self.writes.len())
    }

    /// In flight (reads, writes).
    pub fn in_flight(&self) -> (usize, usize) {
        (
            self.in_flight_of(IoClass::Read).0,
            self.in_flight_of(IoClass::Write).0,
        )
    }

    /// The counters.
    pub fn counters(&self) -> PolicyCounters {
        self.counters
    }

    /// The operations to dispatch now, reads first. `write_time` predicts
    /// how long writing some bytes takes (`None`: unknown).
    pub fn next(
        &mut self,
        now: Duration,
        write_time: impl Fn(u64) -> Option<Duration>,
    ) -> Vec<OpId> {
        let mut out = Vec::new();
        // Rule 1: reads first.
        while self.in_flight_of(IoClass::Read).0 < self.cfg.max_reads_in_flight {
            let Some(op) = self.reads.pop_front() else {
                break;
            };
            self.in_flight.push(op);
            self.counters.reads_dispatched += 1;
            out.push(op.id);
        }
        while let Some(&op) = self.writes.front() {
            if !self.write_admitted(op, now, &write_time) {
                self.counters.write_deferrals += 1;
                break;
            }
            self.writes.pop_front();
            self.in_flight.push(op);
            self.counters.writes_dispatched += 1;
            if self.reads_pending() {
                let (n, b) = self.in_flight_of(IoClass::Write);
                let c = &mut self.counters;
                c.writes_dispatched_while_reading += 1;
                c.max_write_ops_while_reading = c.max_write_ops_while_reading.max(n as u64);
                c.max_write_bytes_while_reading = c.max_write_bytes_while_reading.max(b);
            }
            out.push(op.id);
        }
        out
    }

    fn write_admitted(
        &self,
        op: Op,
        now: Duration,
        write_time: &impl Fn(u64) -> Option<Duration>,
    ) -> bool {
        let (ops, bytes) = self.in_flight_of(IoClass::Write);
        if ops >= self.cfg.max_writes_in_flight {
            return false;
        }
        // Rule 2: bounded contention with pending reads.
        if self.reads_pending() {
            let b = self.cfg.write_budget_while_reading;
            return ops < b.max_ops && bytes.saturating_add(op.bytes) <= b.max_bytes;
        }
        // Rule 3: idle device, or inside a compute window with time left.
        if self.forward_passes == 0 {
            return true;
        }
        let Some(window) = self.window else {
            return false;
        };
        let left = window.end.saturating_sub(now);
        match write_time(bytes + op.bytes) {
            Some(t) => t <= left,
            None => false,
        }
    }
}
