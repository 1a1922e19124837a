//! The sans-io core that [`Client`](crate::Client) and
//! [`AsyncClient`](crate::AsyncClient) share: the handshake checks, request
//! ids, building each request, matching what the daemon sends against the
//! request in flight, and which layers of each load are ready. No sockets
//! and no clocks: the two clients only move frames and wait.
//!
//! One request is in flight at a time (every call takes `&mut self`), so
//! any reply must name that request; notifications (`LayerReady`) may
//! arrive between replies and are recorded for their load.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};

use kvtier_arena::ArenaClient;
use kvtier_core::BlockHash;
use kvtier_protocol::{
    Commit, CommitEntry, CommitResult, Counter, Hello, HelloOk, KeysRequest, LayerReady,
    LoadResult, Message, OPENING_INTERVAL_MS, PROTOCOL_VERSION, ReserveResult, Stats, Tier,
    TierInfo, WireGeometry,
};

use crate::config::ClientConfig;
use crate::error::{ClientError, Result};

/// How many leading layers of a load are ready, and the checksums each
/// `LayerReady` carried: written by the session when it hears one, read by
/// the [`Load`](crate::Load), which may live on another thread.
#[derive(Debug, Default)]
pub(crate) struct Ready {
    layers: AtomicU32,
    /// Per layer heard: the layer's checksum of each leading slot still
    /// good then.
    sums: Mutex<HashMap<u32, Arc<[u64]>>>,
}

impl Ready {
    /// Layers `0..n` are ready.
    pub(crate) fn layers(&self) -> u32 {
        self.layers.load(Ordering::Acquire)
    }

    /// The checksums `LayerReady` carried for `layer`, if one was heard
    /// for that very layer (a daemon that moved whole blocks says only the
    /// last layer).
    pub(crate) fn sums(&self, layer: u32) -> Option<Arc<[u64]>> {
        self.sums
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&layer)
            .cloned()
    }

    /// Leading slots no notification has reported failed.
    pub(crate) fn good_slots(&self) -> Option<usize> {
        self.sums
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .map(|s| s.len())
            .min()
    }

    fn record(&self, layer: u32, sums: Vec<u64>) {
        self.sums
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(layer, sums.into());
        self.layers.fetch_max(layer + 1, Ordering::Release);
    }
}

/// One request: its frame, and how to read its reply.
pub(crate) struct Call<T> {
    /// The request id.
    pub(crate) id: u64,
    /// The request.
    pub(crate) message: Message,
    /// Keys or entries in the request: what the reply must answer.
    count: usize,
    parse: fn(Message, usize) -> Result<T>,
}

/// Why the connection can no longer be used.
#[derive(Debug, Clone)]
enum Broken {
    Disconnected,
    After(String),
}

/// The per-connection state; see the module docs.
#[derive(Debug)]
pub(crate) struct Session {
    /// The next request id; ids start at 1 (0 names no request in `Error`).
    next_id: u64,
    /// Layers per block.
    layers: u32,
    /// The positions `HelloOk` listed, one bit each: the only tiers a
    /// `LookupOk` may name.
    tiers: u8,
    /// Loads that may still hear `LayerReady`. Weak: a dropped `Load` needs
    /// nothing more; its entry goes at the next sweep.
    loads: HashMap<u64, Weak<Ready>>,
    /// Sweep dead entries when `loads` reaches this size.
    sweep_at: usize,
    broken: Option<Broken>,
    /// A call started and not settled. Still set when the next call starts
    /// only if the previous one was cancelled (its future dropped) after
    /// sending: its answer may still be on the way.
    in_flight: bool,
}

/// Smallest `sweep_at`: sweeping a few entries often costs more than it saves.
const MIN_SWEEP: usize = 64;

impl Session {
    /// A fresh session for blocks of `layers` layers, with a node of these
    /// tiers (its `HelloOk`'s list).
    pub(crate) fn new(layers: u32, tiers: &[TierInfo]) -> Self {
        Self {
            next_id: 1,
            layers,
            tiers: tiers.iter().fold(0, |set, t| set | tier_bit(t.tier)),
            loads: HashMap::new(),
            sweep_at: MIN_SWEEP,
            broken: None,
            in_flight: false,
        }
    }

