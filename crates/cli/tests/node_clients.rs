//! Engine processes against `kvtier serve`:
//!
//! - four client processes storing and loading the same keys at once store
//!   each block exactly once and only ever read exact bytes;
//! - a client process SIGKILLed anywhere in reserve, fill or commit leaves
//!   the daemon serving, every slot it held free again, and nothing it half
//!   wrote readable.
//!
//! The client processes are this test binary started again
//! ([`Worker::spawn`]); [`client_process`] is their body.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use kvtier_arena::ArenaClient;
use kvtier_client::{BlockHash, BlockSums, Client, StoreOutcome};
use kvtier_protocol::{
    Commit, CommitEntry, CommitResult, Hello, KeyMap, KeysRequest, Message, PROTOCOL_VERSION,
    ReserveResult, WireGeometry, read_frame, write_frame,
};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use support::node::{
    Daemon, PATIENCE, Stats, Worker, block, block_bytes, check_block, check_held_block, geometry,
    namespace, param, report, role, seed, shm_name, wait_until, worker_config,
};

mod support;

/// Client processes storing at once.
const CLIENTS: u64 = 4;
/// Keys every one of them stores (each in its own order).
const SHARED_KEYS: u128 = 96;
/// Kill rounds of the client SIGKILL test.
const KILL_ROUNDS: usize = 40;
/// Blocks stored before the kill rounds, checked after each.
const RESIDENT: u128 = 8;

/// Not a test: the body of the client processes the tests of this file
/// start (this binary again, with `KVTIER_TEST_ROLE` set). Ignored so a
/// plain run lists it as ignored, never as a pass; run without a role it
/// has nothing to do and returns.
#[test]
#[ignore = "the body of client processes, started by the other tests of this file"]
fn client_process() {
    match role().as_deref() {
        None => {}
        Some("sharer") => sharer(),
        Some("victim") => victim(),
        Some(other) => panic!("unknown worker role {other:?}"),
    }
}

#[test]
fn concurrent_clients_store_each_key_once_and_read_exact_bytes() {
    let data = tempfile::tempdir().expect("data dir");
    let daemon = Daemon::start(data.path(), &shm_name("sharers"), &[]);
    let seed = seed();
    let sharers: Vec<Worker> = (0..CLIENTS)
        .map(|i| {
            let params = [
                ("socket", daemon.socket().display().to_string()),
                ("seed", (seed + i).to_string()),
                ("keys", SHARED_KEYS.to_string()),
            ];
            Worker::spawn("sharer", &params)
        })
        .collect();

    let mut stored_by: HashMap<u128, usize> = HashMap::new();
    let mut not_stored_here = 0u64;
    for (i, sharer) in sharers.into_iter().enumerate() {
        for line in sharer.finish() {
            let mut words = line.split_whitespace();
            match (words.next(), words.next().and_then(|w| w.parse().ok())) {
                (Some("stored"), Some(key)) => {
                    if let Some(other) = stored_by.insert(key, i) {
                        panic!("block {key} stored by client {other} and client {i}");
                    }
                }
                (Some("others"), Some(n)) => not_stored_here += n as u64,
                _ => panic!("unexpected report {line:?}"),
            }
        }
    }
    let keys: HashSet<u128> = stored_by.keys().copied().collect();
    assert_eq!(keys, (0..SHARED_KEYS).collect(), "keys stored by nobody");
    // Every other attempt was told the block is stored or being stored.
    assert_eq!(not_stored_here, (CLIENTS - 1) * SHARED_KEYS as u64);

    let mut client = daemon.client();
    let stats = Stats::of(&mut client);
    // How much the clients overlapped (not asserted: it depends on timing).
    eprintln!(
        "reserve_in_flight={} reserve_already_stored={}",
        stats.get("reserve_in_flight"),
        stats.get("reserve_already_stored")
    );
    let n = SHARED_KEYS as u64;
    assert_eq!(stats.get("committed"), n, "each block committed once");
    assert_eq!(stats.get("reserved"), n, "each block reserved once");
    assert_eq!(stats.get("reserve_no_space"), 0);
    assert_eq!(stats.get("commit_bad_checksum"), 0);
    assert_eq!(
        stats.get("reserve_already_stored") + stats.get("reserve_in_flight"),
        (CLIENTS - 1) * n
    );
    for key in 0..SHARED_KEYS {
        assert!(
            check_held_block(&mut client, key),
            "block {key} not readable"
        );
    }
}

