//! [`MetaService`]: the in-process metadata service (Tair KVCM's
//! CacheManager), independent of any transport.
//!
//! Invariants it keeps:
//! 1. A key with a writing or serving location is never granted for writing
//!    (the check and the insert of the writing location are one
//!    [`MetaIndex::modify`]).
//! 2. Only serving locations are returned by reads.
//! 3. A refused write (quota, no storage) changes nothing.
//! 4. Every granted byte is charged to the group until its location is
//!    removed or its write fails or times out; a session owns the charge of
//!    its targets until they turn serving. Sessions and charges live in the
//!    [`Ledger`]: this process's memory, or shared with the other
//!    frontends of a shared index.
//!
//! Index calls are synchronous and short; they run on the calling task.

mod access;
mod accounts;
mod admin;
mod backends;
mod catalog;
mod leader_work;
mod publish;
mod quota;
mod read;
mod reclaim;
mod refresh;
mod remove;
mod search_cache;
mod snapshot;
mod storage_admin;
mod types;
mod write;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use self::access::AccessBuffer;
pub use self::accounts::{ApiKey, MIN_API_KEY_LEN, Principal};
use self::admin::AdminState;
pub use self::admin::{
    AdminCounters, DEFAULT_GROUP, GroupStats, HealthReport, MAX_NAME_BYTES, MetaStats,
    StorageStatus,
};
use self::backends::Backends;
pub use self::backends::{BackendStats, HealthCheckerHandle};
use self::catalog::Catalog;
pub use self::catalog::stored_accounts;
pub use self::leader_work::{LeaderWorkHandle, LeaderWorkIntervals};
pub use self::publish::PublishedPart;
use self::reclaim::ReclaimCounters;
pub use self::reclaim::{GroupReclaim, ReclaimReport, ReclaimStats, ReclaimerHandle};
pub use self::refresh::CatalogRefresherHandle;
use self::search_cache::SearchCache;
pub use self::snapshot::ConfigSnapshot;
pub use self::types::{
    FinishSummary, LocationMatch, LocationQuery, MetaConfig, ReaperHandle, TrimPolicy, WriteGrant,
    WriteTarget,
};
use crate::error::{MetaError, Result};
use crate::index::{MetaIndex, Modify};
pub use crate::ledger::{GroupUsage, SessionId};
use crate::ledger::{Ledger, LocalLedger};
use crate::model::{BlockKey, Instance, InstanceGroup, LocationStatus, Storage, StorageKind};