    /// Begins a call (or a wait): fails if an earlier error, or an earlier
    /// call cancelled midway, left the connection unusable. End it with
    /// [`settle`](Self::settle).
    pub(crate) fn start(&mut self) -> Result<()> {
        if self.in_flight && self.broken.is_none() {
            self.broken = Some(Broken::After(
                "an earlier call was cancelled before its answer arrived".into(),
            ));
        }
        self.in_flight = true;
        self.usable()
    }

    fn usable(&self) -> Result<()> {
        match &self.broken {
            None => Ok(()),
            Some(Broken::Disconnected) => Err(ClientError::Disconnected),
            Some(Broken::After(cause)) => Err(ClientError::Broken {
                cause: cause.clone(),
            }),
        }
    }

    /// Passes `r` on, remembering a fatal error so later calls fail fast
    /// instead of reading a stale reply as theirs.
    pub(crate) fn settle<T>(&mut self, r: Result<T>) -> Result<T> {
        self.in_flight = false;
        if let Err(e) = &r
            && e.is_fatal()
            && self.broken.is_none()
        {
            self.broken = Some(match e {
                ClientError::Disconnected => Broken::Disconnected,
                e => Broken::After(e.to_string()),
            });
        }
        r
    }

    fn call<T>(
        &mut self,
        count: usize,
        message: impl FnOnce(u64) -> Message,
        parse: fn(Message, usize) -> Result<T>,
    ) -> Call<T> {
        let id = self.next_id;
        self.next_id += 1;
        Call {
            id,
            message: message(id),
            count,
            parse,
        }
    }

    fn keys_call<T>(
        &mut self,
        keys: &[BlockHash],
        message: fn(KeysRequest) -> Message,
        parse: fn(Message, usize) -> Result<T>,
    ) -> Call<T> {
        let request = |request_id| {
            message(KeysRequest {
                request_id,
                keys: keys.to_vec(),
            })
        };
        self.call(keys.len(), request, parse)
    }

    /// `Lookup`: the tiers of the longest stored prefix.
    pub(crate) fn lookup(&mut self, keys: &[BlockHash]) -> Call<Vec<Tier>> {
        self.keys_call(keys, Message::Lookup, parse::lookup_ok)
    }

    /// `Reserve`: one result per key.
    pub(crate) fn reserve(&mut self, keys: &[BlockHash]) -> Call<Vec<ReserveResult>> {
        self.keys_call(keys, Message::Reserve, parse::reserve_ok)
    }

    /// `Commit`: one result per entry.
    pub(crate) fn commit(&mut self, entries: Vec<CommitEntry>) -> Call<Vec<CommitResult>> {
        let count = entries.len();
        let request = |request_id| {
            Message::Commit(Commit {
                request_id,
                entries,
            })
        };
        self.call(count, request, parse::commit_ok)
    }

    /// `Abort`, answered by `Ack`.
    pub(crate) fn abort(&mut self, keys: &[BlockHash]) -> Call<()> {
        self.keys_call(keys, Message::Abort, parse::ack)
    }

    /// `Load`: one result per key. Returns the cell the session updates as
    /// `LayerReady` notifications for this load arrive (they may come
    /// before the caller gets to wait for them).
    pub(crate) fn load(&mut self, keys: &[BlockHash]) -> (Call<Vec<LoadResult>>, Arc<Ready>) {
        let call = self.keys_call(keys, Message::Load, parse::load_ok);
        let ready = Arc::new(Ready::default());
        self.track(call.id, &ready);
        (call, ready)
    }

    /// `Release`, answered by `Ack`.
    pub(crate) fn release(&mut self, keys: &[BlockHash]) -> Call<()> {
        self.keys_call(keys, Message::Release, parse::ack)
    }

    /// `Remove`, answered by `Ack`.
    pub(crate) fn remove(&mut self, keys: &[BlockHash]) -> Call<()> {
        self.keys_call(keys, Message::Remove, parse::ack)
    }

    /// `Stats`: the counters.
    pub(crate) fn stats(&mut self) -> Call<Vec<Counter>> {
        let request = |request_id| Message::Stats(Stats { request_id });
        self.call(0, request, parse::stats_ok)
    }