/// A sharer: stores every shared key in its own random order, in batches
/// of 1 to 8, and between batches reads random keys: a key it knows is
/// stored must read back exact, any other exact or not at all. Reports
/// `stored <key>` for each block it stored itself and `others <n>` for the
/// blocks it was told another client stored or is storing.
fn sharer() {
    let mut client = Client::connect(worker_config()).expect("connect");
    let mut rng = StdRng::seed_from_u64(param("seed"));
    let keys: u128 = param("keys");
    let mut order: Vec<u128> = (0..keys).collect();
    order.shuffle(&mut rng);
    let mut known = HashSet::new();
    let mut others = 0u64;
    let mut rest = &order[..];
    while !rest.is_empty() {
        let (batch, tail) = rest.split_at(rng.random_range(1..=8).min(rest.len()));
        rest = tail;
        let blocks: Vec<Vec<u8>> = batch.iter().map(|k| block(*k)).collect();
        let pairs: Vec<(BlockHash, &[u8])> = batch
            .iter()
            .zip(&blocks)
            .map(|(k, b)| (BlockHash(*k), b.as_slice()))
            .collect();
        let outcomes = client.store(&pairs).expect("store");
        for (&key, outcome) in batch.iter().zip(outcomes) {
            match outcome {
                StoreOutcome::Stored => report(format!("stored {key}")),
                StoreOutcome::AlreadyStored | StoreOutcome::InFlightElsewhere => others += 1,
                other => panic!("block {key}: {other:?}"),
            }
            if outcome.is_stored() {
                known.insert(key);
            }
        }
        for _ in 0..3 {
            let key = rng.random_range(0..keys);
            let readable = check_block(&mut client, key);
            assert!(
                readable || !known.contains(&key),
                "stored block {key} not readable"
            );
        }
    }
    report(format!("others {others}"));
}

/// Where a victim can be stopped (and killed), in the order it passes
/// them. `fill-<i>` follows the `i`-th layer write of correct bytes over
/// the granted blocks, block by block; `commit-partial-sent` is a path of
/// its own: the first layer of each block filled, the rest still poison,
/// and a commit naming the checksums of the whole correct block.
fn stop_points(blocks: usize) -> Vec<String> {
    let mut points: Vec<String> = ["connected", "reserve-sent", "reserved", "poisoned"]
        .map(String::from)
        .to_vec();
    let writes = blocks * geometry().layers as usize;
    points.extend((0..writes - 1).map(|i| format!("fill-{i}")));
    points.extend(["filled", "commit-sent", "committed", "commit-partial-sent"].map(String::from));
    points
}

/// What the blocks a victim was storing must look like after it was
/// killed at a stop point.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    /// Killed before its commit was sent: nothing of it may be readable.
    Absent,
    /// The commit was sent but not answered: stored or not, never wrong.
    Either,
    /// The commit was answered `Stored`: readable and exact.
    Present,
    /// A commit whose sums the slot's bytes do not match: refused, so
    /// absent, and counted as a bad checksum.
    Refused,
}

fn expectation(point: &str) -> Expect {
    match point {
        "commit-sent" => Expect::Either,
        "committed" => Expect::Present,
        "commit-partial-sent" => Expect::Refused,
        _ => Expect::Absent,
    }
}

/// How a kill round stops its victim.
#[derive(Debug)]
enum Plan {
    /// The victim waits at this point until killed.
    Pause(String),
    /// The victim stores round after round; killed right after its
    /// `n`-th `at` report, so the kill lands wherever it got to.
    Run(usize),
}

