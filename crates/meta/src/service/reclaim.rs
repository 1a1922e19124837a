//! The reclaimer: keeps every instance group under its soft watermark by
//! removing serving blocks, in the background, in batches (Tair KVCM: hard
//! quotas refuse writes, watermarks trigger asynchronous eviction).
//!
//! One pass ([`MetaService::reclaim_once`]) first applies the buffered
//! access statistics, then, per group, with the group's quota, watermark
//! and policy read from the catalog at that moment (so changes made at run
//! time apply from the next pass):
//!
//! - above `watermark * quota_bytes`, it removes victims until usage is at
//!   or below `(watermark - reclaim_hysteresis) * quota_bytes`;
//! - with [`EvictionPolicy::Ttl`], it also removes blocks idle for longer
//!   than the TTL, whatever the usage; above the watermark, once nothing
//!   sampled is expired, it falls back to LRU order.
//!
//! Victim order: LRU is the oldest `last_access_ms` first, ties the deeper
//! block first (a prefix query touches a parent whenever it touches its
//! child, so a parent is never older than its child, and equal ages evict
//! leaves before parents); LFU is the lowest `access_count` first, then LRU
//! order.
//!
//! Approximation (as Redis' LRU): a victim batch does not scan the group.
//! It samples `reclaim_sample` records per instance with
//! [`crate::MetaIndex::sample`], orders the sample, and evicts from its
//! worst end at most a quarter of it (at most `reclaim_batch`), so each
//! victim is among the worst quarter of a random sample rather than the
//! globally worst. An instance with no more records than the sample size
//! is listed whole instead (no dearer than sampling, and exact). Only
//! serving locations are removed (writing ones belong to their session),
//! through the same internal path as `remove_cache`, and the task yields
//! between batches.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::task::JoinHandle;

use super::{MetaService, now_ms};
use crate::error::{MetaError, Result};
use crate::index::Fence;
use crate::model::{BlockKey, BlockMeta, EvictionPolicy, Instance, InstanceGroup, LocationStatus};

/// What one pass did for one group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupReclaim {
    /// Group usage (bytes) when the pass reached the group.
    pub usage_before: u64,
    /// Group usage (bytes) when the pass left it.
    pub usage_after: u64,
    /// Blocks whose serving locations were removed.
    pub blocks: u64,
    /// Bytes of those locations (as sampled; a block changed between
    /// sampling and removal may differ).
    pub bytes: u64,
    /// Of `blocks`, those removed for being idle past the TTL.
    pub expired: u64,
    /// Victim batches (sample, order, remove).
    pub batches: u64,
    /// Records sampled.
    pub sampled: u64,
}

/// What one [`MetaService::reclaim_once`] pass did.
#[derive(Debug, Default)]
pub struct ReclaimReport {
    /// Per group that needed work (above its watermark, or with a TTL).
    pub groups: BTreeMap<String, GroupReclaim>,
    /// Errors met (the pass goes on with the next group), with the group
    /// they belong to (empty for the access statistics flush).
    pub errors: Vec<(String, MetaError)>,
}

impl ReclaimReport {
    /// Blocks removed in all groups.
    pub fn blocks(&self) -> u64 {
        self.groups.values().map(|g| g.blocks).sum()
    }
}

/// Totals since the service started, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReclaimStats {
    /// Passes run.
    pub passes: u64,
    /// Blocks removed.
    pub blocks: u64,
    /// Bytes removed.
    pub bytes: u64,
    /// Victim batches.
    pub batches: u64,
    /// Records sampled.
    pub sampled: u64,
    /// Errors met.
    pub errors: u64,
}

/// The live counters behind [`ReclaimStats`].
#[derive(Debug, Default)]
pub(crate) struct ReclaimCounters {
    passes: AtomicU64,
    blocks: AtomicU64,
    bytes: AtomicU64,
    batches: AtomicU64,
    sampled: AtomicU64,
    errors: AtomicU64,
}

impl ReclaimCounters {
    fn add(&self, report: &ReclaimReport) {
        self.passes.fetch_add(1, Ordering::Relaxed);
        for g in report.groups.values() {
            self.blocks.fetch_add(g.blocks, Ordering::Relaxed);
            self.bytes.fetch_add(g.bytes, Ordering::Relaxed);
            self.batches.fetch_add(g.batches, Ordering::Relaxed);
            self.sampled.fetch_add(g.sampled, Ordering::Relaxed);
        }
        self.errors
            .fetch_add(report.errors.len() as u64, Ordering::Relaxed);
    }

    fn snapshot(&self) -> ReclaimStats {
        ReclaimStats {
            passes: self.passes.load(Ordering::Relaxed),
            blocks: self.blocks.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            batches: self.batches.load(Ordering::Relaxed),
            sampled: self.sampled.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
        }
    }
}

/// Stops the background reclaimer when dropped.
#[derive(Debug)]
pub struct ReclaimerHandle(JoinHandle<()>);