    /// Takes one message from the daemon while `call` is in flight:
    /// `Some` is the call's answer, `None` a notification recorded (read
    /// on). An `Error` naming the call (or no request: a connection-level
    /// error) is [`ClientError::Refused`].
    pub(crate) fn accept<T>(&mut self, call: &Call<T>, msg: Message) -> Result<Option<T>> {
        match msg {
            Message::LayerReady(n) => self.note_ready(n).map(|()| None),
            Message::Error(e) if e.request_id == call.id || e.request_id == 0 => {
                Err(ClientError::Refused {
                    code: e.code,
                    message: e.message,
                })
            }
            msg => match reply_id(&msg) {
                Some(id) if id == call.id => {
                    self.check_tiers(&msg)?;
                    (call.parse)(msg, call.count).map(Some)
                }
                Some(got) => Err(ClientError::WrongRequestId {
                    expected: call.id,
                    got,
                }),
                None => Err(ClientError::Unexpected {
                    what: format!("{} (a request or handshake message)", msg.name()),
                }),
            },
        }
    }

    /// Refuses a `LookupOk` naming a tier the node did not list in its
    /// `HelloOk`: the daemon broke the protocol.
    fn check_tiers(&self, msg: &Message) -> Result<()> {
        let Message::LookupOk(ok) = msg else {
            return Ok(());
        };
        match ok.tiers.iter().find(|t| self.tiers & tier_bit(**t) == 0) {
            None => Ok(()),
            Some(t) => Err(ClientError::Unexpected {
                what: format!("LookupOk naming {}, not a tier of the node", t.label()),
            }),
        }
    }

    /// Takes one message from the daemon while no request is in flight
    /// (waiting for layers): only notifications belong here.
    pub(crate) fn accept_notification(&mut self, msg: Message) -> Result<()> {
        match msg {
            Message::LayerReady(n) => self.note_ready(n),
            Message::Error(e) if e.request_id == 0 => Err(ClientError::Refused {
                code: e.code,
                message: e.message,
            }),
            msg => Err(ClientError::Unexpected {
                what: format!("{} while no request was in flight", msg.name()),
            }),
        }
    }

    /// Records `LayerReady`. One for a load that is finished or dropped is
    /// late and ignored; one for a request never sent, or a layer past the
    /// block's last, is a protocol violation.
    fn note_ready(&mut self, n: LayerReady) -> Result<()> {
        if n.request_id == 0 || n.request_id >= self.next_id {
            return Err(ClientError::Unexpected {
                what: format!("LayerReady for request {}, never sent", n.request_id),
            });
        }
        if n.layer >= self.layers {
            return Err(ClientError::Unexpected {
                what: format!(
                    "LayerReady for layer {} of blocks of {} layers",
                    n.layer, self.layers
                ),
            });
        }
        let Some(ready) = self.loads.get(&n.request_id).and_then(Weak::upgrade) else {
            return Ok(());
        };
        ready.record(n.layer, n.sums);
        if n.layer + 1 == self.layers {
            // Complete: the load's cell keeps the answer, nothing more comes.
            self.loads.remove(&n.request_id);
        }
        Ok(())
    }

    fn track(&mut self, id: u64, ready: &Arc<Ready>) {
        if self.loads.len() >= self.sweep_at {
            self.loads.retain(|_, r| r.strong_count() > 0);
            self.sweep_at = (2 * self.loads.len()).max(MIN_SWEEP);
        }
        self.loads.insert(id, Arc::downgrade(ready));
    }

    /// Loads that may still hear notifications (for tests).
    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.loads.len()
    }
}

/// A tier's bit in a set of positions (there are at most eight).
fn tier_bit(t: Tier) -> u8 {
    1 << t.index()
}

/// The request id a reply names; `None` for messages that are not replies.
fn reply_id(msg: &Message) -> Option<u64> {
    Some(match msg {
        Message::LookupOk(m) => m.request_id,
        Message::ReserveOk(m) => m.request_id,
        Message::CommitOk(m) => m.request_id,
        Message::LoadOk(m) => m.request_id,
        Message::StatsOk(m) => m.request_id,
        Message::Ack(m) => m.request_id,
        Message::Error(m) => m.request_id,
        _ => return None,
    })
}