#[test]
fn client_sigkill_anywhere_in_a_store_leaves_nothing_half_written() {
    let data = tempfile::tempdir().expect("data dir");
    // The lying victims' commits are refused only where the daemon hashes
    // what it commits (otherwise readers are the check).
    let verify = [("KVTIER_MANAGER__VERIFY_COMMITS", "true")];
    let daemon = Daemon::start(data.path(), &shm_name("victims"), &verify);
    let mut rng = StdRng::seed_from_u64(seed());
    let mut client = daemon.client();
    let resident: Vec<u128> = (1..=RESIDENT).collect();
    store_all(&mut client, &resident);
    assert_eq!(Stats::of(&mut client).get("blocks_g2"), RESIDENT as u64);
    let mut refused = 0u64;

    for round in 0..KILL_ROUNDS {
        let blocks = rng.random_range(1..=3usize);
        let points = stop_points(blocks);
        let plan = if round % 4 == 3 {
            Plan::Run(rng.random_range(1..=3 * points.len()))
        } else {
            Plan::Pause(points[rng.random_range(0..points.len())].clone())
        };
        let first = 1_000_000 * (round as u128 + 1);
        eprintln!("round {round}: {blocks} blocks from {first}, {plan:?}");
        let (victim, mut tally) = run_victim(&daemon, first, blocks, &plan);
        let fallback = match &plan {
            Plan::Pause(point) => expectation(point),
            // The batch in progress, wherever the kill landed in it.
            Plan::Run(_) => Expect::Either,
        };
        if let Plan::Pause(_) = &plan {
            // Alive and holding whatever it holds: the same rules apply.
            check_victim_blocks(&mut client, &tally.outcome(fallback));
        }
        if fallback == Expect::Refused {
            refused += blocks as u64;
        }
        for line in victim.kill() {
            tally.note(&line);
        }
        let outcome = tally.outcome(fallback);
        // The dead session is gone once the daemon counts only ours.
        wait_until("the killed client's session to end", || {
            (Stats::of(&mut client).get("sessions_open") == 1).then_some(())
        });
        check_victim_blocks(&mut client, &outcome);
        for &key in &resident {
            assert!(
                check_held_block(&mut client, key),
                "resident block {key} lost"
            );
        }
        check_reservations_ended(&mut client, refused);
        store_again_and_remove(&mut client, &outcome);
    }
    fill_every_free_slot(&mut client);
}

/// Every reservation ever made has ended: committed, refused at commit,
/// or dropped (by abort, disconnect or lease).
fn check_reservations_ended(client: &mut Client, refused: u64) {
    let stats = Stats::of(client);
    assert_eq!(stats.get("commit_bad_checksum"), refused);
    assert_eq!(
        stats.get("reserved"),
        stats.get("committed") + stats.get("commit_bad_checksum") + stats.get("aborted"),
        "reservations still held after the client died: {stats:?}"
    );
}

/// Nothing of the victim's is stuck: each block it left unstored can be
/// stored now (its slot and its in-flight mark were given back), and
/// reads back exact. Then every one of its blocks is removed, and G2 holds
/// the resident blocks only, as before the round.
fn store_again_and_remove(client: &mut Client, outcome: &Outcome) {
    for &key in &outcome.keys {
        let bytes = block(key);
        let got = client.store(&[(BlockHash(key), &bytes)]).expect("store");
        let ok = match outcome.expect[&key] {
            Expect::Absent | Expect::Refused => got == [StoreOutcome::Stored],
            Expect::Present => got == [StoreOutcome::AlreadyStored],
            Expect::Either => got[0].is_stored(),
        };
        assert!(
            ok,
            "block {key} ({:?}) stored again: {got:?}",
            outcome.expect[&key]
        );
        assert!(check_held_block(client, key), "block {key} not readable");
    }
    let keys: Vec<BlockHash> = outcome.keys.iter().map(|k| BlockHash(*k)).collect();
    client.remove(&keys).expect("remove");
    wait_until("G2 back to its resident blocks", || {
        (Stats::of(client).get("blocks_g2") == RESIDENT as u64).then_some(())
    });
}

/// What a victim worked on: every key, and for each what it must look
/// like now.
struct Outcome {
    keys: Vec<u128>,
    expect: HashMap<u128, Expect>,
}

