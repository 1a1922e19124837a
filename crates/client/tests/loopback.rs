//! The client against a real Unix socket and a real arena.
//!
//! The node daemon (`kvtier serve`) does not exist yet, so a minimal
//! responder stands in for it: a thread on a `UnixListener` that owns a
//! real `MemoryTier` and answers `Hello`, `Reserve`, `Commit`, `Abort`,
//! `Load` (a `LoadOk`, then one `LayerReady` per layer) and `Release` with
//! real arena slots, one connection at a time. Nothing else of the daemon
//! (namespaces, leases, lower tiers) is modelled. These tests will run
//! against `kvtier serve` once it lands.

use std::collections::HashMap;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use kvtier_client::{
    AsyncClient, BlockHash, Client, ClientConfig, ClientError, ErrorCode, Lookup, Namespace,
    StoreOutcome, WireGeometry,
};
use kvtier_core::EvictionPolicyKind;
use kvtier_mem::{BlockRef, MemoryTier, MemoryTierConfig, PutOutcome, Reserve, SlotReservation};
use kvtier_protocol::{
    Ack, CommitOk, CommitResult, Error, HelloOk, KeysRequest, LayerReady, LoadOk, LoadResult,
    Message, PROTOCOL_VERSION, ReserveOk, ReserveResult, Slot, read_frame, write_frame,
};

const BLOCK: usize = 16 * 1024;
const LAYER: usize = 4 * 1024;
const LAYERS: u32 = 4;
const GEOMETRY: WireGeometry = WireGeometry {
    layers: LAYERS,
    block_bytes: BLOCK as u64,
    layer_bytes: LAYER as u64,
};

fn block(k: u128) -> Vec<u8> {
    let seed = (k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..BLOCK as u64)
        .map(|i| (seed.wrapping_mul(i + 5) >> 33) as u8)
        .collect()
}