/// Reading each reply: its type, and one result per key where the
/// protocol promises that (I11).
mod parse {
    use super::*;

    fn wrong_type(got: &Message, want: &str) -> ClientError {
        ClientError::Unexpected {
            what: format!("{} where {want} was due", got.name()),
        }
    }

    fn per_key<T>(results: Vec<T>, count: usize, what: &str) -> Result<Vec<T>> {
        if results.len() == count {
            return Ok(results);
        }
        Err(ClientError::Unexpected {
            what: format!("{what} with {} results for {count} keys", results.len()),
        })
    }

    pub(super) fn lookup_ok(msg: Message, count: usize) -> Result<Vec<Tier>> {
        match msg {
            Message::LookupOk(ok) if ok.prefix_len() <= count => Ok(ok.tiers),
            Message::LookupOk(ok) => Err(ClientError::Unexpected {
                what: format!(
                    "LookupOk with a prefix of {} of {count} keys",
                    ok.prefix_len()
                ),
            }),
            other => Err(wrong_type(&other, "LookupOk")),
        }
    }

    pub(super) fn reserve_ok(msg: Message, count: usize) -> Result<Vec<ReserveResult>> {
        match msg {
            Message::ReserveOk(ok) => per_key(ok.results, count, "ReserveOk"),
            other => Err(wrong_type(&other, "ReserveOk")),
        }
    }

    pub(super) fn commit_ok(msg: Message, count: usize) -> Result<Vec<CommitResult>> {
        match msg {
            Message::CommitOk(ok) => per_key(ok.results, count, "CommitOk"),
            other => Err(wrong_type(&other, "CommitOk")),
        }
    }

    pub(super) fn load_ok(msg: Message, count: usize) -> Result<Vec<LoadResult>> {
        match msg {
            Message::LoadOk(ok) => per_key(ok.results, count, "LoadOk"),
            other => Err(wrong_type(&other, "LoadOk")),
        }
    }

    pub(super) fn stats_ok(msg: Message, _: usize) -> Result<Vec<Counter>> {
        match msg {
            Message::StatsOk(ok) => Ok(ok.counters),
            other => Err(wrong_type(&other, "StatsOk")),
        }
    }

    pub(super) fn ack(msg: Message, _: usize) -> Result<()> {
        match msg {
            Message::Ack(_) => Ok(()),
            other => Err(wrong_type(&other, "Ack")),
        }
    }
}

/// The handshake's first frame.
pub(crate) fn hello(config: &ClientConfig) -> Message {
    Message::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        namespace: config.namespace.clone(),
        geometry: config.geometry,
        instance: config.instance.clone(),
    })
}

/// Reads the daemon's answer to `Hello`: `None` while the daemon says the
/// node is still opening (`Opening`, 4.2), so the caller waits for the
/// next frame, each within its timeout.
pub(crate) fn hello_reply(msg: Message) -> Result<Option<HelloOk>> {
    match msg {
        Message::HelloOk(ok) => Ok(Some(ok)),
        Message::Opening(o) => {
            // The first one, then about every ten seconds.
            let every = 10 * OPENING_INTERVAL_MS;
            if o.elapsed_ms < 2 * OPENING_INTERVAL_MS || o.elapsed_ms % every < OPENING_INTERVAL_MS
            {
                tracing::info!(
                    elapsed_ms = o.elapsed_ms,
                    "the kvtier daemon is opening its node for this first engine (a new disk tier is written through first); waiting"
                );
            }
            Ok(None)
        }
        Message::Error(e) => Err(ClientError::Refused {
            code: e.code,
            message: e.message,
        }),
        other => Err(ClientError::Unexpected {
            what: format!("{} in answer to Hello", other.name()),
        }),
    }
}

/// Maps the arena `HelloOk` names and checks that it is the one announced
/// and holds blocks of `geometry`.
pub(crate) fn open_arena(ok: &HelloOk, geometry: &WireGeometry) -> Result<Arc<ArenaClient>> {
    let arena = ArenaClient::open(&ok.shm_name)?;
    check_arena(&arena, ok, geometry)?;
    Ok(Arc::new(arena))
}