impl Drop for ReclaimerHandle {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A sampled candidate: which member instance, and its record.
struct Candidate {
    member: usize,
    meta: BlockMeta,
    /// Bytes its removal frees: its non-writing locations.
    bytes: u64,
}

/// The usage bounds of one group in one pass.
struct Marks {
    /// Start reclaiming above this.
    high: u64,
    /// Stop at or below this.
    low: u64,
}

fn marks(group: &InstanceGroup, hysteresis: f64) -> Option<Marks> {
    if group.quota_bytes == u64::MAX {
        return None; // unlimited: no watermark to keep
    }
    let quota = group.quota_bytes as f64;
    let low_frac = (group.watermark - hysteresis.max(0.0)).max(0.0);
    // Rounded: 0.3 - 0.1 is 0.19999999999999998, not quite 0.2.
    Some(Marks {
        high: (group.watermark * quota).round() as u64,
        low: (low_frac * quota).round() as u64,
    })
}

/// LRU order key: oldest first, then deepest first (leaves before parents).
fn lru_key(m: &BlockMeta) -> (u64, Reverse<u32>, BlockKey) {
    (m.last_access_ms, Reverse(m.depth), m.key)
}

impl MetaService {
    /// Starts the background reclaimer, one pass every `interval` (at least
    /// 1 ms); it stops when the handle is dropped, the service is gone, or
    /// `fence` (the leader's, carried by every removal) no longer holds.
    pub fn spawn_reclaimer(
        self: &Arc<Self>,
        interval: Duration,
        fence: Option<Fence>,
    ) -> ReclaimerHandle {
        let svc = Arc::downgrade(self);
        let period = interval.max(Duration::from_millis(1));
        ReclaimerHandle(tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if fence.as_ref().is_some_and(|f| f.check().is_err()) {
                    return;
                }
                let Some(svc) = svc.upgrade() else { return };
                let report = svc.reclaim_pass(fence.as_ref()).await;
                for (group, e) in &report.errors {
                    tracing::warn!(group, error = %e, "reclaim");
                }
            }
        }))
    }

    /// Totals of every reclaim pass so far.
    pub fn reclaim_stats(&self) -> ReclaimStats {
        self.reclaimed.snapshot()
    }

    /// One reclaim pass over every group with instances (see the module
    /// docs). Errors are collected in the report; the pass goes on.
    pub async fn reclaim_once(&self) -> ReclaimReport {
        self.reclaim_pass(None).await
    }

    /// A reclaim pass; with the leader's `fence`, every removal carries it
    /// ([`crate::MetaIndex::modify_fenced`]) and the pass stops, with
    /// [`crate::MetaError::NotLeader`] in the report, once it no longer
    /// holds.
    async fn reclaim_pass(&self, fence: Option<&Fence>) -> ReclaimReport {
        let mut report = ReclaimReport::default();
        // Victim order needs the reads made so far.
        if let Err(e) = self.flush_access() {
            report.errors.push((String::new(), e));
        }
        let instances = self.catalog.instances();
        let groups: BTreeSet<&str> = instances.iter().map(|i| i.group.as_str()).collect();
        for name in groups {
            // Read now, not at spawn time: quotas, watermark and policy may
            // have changed since the last pass.
            let Ok(group) = self.catalog.group(name) else {
                continue;
            };
            let members: Vec<&Instance> = instances
                .iter()
                .filter(|i| i.group == name)
                .map(|i| &**i)
                .collect();
            if let Some(Err(e)) = fence.map(Fence::check) {
                report.errors.push((name.to_owned(), e));
                break;
            }
            if let Some(g) = self
                .reclaim_group(&group, &members, fence, &mut report)
                .await
            {
                report.groups.insert(name.to_owned(), g);
            }
        }
        self.reclaimed.add(&report);
        report
    }

    /// Reclaims in one group; `None` if it needed nothing.
    async fn reclaim_group(
        &self,
        group: &InstanceGroup,
        members: &[&Instance],
        fence: Option<&Fence>,
        report: &mut ReclaimReport,
    ) -> Option<GroupReclaim> {
        let ttl_ms = match group.eviction {
            EvictionPolicy::Ttl { ttl_secs } => Some(ttl_secs.saturating_mul(1000)),
            _ => None,
        };
        let marks = marks(group, self.config.reclaim_hysteresis);
        let usage_of = |report: &mut ReclaimReport| match self.ledger.usage(&group.name) {
            Ok(u) => Some(u.total),
            Err(e) => {
                report.errors.push((group.name.clone(), e));
                None
            }
        };
        let usage_before = usage_of(report)?;
        let mut over = marks.as_ref().is_some_and(|m| usage_before > m.high);
        if !over && ttl_ms.is_none() {
            return None;
        }
        let mut out = GroupReclaim {
            usage_before,
            ..GroupReclaim::default()
        };
        for _ in 0..self.config.reclaim_max_batches.max(1) {
            let pool = match self.sample_group(members, &mut out) {
                Ok(p) => p,
                Err(e) => {
                    report.errors.push((group.name.clone(), e));
                    break;
                }
            };
            let Some(usage) = usage_of(report) else { break };
            let need = match (&marks, over) {
                (Some(m), true) if usage > m.low => usage - m.low,
                _ => {
                    over = false;
                    0
                }
            };
            let now = now_ms();
            let (victims, expired) = self.pick_victims(group, pool, need, ttl_ms, now);
            if victims.is_empty() {
                break;
            }
            out.batches += 1;
            match self.remove_victims(members, &victims, fence) {
                Ok((blocks, bytes)) => {
                    out.blocks += blocks;
                    out.bytes += bytes;
                    out.expired += expired.min(blocks);
                    if blocks == 0 {
                        break; // all changed under us; next pass samples afresh
                    }
                }
                Err(e) => {
                    report.errors.push((group.name.clone(), e));
                    break;
                }
            }
            tokio::task::yield_now().await;
        }
        out.usage_after = usage_of(report).unwrap_or(out.usage_before);
        Some(out)
    }

    /// Candidates with something to free from every member: sampled, or
    /// listed whole where the instance is no bigger than the sample.
    fn sample_group(
        &self,
        members: &[&Instance],
        out: &mut GroupReclaim,
    ) -> Result<Vec<Candidate>> {
        let k = self.config.reclaim_sample.max(1);
        let mut pool = Vec::new();
        for (member, inst) in members.iter().enumerate() {
            let metas = if self.index.count(&inst.id)? <= k as u64 {
                let keys = self.index.scan(&inst.id, None, k)?;
                self.index
                    .get(&inst.id, &keys)?
                    .into_iter()
                    .flatten()
                    .collect()
            } else {
                self.index.sample(&inst.id, k)?
            };
            out.sampled += metas.len() as u64;
            pool.extend(metas.into_iter().filter_map(|meta| {
                // Nothing serving: only writing (or deleting) locations.
                meta.serving()?;
                let bytes = meta
                    .locations
                    .iter()
                    .filter(|l| l.status != LocationStatus::Writing)
                    .map(|l| l.size())
                    .sum();
                Some(Candidate {
                    member,
                    meta,
                    bytes,
                })
            }));
        }
        Ok(pool)
    }

    /// Chooses one batch of victims from `pool`: every expired one (TTL),
    /// then, while `need` bytes are still to be freed, the worst by the
    /// group's policy, at most a quarter of the pool. Returns the victims
    /// and how many of them (the first ones) were expired.
    fn pick_victims(
        &self,
        group: &InstanceGroup,
        mut pool: Vec<Candidate>,
        need: u64,
        ttl_ms: Option<u64>,
        now: u64,
    ) -> (Vec<Candidate>, u64) {
        let cap = self.config.reclaim_batch.max(1);
        let mut victims = Vec::new();
        if let Some(ttl) = ttl_ms {
            let (expired, rest): (Vec<_>, Vec<_>) = pool
                .into_iter()
                .partition(|c| now.saturating_sub(c.meta.last_access_ms) > ttl);
            victims = expired;
            victims.sort_by_key(|c| lru_key(&c.meta));
            victims.truncate(cap);
            pool = rest;
        }
        let n_expired = victims.len() as u64;
        let mut freed: u64 = victims.iter().map(|c| c.bytes).sum();
        if freed < need && victims.len() < cap {
            let room = (cap - victims.len()).min((pool.len() / 4).max(1));
            match group.eviction {
                EvictionPolicy::Lfu => {
                    pool.sort_by_key(|c| (c.meta.access_count, lru_key(&c.meta)))
                }
                EvictionPolicy::Lru | EvictionPolicy::Ttl { .. } => {
                    pool.sort_by_key(|c| lru_key(&c.meta))
                }
            }
            for c in pool.into_iter().take(room) {
                if freed >= need {
                    break;
                }
                freed += c.bytes;
                victims.push(c);
            }
        }
        (victims, n_expired)
    }

    /// Removes the victims' readable locations through the `remove_cache`
    /// path, one index call per member and `reclaim_batch` keys; returns
    /// (blocks removed, bytes of the victims removed as sampled).
    fn remove_victims(
        &self,
        members: &[&Instance],
        victims: &[Candidate],
        fence: Option<&Fence>,
    ) -> Result<(u64, u64)> {
        let mut per_member: HashMap<usize, Vec<&Candidate>> = HashMap::new();
        for c in victims {
            per_member.entry(c.member).or_default().push(c);
        }
        let mut blocks = 0u64;
        let mut bytes = 0u64;
        for (member, cands) in per_member {
            let Some(inst) = members.get(member) else {
                continue;
            };
            for chunk in cands.chunks(self.config.reclaim_batch.max(1)) {
                let keys: Vec<BlockKey> = chunk.iter().map(|c| c.meta.key).collect();
                let removed = self.remove_keys(inst, &keys, fence)?;
                blocks += removed as u64;
                if removed > 0 {
                    // Exact unless some victims changed since sampling.
                    bytes += chunk.iter().map(|c| c.bytes).sum::<u64>();
                }
            }
        }
        Ok((blocks, bytes))
    }
}
