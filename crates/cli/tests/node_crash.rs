//! `kvtier serve` SIGKILLed under traffic, again and again: client
//! processes storing and loading see a clear error (`Disconnected` or
//! `Io`) and connect again once the daemon is back; the restarted daemon
//! (same data directory, same configuration) adopts the arena the killed
//! one left and the disk log, and every block a client was told is stored
//! reads back exact; every read, before or after, gives the exact bytes or
//! a miss, never others; and no block a client reserved and filled but
//! never committed is ever served (issue 30, item 7).
//!
//! The daemon runs in exclusive mode (the default), where a commit is
//! answered once the block is published in the arena: until G2 needs room
//! and moves it down to the disk log, a stored block lives in DRAM only,
//! so every kill lands with DRAM-only blocks that must survive it. The
//! arena is small (64 blocks), so G2 also moves blocks down under traffic
//! and loads come back from disk.
//!
//! The client processes are this test binary started again
//! ([`Worker::spawn`]); [`client_process`] is their body.

use std::path::PathBuf;
use std::time::Duration;

use kvtier_client::{BlockHash, Client, ClientError, ReserveResult, StoreOutcome};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use support::node::{
    Daemon, Stats, Worker, block, check_held_block, param, read_block, report, role, seed,
    shm_name, try_read_block, try_read_held_block, worker_config,
};

mod support;

/// Daemon kills.
const ROUNDS: usize = 20;
/// Client processes.
const CLIENTS: u128 = 2;
/// Batches a client stores per connection; then it only loads, so the
/// blocks stored over the whole test stay well within the disk log.
const BATCHES_PER_LIFE: usize = 6;
/// Blocks acknowledged in earlier rounds checked again after each restart.
const OLD_SAMPLE: usize = 32;
/// Keys of client `i` are `i * KEY_SPACE + n`.
const KEY_SPACE: u128 = 1_000_000;
/// Keys a client reserves and fills but never commits start here (in its
/// own key range): none of them may ever be readable.
const UNCOMMITTED: u128 = KEY_SPACE / 2;
/// Pause between two connection attempts while the daemon is down.
const RECONNECT_PAUSE: Duration = Duration::from_millis(5);

/// Not a test: the body of the client processes the tests of this file
/// start (this binary again, with `KVTIER_TEST_ROLE` set). Ignored so a
/// plain run lists it as ignored, never as a pass; run without a role it
/// has nothing to do and returns.
#[test]
#[ignore = "the body of client processes, started by the other tests of this file"]
fn client_process() {
    match role().as_deref() {
        None => {}
        Some("traffic") => traffic(),
        Some(other) => panic!("unknown worker role {other:?}"),
    }
}

fn start(data: &std::path::Path) -> Daemon {
    let env = [
        // The default, spelled out: the mode where DRAM-only blocks exist.
        ("KVTIER_MANAGER__MODE", "exclusive"),
        ("KVTIER_MEMORY__CAPACITY", "1MiB"),
        ("KVTIER_DISK__CAPACITY_PER_DIR", "64MiB"),
    ];
    Daemon::start(data, &shm_name("crash"), &env)
}

/// What the test heard from the clients.
#[derive(Default)]
struct Heard {
    /// Every acknowledged block, in the order the acknowledgements were read.
    acked: Vec<u128>,
    /// Every block reserved and filled but (so far) never committed.
    uncommitted: Vec<u128>,
    /// Stores answered `NoSpace` (not acknowledged, so not checked).
    no_space: usize,
}

impl Heard {
    /// Records an `acked <key>` or `uncommitted <key>` report.
    fn note(&mut self, line: &str) {
        let key = |rest: &str| rest.parse::<u128>().expect("a key");
        if let Some(rest) = line.strip_prefix("acked ") {
            self.acked.push(key(rest));
        } else if let Some(rest) = line.strip_prefix("uncommitted ") {
            self.uncommitted.push(key(rest));
        } else if line.starts_with("nospace ") {
            self.no_space += 1;
        }
    }
}