/// What a victim reported: the keys of each batch it started, and the
/// blocks it was told are stored.
struct Tally {
    blocks: usize,
    keys: Vec<u128>,
    stored: HashSet<u128>,
}

impl Tally {
    fn note(&mut self, line: &str) {
        let mut words = line.split_whitespace();
        match (
            words.next(),
            words.next().and_then(|w| w.parse::<u128>().ok()),
        ) {
            (Some("round"), Some(from)) => self.keys.extend(from..from + self.blocks as u128),
            (Some("stored"), Some(key)) => {
                self.stored.insert(key);
            }
            _ => {}
        }
    }

    /// Stored blocks must be present; the others as `fallback` says.
    fn outcome(&self, fallback: Expect) -> Outcome {
        let expect = self
            .keys
            .iter()
            .map(|k| match self.stored.contains(k) {
                true => (*k, Expect::Present),
                false => (*k, fallback),
            })
            .collect();
        Outcome {
            keys: self.keys.clone(),
            expect,
        }
    }
}

/// Starts a victim storing `blocks` blocks from key `first` and lets it
/// run as `plan` says (to its stop point, or for a number of steps);
/// returns it, still alive, with what it reported so far.
fn run_victim(daemon: &Daemon, first: u128, blocks: usize, plan: &Plan) -> (Worker, Tally) {
    let stop = match plan {
        Plan::Pause(point) => point.clone(),
        Plan::Run(_) => "never".to_owned(),
    };
    let params = [
        ("socket", daemon.socket().display().to_string()),
        ("first", first.to_string()),
        ("blocks", blocks.to_string()),
        ("stop", stop),
    ];
    let mut victim = Worker::spawn("victim", &params);
    let mut tally = Tally {
        blocks,
        keys: Vec::new(),
        stored: HashSet::new(),
    };
    match plan {
        Plan::Pause(_) => {
            victim.wait_for(|l| tally.note(l), |l| l == "paused");
        }
        Plan::Run(n) => {
            for _ in 0..*n {
                victim.wait_for(|l| tally.note(l), |l| l.starts_with("at "));
            }
        }
    }
    (victim, tally)
}

/// Each block the victim worked on reads back as its expectation says,
/// and never with other bytes.
fn check_victim_blocks(client: &mut Client, outcome: &Outcome) {
    for key in &outcome.keys {
        let readable = check_block(client, *key);
        match outcome.expect[key] {
            Expect::Absent | Expect::Refused => {
                assert!(!readable, "block {key} readable though never committed")
            }
            Expect::Present => assert!(readable, "committed block {key} not readable"),
            Expect::Either => {}
        }
    }
}

/// Stores `keys`, each of which must be new.
fn store_all(client: &mut Client, keys: &[u128]) {
    let blocks: Vec<Vec<u8>> = keys.iter().map(|k| block(*k)).collect();
    let pairs: Vec<(BlockHash, &[u8])> = keys
        .iter()
        .zip(&blocks)
        .map(|(k, b)| (BlockHash(*k), b.as_slice()))
        .collect();
    let outcomes = client.store(&pairs).expect("store");
    assert_eq!(outcomes, vec![StoreOutcome::Stored; keys.len()]);
}

/// Stores a new block into every free G2 slot: all must be granted, so no
/// arena slot was lost to a killed client (the arena refuses a reservation
/// the pool would grant when a slot leaked).
fn fill_every_free_slot(client: &mut Client) {
    let stats = Stats::of(client);
    let free = stats.get("capacity_g2") - stats.get("blocks_g2");
    let keys: Vec<u128> = (0..u128::from(free)).map(|k| 7_000_000_000 + k).collect();
    for chunk in keys.chunks(32) {
        store_all(client, chunk);
    }
}