/// The metadata service.
#[derive(Debug)]
pub struct MetaService {
    index: Arc<dyn MetaIndex>,
    config: MetaConfig,
    catalog: Catalog,
    /// Open write sessions and quota charges.
    ledger: Arc<dyn Ledger>,
    /// Counters of administrative events (see `admin`).
    admin: AdminState,
    /// Serving locations per (instance, key), in front of the index.
    search_cache: SearchCache,
    /// Read hits not yet applied to the index.
    access: Arc<AccessBuffer>,
    /// Totals of the reclaimer, for metrics.
    reclaimed: ReclaimCounters,
    /// Data storage backends attached to storages (see `backends`).
    backends: Backends,
    /// Source of session and location ids; starts at a random point so ids
    /// from before a restart are not reissued.
    next_id: AtomicU64,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl MetaService {
    /// Opens the service over `index` with a ledger in this process's
    /// memory (a frontend alone with its index): loads the catalog, removes
    /// writing locations left by a previous run (their sessions are gone;
    /// with [`MetaConfig::orphan_write_age`], only those that old) and
    /// rebuilds quota usage. This scans every block record once.
    pub fn new(index: Arc<dyn MetaIndex>, config: MetaConfig) -> Result<Self> {
        Self::with_ledger(index, Arc::new(LocalLedger::new()), config)
    }

    /// Opens the service over `index` and `ledger` (for several frontends
    /// over one Redis/Valkey index, [`crate::RedisIndex::ledger`]). The
    /// start-up recovery of [`MetaService::new`] runs only while the ledger
    /// is not built: a shared ledger that holds the charges already, with
    /// the sessions of every frontend, needs no scan.
    pub fn with_ledger(
        index: Arc<dyn MetaIndex>,
        ledger: Arc<dyn Ledger>,
        config: MetaConfig,
    ) -> Result<Self> {
        let catalog = Catalog::load(index.as_ref())?;
        let svc = MetaService {
            index,
            search_cache: SearchCache::new(config.search_cache_entries, config.search_cache_ttl),
            access: Arc::new(AccessBuffer::new(config.access_flush_keys)),
            reclaimed: ReclaimCounters::default(),
            backends: Backends::default(),
            config,
            catalog,
            ledger,
            admin: AdminState::default(),
            next_id: AtomicU64::new(rand::random::<u64>() >> 1),
        };
        if !svc.ledger.is_built()? {
            svc.recover()?;
        }
        Ok(svc)
    }

    /// Removes orphaned writing locations, rebuilds every group's usage
    /// from the index, and installs it in the ledger (unless another
    /// frontend did meanwhile).
    fn recover(&self) -> Result<()> {
        let mut usage = BTreeMap::new();
        self.for_each_page(|inst, keys| self.recover_chunk(inst, keys, &mut usage))?;
        if !self.ledger.install(&usage)? {
            tracing::info!("another frontend rebuilt the quota ledger first; keeping its charges");
        }
        Ok(())
    }

    /// Calls `f` with every instance and its block keys, in pages of up to
    /// 4,096 ascending keys: the whole-index walks (start-up recovery, the
    /// orphan sweep, a file pool's live extents). Stops at the first error.
    fn for_each_page(&self, mut f: impl FnMut(&Instance, &[BlockKey]) -> Result<()>) -> Result<()> {
        for inst in self.catalog.instances() {
            let mut after = None;
            loop {
                let keys = self.index.scan(&inst.id, after, 4096)?;
                let Some(&last) = keys.last() else { break };
                after = Some(last);
                f(&inst, &keys)?;
            }
        }
        Ok(())
    }

    /// The last record time (ms) at which a writing location is orphaned:
    /// everything (`u64::MAX`) for a single frontend.
    fn orphan_cutoff_ms(&self) -> u64 {
        self.config.orphan_write_age.map_or(u64::MAX, |age| {
            now_ms().saturating_sub(u64::try_from(age.as_millis()).unwrap_or(u64::MAX))
        })
    }

    /// Drops the orphaned writing locations of `keys` (their sessions died
    /// with the frontend that opened them) and charges the rest, but for
    /// writing locations other frontends own, to the group's quota. When
    /// the index refuses writes (a full disk), charges what is stored as it
    /// is and leaves the writing locations for a later start: only serving
    /// locations are handed out, so the service starts and serves reads.
    fn recover_chunk(
        &self,
        inst: &Instance,
        keys: &[BlockKey],
        usage: &mut BTreeMap<String, GroupUsage>,
    ) -> Result<()> {
        let cutoff = self.orphan_cutoff_ms();
        let mut charges = Vec::new();
        let result = self.index.modify(&inst.id, keys, &mut |_, cur| {
            let Some(mut m) = cur else {
                return Modify::Keep;
            };
            let before = m.locations.len();
            let orphaned = m.last_access_ms <= cutoff;
            m.locations
                .retain(|l| !(l.status == LocationStatus::Writing && orphaned));
            charges.extend(
                m.locations
                    .iter()
                    .filter(|l| l.status != LocationStatus::Writing)
                    .map(|l| (l.kind, l.size())),
            );
            match (m.locations.is_empty(), m.locations.len() == before) {
                (true, _) => Modify::Delete,
                (false, true) => Modify::Keep,
                (false, false) => Modify::Put(m),
            }
        });
        match result {
            Ok(()) => {
                let u = usage.entry(inst.group.clone()).or_default();
                for (kind, size) in charges {
                    u.add(kind, size);
                }
                Ok(())
            }
            // Part of the batch may have been applied: charge what the
            // index holds now, which is right either way.
            Err(MetaError::StoreUnwritable(why)) => {
                tracing::warn!(instance = %inst.id, why, "metadata index read-only at start: interrupted writes stay until a later start");
                self.charge_stored(inst, keys, usage)
            }
            Err(e) => Err(e),
        }
    }

    /// Adds every location of `keys` that is not writing to `usage`.
    fn charge_stored(
        &self,
        inst: &Instance,
        keys: &[BlockKey],
        usage: &mut BTreeMap<String, GroupUsage>,
    ) -> Result<()> {
        let u = usage.entry(inst.group.clone()).or_default();
        for m in self.index.get(&inst.id, keys)?.into_iter().flatten() {
            for l in m
                .locations
                .iter()
                .filter(|l| l.status != LocationStatus::Writing)
            {
                u.add(l.kind, l.size());
            }
        }
        Ok(())
    }

    /// Charges `bytes` to `group` on `kind`. A ledger that cannot be
    /// reached (a shared one whose server is down) leaves the group
    /// under-charged: logged, since the index change it follows is made.
    fn charge_usage(&self, group: &str, kind: StorageKind, bytes: u64) {
        if let Err(e) = self.ledger.charge(group, kind, bytes) {
            tracing::warn!(group, bytes, error = %e, "quota ledger: charge not recorded");
        }
    }

    /// Releases `bytes` of `group` on `kind`. A ledger that cannot be
    /// reached leaves the bytes charged (the safe side: a quota refuses
    /// early rather than late), logged.
    fn release_usage(&self, group: &str, kind: StorageKind, bytes: u64) {
        if bytes == 0 {
            return;
        }
        if let Err(e) = self.ledger.release(group, kind, bytes) {
            tracing::warn!(group, bytes, error = %e, "quota ledger: release not recorded");
        }
    }

    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn check_keys(&self, keys: &[BlockKey]) -> Result<()> {
        if keys.is_empty() {
            return Err(MetaError::InvalidArgument("no block keys".into()));
        }
        if keys.len() > self.config.max_keys {
            return Err(MetaError::InvalidArgument(format!(
                "{} keys, at most {} per request",
                keys.len(),
                self.config.max_keys
            )));
        }
        Ok(())
    }

    /// Adds or replaces a storage (admin API later).
    pub fn put_storage(&self, storage: Storage) -> Result<()> {
        admin::check_name("storage name", &storage.name)?;
        self.catalog.put_storage(self.index.as_ref(), storage)
    }

    /// Adds or replaces an instance group (admin API later).
    pub fn put_group(&self, group: InstanceGroup) -> Result<()> {
        admin::check_name("group name", &group.name)?;
        admin::check_watermark(&group)?;
        self.catalog.put_group(self.index.as_ref(), group)
    }

    /// Registers an instance. Idempotent for an identical configuration;
    /// a different one under the same id is [`MetaError::InstanceConflict`].
    pub async fn register_instance(&self, instance: Instance) -> Result<Instance> {
        admin::check_instance(&instance)?;
        match self
            .catalog
            .instance_or_load(self.index.as_ref(), &instance.id)
        {
            Ok(existing) if *existing == instance => return Ok(instance),
            Ok(_) => return Err(MetaError::InstanceConflict(instance.id)),
            Err(_) => {}
        }
        Ok((*self.catalog.put_instance(self.index.as_ref(), instance)?).clone())
    }

    /// The registered configuration of an instance.
    pub async fn get_instance_info(&self, instance: &str) -> Result<Instance> {
        Ok((*self
            .catalog
            .instance_or_load(self.index.as_ref(), instance)?)
        .clone())
    }

    /// Bytes in use by a group.
    pub fn group_usage(&self, group: &str) -> Result<GroupUsage> {
        self.ledger.usage(group)
    }

    /// Open write sessions that hold locations (empty grants not counted).
    pub fn open_sessions(&self) -> Result<usize> {
        self.ledger.held_sessions()
    }

    /// Whether the ledger is shared with other frontends (then the leader
    /// runs the session reaper, see [`MetaService::spawn_leader_work`]).
    pub fn shares_ledger(&self) -> bool {
        self.ledger.is_shared()
    }
}