#[test]
fn daemon_sigkill_under_traffic_loses_no_acknowledged_block() {
    let data = tempfile::tempdir().expect("data dir");
    let stop = data.path().join("stop");
    let mut daemon = start(data.path());
    let mut rng = StdRng::seed_from_u64(seed());
    let mut clients: Vec<Worker> = (0..CLIENTS)
        .map(|i| {
            let params = [
                ("socket", daemon.socket().display().to_string()),
                ("seed", rng.random::<u64>().to_string()),
                ("first", (i * KEY_SPACE).to_string()),
                ("others", (((i + 1) % CLIENTS) * KEY_SPACE).to_string()),
                ("stop", stop.display().to_string()),
            ];
            Worker::spawn("traffic", &params)
        })
        .collect();
    let mut heard = Heard::default();
    // How many acknowledged blocks were checked since their acknowledgement.
    let mut checked = 0;
    // Blocks adopted from the killed daemons' arenas, over all rounds.
    let mut from_dram = 0;
    // The disk log must never reclaim a region, or misses would be
    // legitimate. It takes more than the blocks stored: in exclusive mode
    // blocks move down and back up (each move down a new write), every life
    // seals the region it had open, and every restart forgets the log's
    // copies of the blocks the arena kept (which may be writes the kill
    // tore), to write them again when G2 moves them down. Three slots per
    // block stored leaves room for all of it.
    let stored = CLIENTS as usize * ROUNDS * (BATCHES_PER_LIFE + 1) * 3;
    let mut check = daemon.client();
    let capacity = Stats::of(&mut check).get("capacity_g3");
    assert!(
        capacity > 3 * stored as u64,
        "a disk log of {capacity} blocks for up to {stored} blocks stored"
    );
    drop(check);

    for round in 0..ROUNDS {
        // Wait until every client is connected to this life, then for a
        // random number of new acknowledgements: the kill lands among
        // stores as often as among loads.
        for c in &mut clients {
            c.wait_for(|l| heard.note(l), |l| l == "connected");
        }
        let want = rng.random_range(1..=BATCHES_PER_LIFE);
        let before = heard.acked.len();
        for i in (0..clients.len()).cycle() {
            if heard.acked.len() >= before + want {
                break;
            }
            clients[i].wait_for(|l| heard.note(l), |l| l.starts_with("acked "));
        }
        daemon.kill();
        for c in &mut clients {
            let lost = c.wait_for(|l| heard.note(l), |l| l.starts_with("lost "));
            eprintln!("round {round}: client {} {lost}", c.pid());
        }
        daemon.restart();
        let (g2, g3) = (daemon.adopted("g2"), daemon.adopted("g3"));
        from_dram += g2;
        eprintln!(
            "round {round}: {} blocks acknowledged, {g2} adopted from the arena, {g3} from the disk log",
            heard.acked.len()
        );
        // Each acknowledged block is in the arena or the disk log (both,
        // if the kill cut a move down short).
        assert!(
            g2 + g3 >= heard.acked.len() as u64,
            "{g2} + {g3} blocks adopted, {} acknowledged; {}",
            heard.acked.len(),
            daemon.ready_line()
        );
        // The blocks acknowledged since the last check, and a sample of
        // the older ones (every one is checked again at the end).
        let acked = &heard.acked;
        let mut keys = acked[checked..].to_vec();
        keys.extend((0..OLD_SAMPLE.min(checked)).map(|_| acked[rng.random_range(0..checked)]));
        check_acked(&daemon, &keys, acked.len());
        check_uncommitted(&daemon, &heard.uncommitted);
        checked = acked.len();
    }
    // Every kill left DRAM-only blocks (the rounds store into a 64-block
    // arena), so the arena's adoption must have carried some.
    assert!(from_dram > 0, "no block was adopted from an arena");

    std::fs::write(&stop, b"").expect("create the stop file");
    for c in clients {
        for line in c.finish() {
            heard.note(&line);
        }
    }
    check_acked(&daemon, &heard.acked, heard.acked.len());
    check_uncommitted(&daemon, &heard.uncommitted);
    eprintln!(
        "{} blocks acknowledged over {ROUNDS} kills, none lost; {from_dram} adopted from arenas; {} uncommitted fills, none served; {} stores answered NoSpace",
        heard.acked.len(),
        heard.uncommitted.len(),
        heard.no_space,
    );
    let (status, log) = daemon.terminate();
    assert!(status.success(), "exit {status}; log:\n{}", log.join("\n"));
}