/// A victim: stores blocks over the raw protocol so it can stop between
/// any two steps (see [`stop_points`]), reporting `at <point>` as it
/// passes each, `round <first key>` as it starts a batch and `stored
/// <key>` for each block committed; at its stop point it reports `paused`
/// and waits to be killed. With stop `never` it stores batch after batch.
fn victim() {
    let first: u128 = param("first");
    let blocks: usize = param("blocks");
    let stop: String = param("stop");
    let mut conn = RawConn::connect(&param::<PathBuf>("socket"));
    passing(&stop, "connected");
    for round in 0u128.. {
        let from = first + round * blocks as u128;
        report(format!("round {from}"));
        let keys: Vec<u128> = (from..from + blocks as u128).collect();
        store_raw(&mut conn, &keys, &stop);
        if stop != "never" {
            panic!("stop point {stop:?} never reached");
        }
    }
}

/// Reports `point`; waits there forever when it is the stop point.
fn passing(stop: &str, point: &str) {
    report(format!("at {point}"));
    if stop == point {
        report("paused");
        loop {
            std::thread::park();
        }
    }
}

/// Bytes a victim writes over every slot it is granted before the real
/// block: if any of it were ever served, the reader's comparison with
/// [`block`] would fail.
fn poison(len: usize) -> Vec<u8> {
    b"half-written slot! "
        .iter()
        .copied()
        .cycle()
        .take(len)
        .collect()
}

/// One store over the raw protocol, passing every stop point.
fn store_raw(conn: &mut RawConn, keys: &[u128], stop: &str) {
    let hashes: Vec<BlockHash> = keys.iter().map(|k| BlockHash(*k)).collect();
    let id = conn.send(|request_id| {
        Message::Reserve(KeysRequest {
            request_id,
            keys: hashes.clone(),
        })
    });
    passing(stop, "reserve-sent");
    let Message::ReserveOk(ok) = conn.recv() else {
        panic!("Reserve {id} not answered with ReserveOk");
    };
    passing(stop, "reserved");
    let slots: Vec<usize> = ok
        .results
        .iter()
        .map(|r| match r {
            ReserveResult::Slot(s) => conn.arena.slot_at(s.offset, s.len).expect("a slot"),
            other => panic!("a new block was not granted a slot: {other:?}"),
        })
        .collect();
    let layer = geometry().layer_bytes() as usize;
    for (&key, &slot) in keys.iter().zip(&slots) {
        for l in 0..geometry().layers as usize {
            conn.fill_layer(slot, key, l, &poison(layer));
        }
    }
    passing(stop, "poisoned");
    if stop == "commit-partial-sent" {
        commit_half_filled(conn, keys, &slots, stop);
    }
    let mut entries = Vec::new();
    let mut writes = 0;
    for (&key, &slot) in keys.iter().zip(&slots) {
        let bytes = block(key);
        let mut sums = Vec::new();
        for (l, part) in bytes.chunks(layer).enumerate() {
            sums.push(conn.fill_layer(slot, key, l, part));
            if writes + 1 < keys.len() * geometry().layers as usize {
                passing(stop, &format!("fill-{writes}"));
            }
            writes += 1;
        }
        let stored = conn.keys.stored(BlockHash(key));
        let sums = conn.arena.block_sums(stored, sums).expect("block sums");
        entries.push(CommitEntry {
            key: BlockHash(key),
            sums,
        });
    }
    passing(stop, "filled");
    commit(conn, keys, entries, stop);
}

/// Sends the commit and reports each block the daemon stored.
fn commit(conn: &mut RawConn, keys: &[u128], entries: Vec<CommitEntry>, stop: &str) {
    conn.send(|request_id| {
        Message::Commit(Commit {
            request_id,
            entries,
        })
    });
    passing(stop, "commit-sent");
    let Message::CommitOk(ok) = conn.recv() else {
        panic!("Commit not answered with CommitOk");
    };
    for (key, result) in keys.iter().zip(&ok.results) {
        assert_eq!(*result, CommitResult::Stored, "block {key}");
        report(format!("stored {key}"));
    }
    passing(stop, "committed");
}

