//! The write ledger seam: [`Ledger`] keeps the open write sessions and the
//! quota charges they and the stored blocks hold.
//!
//! A frontend alone with its index keeps both in memory ([`LocalLedger`]):
//! a restart loses the sessions, and the start-up recovery removes their
//! writing locations and rebuilds the charges from the index. Frontends
//! that share a Redis/Valkey index share its ledger
//! ([`crate::RedisIndex::ledger`]): a write started on one frontend can be
//! finished on any, a frontend that dies leaves its sessions to the
//! leader's reaper, and every frontend enforces the same quota.
//!
//! Invariants every implementation keeps (docs/meta-api.md §9.1 has the
//! full list):
//! 1. A group's usage is the bytes of its stored (serving or deleting)
//!    locations plus, for each open session, `block_bytes` for each of its
//!    targets.
//! 2. [`Ledger::open`] decides and charges in one step: two frontends
//!    choosing against the same usage cannot both exceed a quota.
//! 3. A session is claimed by at most one caller at a time, for a lease
//!    ([`Ledger::claim`], [`Ledger::claim_expired`]); a caller that dies
//!    holding a claim leaves the session to be reaped once the lease ends.
//! 4. [`Ledger::close`] releases the charge of the targets that did not
//!    turn serving and forgets the session in one step, so a session's
//!    charge is released exactly once.

mod local;

use std::collections::BTreeMap;
use std::time::Duration;

pub use self::local::LocalLedger;
use crate::error::Result;
use crate::model::{BlockKey, LocationId, StorageKind};

/// Id of one write session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub u64);

impl std::fmt::Display for SessionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// Bytes in use by one group (writing + serving locations).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupUsage {
    /// All kinds together.
    pub total: u64,
    /// Per storage kind.
    pub by_kind: BTreeMap<StorageKind, u64>,
}

impl GroupUsage {
    /// Adds `bytes` on `kind`.
    pub fn add(&mut self, kind: StorageKind, bytes: u64) {
        self.total = self.total.saturating_add(bytes);
        let k = self.by_kind.entry(kind).or_default();
        *k = k.saturating_add(bytes);
    }

    /// Takes `bytes` off `kind`, never below zero.
    pub fn sub(&mut self, kind: StorageKind, bytes: u64) {
        self.total = self.total.saturating_sub(bytes);
        let k = self.by_kind.entry(kind).or_default();
        *k = k.saturating_sub(bytes);
    }
}

/// One writing location a session created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionTarget {
    /// The block.
    pub key: BlockKey,
    /// Its writing location.
    pub location: LocationId,
}

/// What an open session holds. Its quota charge is `targets.len() *
/// block_bytes` on `kind` ([`SessionRecord::charge`]), owned by the session
/// until each target turns serving.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRecord {
    /// The instance written.
    pub instance: String,
    /// Its group, charged.
    pub group: String,
    /// The storage kind charged.
    pub kind: StorageKind,
    /// Bytes of one block (every target's size).
    pub block_bytes: u64,
    /// The writing locations created.
    pub targets: Vec<SessionTarget>,
}

impl SessionRecord {
    /// The bytes the session holds charged.
    pub fn charge(&self) -> u64 {
        self.block_bytes.saturating_mul(self.targets.len() as u64)
    }
}

/// Chooses the storage kind of a new session from its group's usage (the
/// quota policy), or refuses; see [`Ledger::open`].
pub type Chooser<'a> = dyn FnMut(&GroupUsage) -> Result<StorageKind> + 'a;

/// The open write sessions and the quota ledger of one cluster.
/// Implementations must be safe to share across threads; calls are
/// synchronous and short.
pub trait Ledger: Send + Sync + std::fmt::Debug {
    /// Whether other frontends share this ledger (then the leader reaps
    /// sessions, and the charges survive a restart).
    fn is_shared(&self) -> bool;

    /// Bytes in use by `group`.
    fn usage(&self, group: &str) -> Result<GroupUsage>;

    /// Adds `bytes` to `group`'s usage on `kind` (a stored block's charge).
    fn charge(&self, group: &str, kind: StorageKind, bytes: u64) -> Result<()>;

    /// Takes `bytes` off `group`'s usage on `kind`, never below zero.
    fn release(&self, group: &str, kind: StorageKind, bytes: u64) -> Result<()>;

    /// In one step: calls `choose` with the usage of `session.group` and,
    /// unless it refuses, sets `session.kind` to the kind it chose, charges
    /// [`SessionRecord::charge`] on it and records the session as `id`,
    /// open for `timeout`. A refusal changes nothing. `choose` may be
    /// called more than once (a shared ledger retries when another
    /// frontend changed the usage meanwhile).
    fn open(
        &self,
        id: SessionId,
        session: &mut SessionRecord,
        timeout: Duration,
        choose: &mut Chooser<'_>,
    ) -> Result<()>;

    /// Replaces the record of open session `id` by `session` (the same
    /// session with fewer targets: `dropped` of them gone), releasing the
    /// charge of the dropped targets, and opens it for `timeout` from now.
    fn narrow(
        &self,
        id: SessionId,
        session: &SessionRecord,
        dropped: usize,
        timeout: Duration,
    ) -> Result<()>;

    /// Claims session `id` for `lease`: its record, or `None` when there is
    /// no such session or another caller's claim on it is in force.
    fn claim(&self, id: SessionId, lease: Duration) -> Result<Option<SessionRecord>>;

    /// Gives up a claim: the session is open again until its previous
    /// deadline (`extend` `None`) or for `extend` from now.
    fn unclaim(&self, id: SessionId, extend: Option<Duration>) -> Result<()>;

    /// Claims up to `limit` sessions whose deadline (or claim) has passed,
    /// each for `lease`.
    fn claim_expired(
        &self,
        lease: Duration,
        limit: usize,
    ) -> Result<Vec<(SessionId, SessionRecord)>>;

    /// Claims every session of `instance` that no one else holds, each for
    /// `lease` (the instance is being removed).
    fn claim_instance(
        &self,
        instance: &str,
        lease: Duration,
    ) -> Result<Vec<(SessionId, SessionRecord)>>;

    /// Forgets claimed session `id` and, in the same step, releases the
    /// charge of its targets but `served` (those that turned serving).
    fn close(&self, id: SessionId, session: &SessionRecord, served: usize) -> Result<()>;

    /// Open sessions that hold targets (sessions of grants that granted
    /// nothing are not counted: clients often never finish them).
    fn held_sessions(&self) -> Result<usize>;

    /// Whether the charges of stored blocks are in place already (a shared
    /// ledger that an earlier start rebuilt), so a start need not scan the
    /// index to rebuild them.
    fn is_built(&self) -> Result<bool>;

    /// Adds `usage` (per group, rebuilt from the index) to the ledger and
    /// marks it built, unless another frontend built it meanwhile; returns
    /// whether this call did.
    fn install(&self, usage: &BTreeMap<String, GroupUsage>) -> Result<bool>;
}
