//! [`SyncLatch`]: every sync of the tier goes through the I/O engine, and the
//! first one that fails latches the tier (invariant I12 in
//! `docs/disk-format.md`).
//!
//! Why latch the whole tier rather than retry: after a failed `fsync` the
//! kernel may have dropped the dirty state it could not write back, so a
//! second `fsync` can succeed without the data being on the media (the
//! PostgreSQL "fsyncgate" lesson). Whatever was written since the last
//! successful sync has unknown durability, so from then on nothing may be
//! acknowledged as durable: no block, no checkpoint. A restart clears the
//! latch; recovery then trusts only what verifies on disk.

use std::path::Path;
use std::sync::OnceLock;

use kvtier_io::{FileId, IoBatch, IoEngine, IoKind};

use crate::{DiskError, Result};

/// Set once, by the first failed sync of a run; never cleared.
#[derive(Debug, Default)]
pub(crate) struct SyncLatch {
    /// Why the tier latched (the failed sync's file and error).
    failed: OnceLock<String>,
}

impl SyncLatch {
    /// Why the tier is latched, if it is.
    pub fn reason(&self) -> Option<&str> {
        self.failed.get().map(String::as_str)
    }

    /// `Err(SyncFailed)` once latched.
    pub fn check(&self) -> Result<()> {
        match self.reason() {
            Some(reason) => Err(DiskError::SyncFailed {
                reason: reason.to_owned(),
            }),
            None => Ok(()),
        }
    }

    /// Latches the tier (the first reason wins) and returns the error every
    /// later write gets.
    pub fn latch(&self, why: String) -> DiskError {
        let mut first = false;
        let reason = self.failed.get_or_init(|| {
            first = true;
            why
        });
        if first {
            tracing::error!(
                reason = reason.as_str(),
                "disk tier latched after a failed sync: no more writes or checkpoints until restart"
            );
        }
        DiskError::SyncFailed {
            reason: reason.clone(),
        }
    }

    /// Syncs `file` (at `path`, for messages) through `engine` and waits;
    /// a failure latches the tier. Refused once latched: a sync after a
    /// failed one proves nothing.
    pub fn sync(
        &self,
        engine: &dyn IoEngine,
        file: FileId,
        kind: IoKind,
        path: &Path,
    ) -> Result<()> {
        self.check()?;
        let mut batch = IoBatch::new();
        batch.sync(file, kind);
        let done = engine.submit(batch).wait();
        let outcome = if done.results.is_empty() {
            // The engine went away mid-batch: the sync did not happen.
            Err("the I/O engine shut down".to_owned())
        } else {
            done.check().map_err(|e| e.to_string())
        };
        outcome.map_err(|e| self.latch(format!("{}: {e}", path.display())))
    }
}