/// Fills only the first layer of each granted slot (the rest is poison)
/// and commits the checksums of the whole correct blocks, then stops.
fn commit_half_filled(conn: &mut RawConn, keys: &[u128], slots: &[usize], stop: &str) {
    let layer = geometry().layer_bytes() as usize;
    let mut entries = Vec::new();
    for (&key, &slot) in keys.iter().zip(slots) {
        let bytes = block(key);
        conn.fill_layer(slot, key, 0, &bytes[..layer]);
        let stored = conn.keys.stored(BlockHash(key));
        entries.push(CommitEntry {
            key: BlockHash(key),
            sums: BlockSums::compute(stored, layer, &bytes),
        });
    }
    conn.send(|request_id| {
        Message::Commit(Commit {
            request_id,
            entries,
        })
    });
    passing(stop, "commit-partial-sent");
}

/// A connection that speaks the protocol frame by frame, with the arena
/// mapped: what a victim needs to stop between sending a request and
/// reading its answer.
struct RawConn {
    stream: UnixStream,
    arena: ArenaClient,
    keys: KeyMap,
    next_id: u64,
}

impl RawConn {
    /// Connects, says `Hello` and maps the arena the daemon names.
    fn connect(socket: &PathBuf) -> Self {
        let mut stream = UnixStream::connect(socket).expect("connect");
        stream
            .set_read_timeout(Some(PATIENCE))
            .expect("read timeout");
        let hello = Message::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            namespace: namespace(),
            geometry: WireGeometry::from(&geometry()),
            instance: None,
        });
        write_frame(&mut stream, &hello).expect("send Hello");
        let Some(Message::HelloOk(ok)) = read_frame(&mut stream).expect("read HelloOk") else {
            panic!("Hello not answered with HelloOk");
        };
        let arena = ArenaClient::open(&ok.shm_name).expect("map the arena");
        assert_eq!(arena.block_bytes(), block_bytes());
        Self {
            stream,
            arena,
            keys: KeyMap::new(ok.namespace_key),
            next_id: 1,
        }
    }

    /// Sends the request `make` builds for the next request id.
    fn send(&mut self, make: impl FnOnce(u64) -> Message) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        write_frame(&mut self.stream, &make(id)).expect("send a request");
        self.stream.flush().expect("flush");
        id
    }

    /// The next message (one request is in flight at a time).
    fn recv(&mut self) -> Message {
        read_frame(&mut self.stream)
            .expect("read an answer")
            .expect("the daemon closed the connection")
    }

    /// Writes `part` as layer `layer` of client block `key` into `slot`;
    /// its checksum.
    fn fill_layer(&self, slot: usize, key: u128, layer: usize, part: &[u8]) -> u64 {
        let stored = self.keys.stored(BlockHash(key));
        // SAFETY: the daemon granted `slot` to this connection in the
        // ReserveOk just read and has seen no commit or abort for it; this
        // process writes it from one thread and never reads it.
        unsafe { self.arena.fill_layer(slot, stored, layer, part) }.expect("fill a layer")
    }
}

/// With `manager.metrics_addr` and no metadata service, the node serves
/// `/metrics` itself, and its families count what a client did.
#[test]
fn the_node_serves_its_metrics_without_the_metadata_service() {
    let data = tempfile::tempdir().expect("data dir");
    let daemon = Daemon::start(
        data.path(),
        &shm_name("metrics"),
        &[("KVTIER_MANAGER__METRICS_ADDR", "127.0.0.1:0")],
    );
    let addr: std::net::SocketAddr = daemon
        .ready_line()
        .split_whitespace()
        .find_map(|w| w.strip_prefix("metrics="))
        .expect("the ready line names the metrics address")
        .parse()
        .expect("an address");
    let mut client = daemon.client();
    store_all(&mut client, &[1, 2, 3]);
    let (status, text) = support::http_text(addr, "GET", "/metrics", None, "");
    assert_eq!(status, 200, "{text}");
    let sample = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {name} sample in:\n{text}"))
    };
    assert_eq!(sample("kvtier_node_committed_total"), 3.0);
    assert_eq!(sample("kvtier_tier_blocks{tier=\"g2\"}"), 3.0);
    assert!(text.trim_end().ends_with("# EOF"), "{text}");
    let (status, _) = support::http_text(addr, "GET", "/health", None, "");
    assert_eq!(status, 200);
}
