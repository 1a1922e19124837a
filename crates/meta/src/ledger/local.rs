//! [`LocalLedger`]: the ledger of a frontend alone with its index, in
//! memory. Deadlines use tokio's clock, so tests with paused time drive
//! timeouts.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use super::{Chooser, GroupUsage, Ledger, SessionId, SessionRecord};
use crate::error::Result;
use crate::model::StorageKind;

/// An open session: its record, its deadline and the claim on it.
#[derive(Debug)]
struct Open {
    record: SessionRecord,
    deadline: Instant,
    /// Until when a caller holds it.
    claim: Option<Instant>,
}

impl Open {
    /// When the reaper may take it.
    fn due(&self) -> Instant {
        self.claim.unwrap_or(self.deadline)
    }

    /// Whether no claim on it is in force at `now`.
    fn claimable(&self, now: Instant) -> bool {
        self.claim.is_none_or(|c| c <= now)
    }
}

#[derive(Debug, Default)]
struct State {
    usage: HashMap<String, GroupUsage>,
    sessions: HashMap<SessionId, Open>,
    built: bool,
}

/// Sessions and charges in this process's memory. One mutex: every call is
/// a few map operations.
#[derive(Debug, Default)]
pub struct LocalLedger {
    state: Mutex<State>,
}

impl LocalLedger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }
}

impl State {
    fn claim_where(
        &mut self,
        lease: Duration,
        limit: usize,
        pick: impl Fn(&Open, Instant) -> bool,
    ) -> Vec<(SessionId, SessionRecord)> {
        let now = Instant::now();
        let mut out = Vec::new();
        for (id, s) in &mut self.sessions {
            if out.len() == limit {
                break;
            }
            if pick(s, now) {
                s.claim = Some(now + lease);
                out.push((*id, s.record.clone()));
            }
        }
        out
    }
}

impl Ledger for LocalLedger {
    fn is_shared(&self) -> bool {
        false
    }

    fn usage(&self, group: &str) -> Result<GroupUsage> {
        Ok(self
            .state
            .lock()
            .usage
            .get(group)
            .cloned()
            .unwrap_or_default())
    }

    fn charge(&self, group: &str, kind: StorageKind, bytes: u64) -> Result<()> {
        if bytes > 0 {
            let mut st = self.state.lock();
            st.usage
                .entry(group.to_owned())
                .or_default()
                .add(kind, bytes);
        }
        Ok(())
    }

    fn release(&self, group: &str, kind: StorageKind, bytes: u64) -> Result<()> {
        if bytes > 0 {
            let mut st = self.state.lock();
            st.usage
                .entry(group.to_owned())
                .or_default()
                .sub(kind, bytes);
        }
        Ok(())
    }

    fn open(
        &self,
        id: SessionId,
        session: &mut SessionRecord,
        timeout: Duration,
        choose: &mut Chooser<'_>,
    ) -> Result<()> {
        let mut st = self.state.lock();
        let usage = st.usage.entry(session.group.clone()).or_default();
        session.kind = choose(usage)?;
        usage.add(session.kind, session.charge());
        let open = Open {
            record: session.clone(),
            deadline: Instant::now() + timeout,
            claim: None,
        };
        st.sessions.insert(id, open);
        Ok(())
    }

    fn narrow(
        &self,
        id: SessionId,
        session: &SessionRecord,
        dropped: usize,
        timeout: Duration,
    ) -> Result<()> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        // A session the reaper claimed meanwhile is closed with its whole
        // record: narrowing it now would release the dropped part twice.
        let Some(open) = st.sessions.get_mut(&id).filter(|s| s.claim.is_none()) else {
            return Ok(());
        };
        open.record = session.clone();
        open.deadline = Instant::now() + timeout;
        let released = session.block_bytes.saturating_mul(dropped as u64);
        st.usage
            .entry(session.group.clone())
            .or_default()
            .sub(session.kind, released);
        Ok(())
    }

    fn claim(&self, id: SessionId, lease: Duration) -> Result<Option<SessionRecord>> {
        let now = Instant::now();
        let mut st = self.state.lock();
        Ok(st
            .sessions
            .get_mut(&id)
            .filter(|s| s.claimable(now))
            .map(|s| {
                s.claim = Some(now + lease);
                s.record.clone()
            }))
    }

    fn unclaim(&self, id: SessionId, extend: Option<Duration>) -> Result<()> {
        if let Some(s) = self.state.lock().sessions.get_mut(&id) {
            s.claim = None;
            if let Some(t) = extend {
                s.deadline = Instant::now() + t;
            }
        }
        Ok(())
    }

    fn claim_expired(
        &self,
        lease: Duration,
        limit: usize,
    ) -> Result<Vec<(SessionId, SessionRecord)>> {
        let mut st = self.state.lock();
        Ok(st.claim_where(lease, limit, |s, now| s.due() <= now))
    }

    fn claim_instance(
        &self,
        instance: &str,
        lease: Duration,
    ) -> Result<Vec<(SessionId, SessionRecord)>> {
        let mut st = self.state.lock();
        Ok(st.claim_where(lease, usize::MAX, |s, now| {
            s.record.instance == instance && s.claimable(now)
        }))
    }

    fn close(&self, id: SessionId, session: &SessionRecord, served: usize) -> Result<()> {
        let mut st = self.state.lock();
        // Only a session still open holds a charge: closing twice must not
        // release twice.
        if st.sessions.remove(&id).is_some() {
            let dropped = session.targets.len().saturating_sub(served) as u64;
            st.usage
                .entry(session.group.clone())
                .or_default()
                .sub(session.kind, session.block_bytes.saturating_mul(dropped));
        }
        Ok(())
    }

    fn held_sessions(&self) -> Result<usize> {
        Ok(self
            .state
            .lock()
            .sessions
            .values()
            .filter(|s| !s.record.targets.is_empty())
            .count())
    }

    fn is_built(&self) -> Result<bool> {
        Ok(self.state.lock().built)
    }

    fn install(&self, usage: &BTreeMap<String, GroupUsage>) -> Result<bool> {
        let mut st = self.state.lock();
        if st.built {
            return Ok(false);
        }
        for (group, u) in usage {
            let mine = st.usage.entry(group.clone()).or_default();
            for (&kind, &bytes) in &u.by_kind {
                mine.add(kind, bytes);
            }
        }
        st.built = true;
        Ok(true)
    }
}