/// Each of `keys` (acknowledged blocks) reads back exact, through a fresh
/// client; G2 and G3 together hold at least the `total` blocks
/// acknowledged, and the daemon counts the adoption its ready line
/// announced.
fn check_acked(daemon: &Daemon, keys: &[u128], total: usize) {
    let mut client = daemon.client();
    let lost: Vec<u128> = keys
        .iter()
        .copied()
        .filter(|&key| !check_held_block(&mut client, key))
        .collect();
    assert!(
        lost.is_empty(),
        "acknowledged blocks lost: {lost:?}; the daemon's log:\n{}",
        daemon.log().join("\n")
    );
    let stats = Stats::of(&mut client);
    assert_eq!(stats.get("adopted_g2"), daemon.adopted("g2"));
    assert_eq!(stats.get("adopted_g3"), daemon.adopted("g3"));
    let held = stats.get("blocks_g2") + stats.get("blocks_g3");
    assert!(
        held >= total as u64,
        "{held} blocks in G2 and G3, {total} acknowledged"
    );
}

/// None of `keys` (blocks reserved and filled, never committed) is known
/// to the daemon or readable.
fn check_uncommitted(daemon: &Daemon, keys: &[u128]) {
    let mut client = daemon.client();
    for &key in keys {
        let found = client.lookup(&[BlockHash(key)]).expect("lookup");
        assert!(
            found.is_empty(),
            "uncommitted block {key} is stored: {found:?}"
        );
        assert_eq!(
            read_block(&mut client, key),
            None,
            "uncommitted block {key} is served"
        );
    }
}

/// A traffic client: stores batches of 1 to 3 new blocks of its own key
/// range ([`BATCHES_PER_LIFE`] per connection, then loads only), each
/// batch followed by one block reserved and filled with its right bytes
/// but never committed (the previous one aborted), and loads blocks it
/// stored (which must read back exact) and blocks of another client (exact
/// or a miss). Reports `connected` on each connection, `acked <key>` for
/// each block stored, `nospace <key>` for each store refused for room,
/// `uncommitted <key>` for each block reserved (before filling it), and
/// `lost <error>` when the daemon goes away, which must be `Disconnected`
/// or `Io`. Stops when the stop file appears.
fn traffic() {
    let stop: PathBuf = param("stop");
    let mut rng = StdRng::seed_from_u64(param("seed"));
    let mut state = Traffic {
        next: param("first"),
        others: param("others"),
        mine: Vec::new(),
        batches: 0,
        uncommitted: param::<u128>("first") + UNCOMMITTED,
        held: None,
    };
    while !stop.exists() {
        let Some(mut client) = connect() else {
            std::thread::sleep(RECONNECT_PAUSE);
            continue;
        };
        report("connected");
        state.batches = 0;
        // The last life's reservation died with it.
        state.held = None;
        let lost = loop {
            if stop.exists() {
                return;
            }
            if let Err(e) = state.step(&mut client, &mut rng) {
                break e;
            }
        };
        match lost {
            ClientError::Disconnected => report("lost disconnected"),
            ClientError::Io(e) => report(format!("lost io {e}")),
            other => panic!("unclear error when the daemon went away: {other:?}"),
        }
    }
}