fn check_arena(arena: &ArenaClient, ok: &HelloOk, g: &WireGeometry) -> Result<()> {
    let checks = [
        ("arena length", arena.file_bytes(), ok.arena_len),
        ("slot size", arena.slot_bytes() as u64, ok.slot_size),
        ("block bytes", arena.block_bytes() as u64, g.block_bytes),
        ("layer bytes", arena.layer_bytes() as u64, g.layer_bytes),
        ("layers", arena.layers() as u64, u64::from(g.layers)),
    ];
    for (what, mapped, expected) in checks {
        if mapped != expected {
            return Err(ClientError::WrongGeometry {
                what: format!(
                    "{what}: the arena {} has {mapped}, expected {expected}",
                    arena.path().display()
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvtier_protocol::{
        Ack, CommitOk, Error, ErrorCode, LoadOk, LookupOk, ReserveOk, Slot, StatsOk,
    };

    const LAYERS: u32 = 4;

    /// The default node's tiers: G2 memory, G3 disk.
    fn node_tiers() -> Vec<TierInfo> {
        use kvtier_core::TierKind;
        vec![
            TierInfo {
                tier: Tier::G2,
                kind: TierKind::Memory,
            },
            TierInfo {
                tier: Tier::G3,
                kind: TierKind::Disk,
            },
        ]
    }

    fn session() -> Session {
        Session::new(LAYERS, &node_tiers())
    }

    fn keys(n: u128) -> Vec<BlockHash> {
        (1..=n).map(BlockHash).collect()
    }

    fn ready(id: u64, layer: u32) -> Message {
        Message::LayerReady(LayerReady {
            request_id: id,
            layer,
            sums: vec![7],
        })
    }

    fn error(id: u64, code: ErrorCode) -> Message {
        Message::Error(Error {
            request_id: id,
            code,
            message: "no".into(),
        })
    }

    fn reserve_ok(id: u64, n: usize) -> Message {
        Message::ReserveOk(ReserveOk {
            request_id: id,
            results: vec![ReserveResult::NoSpace; n],
        })
    }

    #[test]
    fn ids_increase_from_one_and_requests_carry_them() {
        let mut s = session();
        let a = s.lookup(&keys(2));
        let b = s.stats();
        let c = s.commit(Vec::new());
        assert_eq!((a.id, b.id, c.id), (1, 2, 3));
        assert_eq!(
            a.message,
            Message::Lookup(KeysRequest {
                request_id: 1,
                keys: keys(2)
            })
        );
        assert_eq!(b.message, Message::Stats(Stats { request_id: 2 }));
    }

    #[test]
    fn the_reply_to_the_call_is_parsed() {
        let mut s = session();
        let call = s.reserve(&keys(2));
        let out = s.accept(&call, reserve_ok(call.id, 2)).unwrap();
        assert_eq!(out, Some(vec![ReserveResult::NoSpace; 2]));
        let call = s.lookup(&keys(3));
        let ok = Message::LookupOk(LookupOk {
            request_id: call.id,
            tiers: vec![Tier::G2, Tier::G3],
        });
        assert_eq!(s.accept(&call, ok).unwrap(), Some(vec![Tier::G2, Tier::G3]));
        let call = s.abort(&keys(1));
        let ack = Message::Ack(Ack {
            request_id: call.id,
        });
        assert_eq!(s.accept(&call, ack).unwrap(), Some(()));
    }

    #[test]
    fn a_reply_to_another_request_is_refused() {
        let mut s = session();
        let call = s.reserve(&keys(1));
        let err = s.accept(&call, reserve_ok(call.id + 1, 1)).unwrap_err();
        assert!(matches!(
            err,
            ClientError::WrongRequestId {
                expected: 1,
                got: 2
            }
        ));
        assert!(err.is_fatal());
    }

    #[test]
    fn a_reply_of_the_wrong_type_or_size_is_refused() {
        let mut s = session();
        let call = s.reserve(&keys(2));
        let ack = Message::Ack(Ack {
            request_id: call.id,
        });
        let err = s.accept(&call, ack).unwrap_err();
        assert!(
            matches!(&err, ClientError::Unexpected { what } if what.contains("Ack where ReserveOk")),
            "{err}"
        );
        let err = s.accept(&call, reserve_ok(call.id, 3)).unwrap_err();
        assert!(matches!(err, ClientError::Unexpected { .. }), "{err}");
        let commit = s.commit(vec![]);
        let too_many = Message::CommitOk(CommitOk {
            request_id: commit.id,
            results: vec![CommitResult::Stored],
        });
        assert!(s.accept(&commit, too_many).is_err());
        // A longer prefix than the keys asked about.
        let lookup = s.lookup(&keys(1));
        let long = Message::LookupOk(LookupOk {
            request_id: lookup.id,
            tiers: vec![Tier::G2; 2],
        });
        assert!(s.accept(&lookup, long).is_err());
        // A request or handshake message is never an answer.
        let stats = s.stats();
        let hello = Message::Stats(Stats {
            request_id: stats.id,
        });
        assert!(matches!(
            s.accept(&stats, hello),
            Err(ClientError::Unexpected { .. })
        ));
    }

    #[test]
    fn a_lookup_naming_a_tier_the_node_did_not_list_is_refused() {
        let mut s = session();
        for stray in [Tier::G1, Tier::G4] {
            let call = s.lookup(&keys(2));
            let ok = Message::LookupOk(LookupOk {
                request_id: call.id,
                tiers: vec![Tier::G2, stray],
            });
            let err = s.accept(&call, ok).unwrap_err();
            assert!(
                matches!(&err, ClientError::Unexpected { what } if what.contains(stray.label())),
                "{err}"
            );
            assert!(err.is_fatal());
        }
        // A node with a remote store and no disk: G3 is the remote store.
        let remote_g3 = [TierInfo {
            tier: Tier::G3,
            kind: kvtier_core::TierKind::Remote,
        }];
        let mut s = Session::new(LAYERS, &remote_g3);
        let call = s.lookup(&keys(1));
        let ok = Message::LookupOk(LookupOk {
            request_id: call.id,
            tiers: vec![Tier::G3],
        });
        assert_eq!(s.accept(&call, ok).unwrap(), Some(vec![Tier::G3]));
    }

    #[test]
    fn error_replies_are_refusals_and_only_closing_codes_are_fatal() {
        let mut s = session();
        let call = s.reserve(&keys(1));
        let err = s
            .accept(&call, error(call.id, ErrorCode::INTERNAL))
            .unwrap_err();
        assert!(matches!(
            &err,
            ClientError::Refused { code: ErrorCode::INTERNAL, message } if message == "no"
        ));
        assert!(!err.is_fatal());
        assert!(s.settle::<()>(Err(err)).is_err());
        s.start().unwrap();
        // Request 0: the connection itself failed.
        let err = s.accept(&call, error(0, ErrorCode::BAD_FRAME)).unwrap_err();
        assert!(err.is_fatal());
        assert!(err.to_string().contains("BAD_FRAME"), "{err}");
        // An error naming another request is out of order.
        assert!(matches!(
            s.accept(&call, error(call.id + 5, ErrorCode::INTERNAL)),
            Err(ClientError::WrongRequestId { .. })
        ));
    }

    #[test]
    fn a_fatal_error_breaks_the_session_and_a_disconnect_stays_one() {
        let mut s = session();
        let _ = s.settle::<()>(Err(ClientError::WrongRequestId {
            expected: 1,
            got: 2,
        }));
        assert!(
            matches!(s.start(), Err(ClientError::Broken { cause }) if cause.contains("request 2"))
        );
        let mut s = session();
        let _ = s.settle::<()>(Err(ClientError::Disconnected));
        assert!(matches!(s.start(), Err(ClientError::Disconnected)));
        // The first cause is kept.
        let _ = s.settle::<()>(Err(ClientError::Timeout(std::time::Duration::from_secs(1))));
        assert!(matches!(s.start(), Err(ClientError::Disconnected)));
    }

    #[test]
    fn a_call_cancelled_midway_breaks_the_session() {
        let mut s = session();
        s.start().unwrap();
        s.settle(Ok(())).unwrap();
        s.start().unwrap();
        // Its future was dropped: no settle.
        assert!(
            matches!(s.start(), Err(ClientError::Broken { cause }) if cause.contains("cancelled"))
        );
    }

    #[test]
    fn notifications_interleaved_with_replies_are_recorded_for_their_load() {
        let mut s = session();
        let (load, cell) = s.load(&keys(2));
        let load_ok = Message::LoadOk(LoadOk {
            request_id: load.id,
            results: vec![
                LoadResult::Arriving(Slot { offset: 0, len: 1 }),
                LoadResult::Miss,
            ],
        });
        // A notification may even come before the LoadOk.
        assert_eq!(s.accept(&load, ready(load.id, 0)).unwrap(), None);
        assert!(s.accept(&load, load_ok).unwrap().is_some());
        assert_eq!(cell.layers(), 1);
        // While another request is in flight.
        let reserve = s.reserve(&keys(1));
        assert_eq!(s.accept(&reserve, ready(load.id, 2)).unwrap(), None);
        assert_eq!(cell.layers(), 3);
        // Out of order: never goes back.
        assert_eq!(s.accept(&reserve, ready(load.id, 1)).unwrap(), None);
        assert_eq!(cell.layers(), 3);
        assert!(
            s.accept(&reserve, reserve_ok(reserve.id, 1))
                .unwrap()
                .is_some()
        );
        // With nothing in flight.
        s.accept_notification(ready(load.id, LAYERS - 1)).unwrap();
        assert_eq!(cell.layers(), LAYERS);
        // Complete: forgotten; a late duplicate is ignored.
        assert_eq!(s.tracked(), 0);
        s.accept_notification(ready(load.id, 0)).unwrap();
        assert_eq!(cell.layers(), LAYERS);
    }

    #[test]
    fn bad_notifications_and_stray_replies_are_refused() {
        let mut s = session();
        let (load, _cell) = s.load(&keys(1));
        // Never sent.
        assert!(s.accept_notification(ready(load.id + 1, 0)).is_err());
        assert!(s.accept_notification(ready(0, 0)).is_err());
        // Past the last layer.
        assert!(s.accept_notification(ready(load.id, LAYERS)).is_err());
        // A reply with nothing in flight.
        let stray = Message::Ack(Ack {
            request_id: load.id,
        });
        assert!(matches!(
            s.accept_notification(stray),
            Err(ClientError::Unexpected { .. })
        ));
        assert!(matches!(
            s.accept_notification(error(0, ErrorCode::HANDSHAKE)),
            Err(ClientError::Refused { .. })
        ));
    }

    #[test]
    fn dropped_loads_are_swept_and_their_notifications_ignored() {
        let mut s = session();
        let (first, cell) = s.load(&keys(1));
        drop(cell);
        s.accept_notification(ready(first.id, 1)).unwrap();
        for _ in 0..10 * MIN_SWEEP {
            let _ = s.load(&keys(1));
        }
        assert!(s.tracked() <= MIN_SWEEP, "{}", s.tracked());
        let (_, kept) = s.load(&keys(1));
        assert_eq!(kept.layers(), 0);
    }

    #[test]
    fn hello_replies() {
        let ok = HelloOk {
            protocol_version: PROTOCOL_VERSION,
            session_id: 9,
            shm_name: "x".into(),
            arena_len: 1,
            slot_size: 1,
            namespace_key: kvtier_protocol::NamespaceKey::from_bytes([3; 32]),
            tiers: node_tiers(),
        };
        assert_eq!(hello_reply(Message::HelloOk(ok.clone())).unwrap(), Some(ok));
        let opening = Message::Opening(kvtier_protocol::Opening { elapsed_ms: 1000 });
        assert_eq!(hello_reply(opening).unwrap(), None);
        let err = hello_reply(error(0, ErrorCode::GEOMETRY_MISMATCH)).unwrap_err();
        assert!(matches!(
            err,
            ClientError::Refused {
                code: ErrorCode::GEOMETRY_MISMATCH,
                ..
            }
        ));
        assert!(err.is_fatal());
        let stats = Message::StatsOk(StatsOk {
            request_id: 0,
            counters: vec![],
        });
        assert!(matches!(
            hello_reply(stats),
            Err(ClientError::Unexpected { .. })
        ));
    }
}