/// The stand-in daemon; stopped (and its arena removed) when dropped.
struct Responder {
    socket: PathBuf,
    tier: MemoryTier,
    /// The connection being served, so a test can hang up on the client.
    current: Arc<Mutex<Option<UnixStream>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Responder {
    fn start() -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let tier = MemoryTier::create(MemoryTierConfig {
            shm_name: format!("kvtier-client-loopback-{}-{n}", std::process::id()),
            capacity_bytes: 8 * BLOCK as u64,
            block_bytes: BLOCK,
            layer_bytes: LAYER,
            hugepages: false,
            policy: EvictionPolicyKind::Lru,
        })
        .expect("create tier");
        let dir = tempfile::tempdir().expect("temp dir");
        let socket = dir.path().join("node.sock");
        let listener = UnixListener::bind(&socket).expect("bind");
        let current = Arc::new(Mutex::new(None));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (tier, current, stop) = (tier.clone(), Arc::clone(&current), Arc::clone(&stop));
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let stream = stream.expect("accept");
                    *current.lock().unwrap() = stream.try_clone().ok();
                    serve(&tier, stream);
                }
            })
        };
        Self {
            socket,
            tier,
            current,
            stop,
            thread: Some(thread),
            _dir: dir,
        }
    }

    fn config(&self) -> ClientConfig {
        Self::config_for(self.socket.clone())
    }

    fn config_for(socket: PathBuf) -> ClientConfig {
        let namespace = Namespace {
            model: "test".into(),
            dtype: "bf16".into(),
            layout_version: 1,
            block_size_tokens: 16,
            tp_rank: 0,
            tp_size: 1,
            tenant_salt: None,
        };
        ClientConfig::new(socket, namespace, GEOMETRY)
    }

    fn hang_up(&self) {
        if let Some(s) = self.current.lock().unwrap().take() {
            s.shutdown(std::net::Shutdown::Both).unwrap();
        }
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.hang_up();
        // Wakes the accept loop so it sees `stop`.
        let _ = UnixStream::connect(&self.socket);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One connection's reservations and pins.
#[derive(Default)]
struct Conn {
    reserved: HashMap<BlockHash, SlotReservation>,
    pinned: Vec<BlockRef>,
}

fn serve(tier: &MemoryTier, mut stream: UnixStream) {
    let mut conn = Conn::default();
    while let Ok(Some(msg)) = read_frame(&mut stream) {
        let close = matches!(msg, Message::Hello(ref h) if h.geometry != GEOMETRY);
        for reply in answer(tier, &mut conn, msg) {
            if write_frame(&mut stream, &reply).is_err() {
                return;
            }
        }
        if close {
            return;
        }
    }
}

fn slot(tier: &MemoryTier, slot: usize) -> Slot {
    Slot {
        offset: tier.slot_offset(slot),
        len: BLOCK as u64,
    }
}

fn ack(r: &KeysRequest) -> Vec<Message> {
    vec![Message::Ack(Ack {
        request_id: r.request_id,
    })]
}

fn answer(tier: &MemoryTier, conn: &mut Conn, msg: Message) -> Vec<Message> {
    match msg {
        Message::Hello(h) if h.geometry != GEOMETRY => vec![Message::Error(Error {
            request_id: 0,
            code: ErrorCode::GEOMETRY_MISMATCH,
            message: "the namespace holds blocks of another geometry".into(),
        })],
        Message::Hello(_) => vec![Message::HelloOk(HelloOk {
            protocol_version: PROTOCOL_VERSION,
            session_id: 1,
            shm_name: tier.shm_name().into(),
            arena_len: tier.file_bytes(),
            slot_size: tier.slot_bytes() as u64,
        })],
        Message::Reserve(r) => {
            let results = r.keys.iter().map(|&k| reserve(tier, conn, k)).collect();
            vec![Message::ReserveOk(ReserveOk {
                request_id: r.request_id,
                results,
            })]
        }
        Message::Commit(c) => {
            let results = c
                .entries
                .iter()
                .map(
                    |e| match conn.reserved.remove(&e.key).map(|r| r.commit(&e.sums)) {
                        None => CommitResult::NotReserved,
                        Some(Ok(PutOutcome::Stored)) => CommitResult::Stored,
                        Some(Ok(_)) => CommitResult::AlreadyStored,
                        Some(Err(_)) => CommitResult::BadChecksum,
                    },
                )
                .collect();
            vec![Message::CommitOk(CommitOk {
                request_id: c.request_id,
                results,
            })]
        }
        Message::Abort(r) => {
            r.keys.iter().for_each(|k| drop(conn.reserved.remove(k)));
            ack(&r)
        }
        Message::Load(r) => load(tier, conn, &r),
        Message::Release(r) => {
            conn.pinned.retain(|b| !r.keys.contains(&b.key()));
            ack(&r)
        }
        other => panic!("the stand-in daemon does not answer {}", other.name()),
    }
}

fn reserve(tier: &MemoryTier, conn: &mut Conn, key: BlockHash) -> ReserveResult {
    match tier.reserve(key).expect("reserve") {
        Reserve::Reserved(r) => {
            let s = slot(tier, r.slot());
            conn.reserved.insert(key, r);
            ReserveResult::Slot(s)
        }
        Reserve::AlreadyPresent => ReserveResult::AlreadyStored,
        Reserve::Full => ReserveResult::NoSpace,
    }
}

/// A `LoadOk` with the resident keys pinned (held by a `BlockRef`), then
/// every layer ready at once: the blocks are resident already.
fn load(tier: &MemoryTier, conn: &mut Conn, r: &KeysRequest) -> Vec<Message> {
    let results: Vec<LoadResult> = r
        .keys
        .iter()
        .map(|&k| match tier.get_ref(k) {
            Some(b) => {
                let s = slot(tier, b.slot());
                conn.pinned.push(b);
                LoadResult::Slot(s)
            }
            None => LoadResult::Miss,
        })
        .collect();
    let any = results.iter().any(|r| matches!(r, LoadResult::Slot(_)));
    let mut out = vec![Message::LoadOk(LoadOk {
        request_id: r.request_id,
        results,
    })];
    if any {
        out.extend((0..LAYERS).map(|layer| {
            Message::LayerReady(LayerReady {
                request_id: r.request_id,
                layer,
            })
        }));
    }
    out
}

fn batch(blocks: &[(u128, Vec<u8>)]) -> Vec<(BlockHash, &[u8])> {
    blocks
        .iter()
        .map(|(k, b)| (BlockHash(*k), &b[..]))
        .collect()
}

fn keys(ks: &[u128]) -> Vec<BlockHash> {
    ks.iter().copied().map(BlockHash).collect()
}

#[test]
fn stores_and_loads_blocks_through_the_arena() {
    let daemon = Responder::start();
    let mut client = Client::connect(daemon.config()).expect("connect");
    assert_eq!(client.hello().shm_name, daemon.tier.shm_name());
    assert_eq!(client.arena().block_bytes(), BLOCK);

    let blocks: Vec<(u128, Vec<u8>)> = (1..=3).map(|k| (k, block(k))).collect();
    let outcomes = client.store(&batch(&blocks)).unwrap();
    assert_eq!(outcomes, vec![StoreOutcome::Stored; 3]);
    assert_eq!(daemon.tier.len(), 3);
    let again = client.store(&batch(&blocks[..1])).unwrap();
    assert_eq!(again, vec![StoreOutcome::AlreadyStored]);

    let mut bufs = vec![vec![0u8; BLOCK]; 3];
    let mut dsts: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
    assert_eq!(client.load_into(&keys(&[1, 2, 3]), &mut dsts).unwrap(), 3);
    for (k, buf) in (1..=3).zip(&bufs) {
        assert_eq!(*buf, block(k));
    }
    // A miss ends the prefix.
    let mut dsts: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
    assert_eq!(client.load_into(&keys(&[1, 99, 3]), &mut dsts).unwrap(), 1);

    // Layer by layer, from a load held open.
    let load = client.load(&keys(&[3, 99])).unwrap();
    assert_eq!((load.prefix_len(), load.held_keys()), (1, keys(&[3])));
    client.wait_layer(&load, 1).unwrap();
    let mut part = vec![0u8; LAYER];
    assert_eq!(load.read_layer(0, 1, &mut part).unwrap(), Lookup::Hit);
    assert_eq!(part, block(3)[LAYER..2 * LAYER]);
    assert_eq!(load.read_layer(1, 1, &mut part).unwrap(), Lookup::Miss);
    client.release_load(load).unwrap();
}

#[test]
fn a_corrupted_block_ends_the_verified_prefix() {
    let daemon = Responder::start();
    let mut client = Client::connect(daemon.config()).unwrap();
    let blocks: Vec<(u128, Vec<u8>)> = (1..=3).map(|k| (k, block(k))).collect();
    client.store(&batch(&blocks)).unwrap();
    let slot = daemon.tier.get_ref(BlockHash(2)).unwrap().slot();
    let (arena, _) = daemon.tier.arena();
    // SAFETY: one byte of a resident slot of the stand-in's arena; no copy
    // of it is in flight.
    unsafe { *arena.add(slot * daemon.tier.slot_bytes() + BLOCK - 1) ^= 1 };
    let mut bufs = vec![vec![0u8; BLOCK]; 3];
    let mut dsts: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
    assert_eq!(client.load_into(&keys(&[1, 2, 3]), &mut dsts).unwrap(), 1);
}

#[test]
fn refusals_and_hang_ups_are_typed_errors() {
    let daemon = Responder::start();
    let mut wrong = daemon.config();
    wrong.geometry.layers = 8;
    wrong.geometry.layer_bytes = (BLOCK / 8) as u64;
    let err = Client::connect(wrong).unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::Refused {
                code: ErrorCode::GEOMETRY_MISMATCH,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.is_fatal());

    let mut client = Client::connect(daemon.config()).unwrap();
    daemon.hang_up();
    let err = client.reserve(&keys(&[1])).unwrap_err();
    assert!(matches!(err, ClientError::Disconnected), "{err}");
    assert!(matches!(
        client.reserve(&keys(&[1])),
        Err(ClientError::Disconnected)
    ));
    // A new connection works.
    let mut client = Client::connect(daemon.config()).unwrap();
    assert_eq!(
        client.store(&[(BlockHash(4), &block(4)[..])]).unwrap(),
        vec![StoreOutcome::Stored]
    );
}

#[test]
fn the_async_client_makes_the_same_round_trips() {
    let daemon = Responder::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut client = AsyncClient::connect(daemon.config()).await.unwrap();
        let blocks: Vec<(u128, Vec<u8>)> = (1..=2).map(|k| (k, block(k))).collect();
        let outcomes = client.store(&batch(&blocks)).await.unwrap();
        assert_eq!(outcomes, vec![StoreOutcome::Stored; 2]);
        let mut bufs = vec![vec![0u8; BLOCK]; 3];
        let mut dsts: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
        let n = client
            .load_into(&keys(&[2, 1, 7]), &mut dsts)
            .await
            .unwrap();
        assert_eq!(n, 2);
        assert_eq!((&bufs[0], &bufs[1]), (&block(2), &block(1)));
        let load = client.load(&keys(&[1])).await.unwrap();
        client.wait_layer(&load, LAYERS - 1).await.unwrap();
        let mut out = vec![0u8; BLOCK];
        assert_eq!(load.read(0, &mut out).unwrap(), Lookup::Hit);
        assert_eq!(out, block(1));
        client.release_load(load).await.unwrap();
    });
}

/// A daemon that accepts and never answers: the call fails with `Timeout`
/// (on a paused clock, so nothing waits for real).
#[test]
fn a_silent_daemon_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("silent.sock");
    // Connections queue in the backlog; nobody reads them.
    let _listener = UnixListener::bind(&socket).unwrap();
    let mut config = Responder::config_for(socket);
    config.timeout = std::time::Duration::from_secs(30);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let err = rt.block_on(AsyncClient::connect(config)).unwrap_err();
    assert!(
        matches!(err, ClientError::Timeout(t) if t.as_secs() == 30),
        "{err}"
    );
    assert!(err.is_fatal());
}