/// A connection, or `None` while no daemon answers (the socket is stale,
/// or the daemon died during the handshake).
fn connect() -> Option<Client> {
    match Client::connect(worker_config()) {
        Ok(c) => Some(c),
        Err(ClientError::Connect { .. } | ClientError::Disconnected | ClientError::Io(_)) => None,
        Err(e) => panic!("connect: {e:?}"),
    }
}

/// What a traffic client has done.
struct Traffic {
    /// Its next new key.
    next: u128,
    /// The first key of another client's range.
    others: u128,
    /// The blocks it stored.
    mine: Vec<u128>,
    /// Batches stored on this connection.
    batches: usize,
    /// Its next key to reserve and never commit.
    uncommitted: u128,
    /// The reservation it holds filled and uncommitted, if any.
    held: Option<u128>,
}

impl Traffic {
    /// One store (within the budget) and two loads.
    fn step(&mut self, client: &mut Client, rng: &mut StdRng) -> Result<(), ClientError> {
        if self.batches < BATCHES_PER_LIFE {
            self.store(client, rng.random_range(1..=3))?;
            self.fill_uncommitted(client)?;
            self.batches += 1;
        }
        if !self.mine.is_empty() {
            let key = self.mine[rng.random_range(0..self.mine.len())];
            let got = try_read_held_block(client, key)?;
            if got.is_none() {
                let held = client.lookup(&[BlockHash(key)])?;
                let stats = client.stats()?;
                panic!("block {key} it stored is not readable; lookup {held:?}; {stats:?}");
            }
            assert!(got == Some(block(key)), "block {key} read back wrong bytes");
        }
        let other = self.others + rng.random_range(0..64);
        if let Some(bytes) = try_read_block(client, other)? {
            assert!(bytes == block(other), "block {other} read back wrong bytes");
        }
        Ok(())
    }

    /// Aborts the reservation it holds and reserves a new block, fills it
    /// with its right bytes and holds it uncommitted: what a daemon killed
    /// now must not make readable.
    fn fill_uncommitted(&mut self, client: &mut Client) -> Result<(), ClientError> {
        if let Some(key) = self.held.take() {
            client.abort(&[BlockHash(key)])?;
        }
        let key = self.uncommitted;
        self.uncommitted += 1;
        let granted = client.reserve(&[BlockHash(key)])?;
        let [ReserveResult::Slot(s)] = granted[..] else {
            // No room now: nothing to hold this time.
            return Ok(());
        };
        report(format!("uncommitted {key}"));
        self.held = Some(key);
        let arena = client.arena();
        let slot = arena
            .slot_at(s.offset, s.len)
            .expect("the daemon names a slot");
        let stored = client.key_map().stored(BlockHash(key));
        // SAFETY: this client holds the reservation of `slot`, granted just
        // now and neither committed nor aborted, and nothing else in this
        // process touches the slot.
        unsafe { arena.fill(slot, stored, &block(key)) }.expect("fill the reserved slot");
        Ok(())
    }

    fn store(&mut self, client: &mut Client, n: u128) -> Result<(), ClientError> {
        let keys: Vec<u128> = (self.next..self.next + n).collect();
        self.next += n;
        let blocks: Vec<Vec<u8>> = keys.iter().map(|k| block(*k)).collect();
        let pairs: Vec<(BlockHash, &[u8])> = keys
            .iter()
            .zip(&blocks)
            .map(|(k, b)| (BlockHash(*k), b.as_slice()))
            .collect();
        for (key, outcome) in keys.iter().zip(client.store(&pairs)?) {
            match outcome {
                StoreOutcome::Stored => {
                    report(format!("acked {key}"));
                    self.mine.push(*key);
                }
                // Every G2 slot is held or being moved down and the room
                // made for this store went to other requests first (the
                // parent's checks load many blocks right after a restart,
                // into a G2 the adoption filled): not stored, and not
                // acknowledged, which a store may answer.
                StoreOutcome::NoSpace => report(format!("nospace {key}")),
                other => panic!("new block {key}: {other:?}"),
            }
        }
        Ok(())
    }
}
