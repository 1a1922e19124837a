//! `kvtier serve` SIGKILLed under traffic, again and again: client
//! processes storing and loading see a clear error (`Disconnected` or
//! `Io`) and connect again once the daemon is back; the restarted daemon
//! (same data directory, same configuration) adopts every block a client
//! was told is stored, and every read, before or after, gives the exact
//! bytes or a miss, never others.
//!
//! The daemon runs in inclusive mode, so a commit is answered only once
//! the block is written through to the disk log: "stored" means "reached
//! G3". Its arena is small, so G2 also evicts and loads come back from
//! disk.
//!
//! The client processes are this test binary started again
//! ([`Worker::spawn`]); [`client_process`] is their body.

use std::path::PathBuf;
use std::time::Duration;

use kvtier_client::{BlockHash, Client, ClientError, StoreOutcome};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use support::node::{
    Daemon, Stats, Worker, block, check_held_block, param, report, role, seed, shm_name,
    try_read_block, try_read_held_block, worker_config,
};

mod support;

/// Daemon kills.
const ROUNDS: usize = 16;
/// Client processes.
const CLIENTS: u128 = 2;
/// Batches a client stores per connection; then it only loads, so the
/// blocks stored over the whole test stay well within the disk log.
const BATCHES_PER_LIFE: usize = 6;
/// Blocks acknowledged in earlier rounds checked again after each restart.
const OLD_SAMPLE: usize = 32;
/// Keys of client `i` are `i * KEY_SPACE + n`.
const KEY_SPACE: u128 = 1_000_000;
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
        ("KVTIER_MANAGER__MODE", "inclusive"),
        ("KVTIER_MEMORY__CAPACITY", "1MiB"),
        ("KVTIER_DISK__CAPACITY_PER_DIR", "32MiB"),
    ];
    Daemon::start(data, &shm_name("crash"), &env)
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
    // Every acknowledged block, in the order the acknowledgements were read.
    let mut acked: Vec<u128> = Vec::new();
    // How many of them were checked since their acknowledgement.
    let mut checked = 0;
    let mut check = daemon.client();
    assert!(
        Stats::of(&mut check).get("capacity_g3")
            > (CLIENTS as usize * ROUNDS * (BATCHES_PER_LIFE + 1) * 3) as u64,
        "the disk log must hold every block the test stores, or misses would be legitimate"
    );
    drop(check);

    for round in 0..ROUNDS {
        // Wait until every client is connected to this life, then for a
        // random number of new acknowledgements: the kill lands among
        // stores as often as among loads.
        for c in &mut clients {
            c.wait_for(|l| note_ack(&mut acked, l), |l| l == "connected");
        }
        let want = rng.random_range(1..=BATCHES_PER_LIFE);
        let before = acked.len();
        for i in (0..clients.len()).cycle() {
            if acked.len() >= before + want {
                break;
            }
            clients[i].wait_for(|l| note_ack(&mut acked, l), |l| l.starts_with("acked "));
        }
        daemon.kill();
        for c in &mut clients {
            let lost = c.wait_for(|l| note_ack(&mut acked, l), |l| l.starts_with("lost "));
            eprintln!("round {round}: client {} {lost}", c.pid());
        }
        daemon.restart();
        let adopted = daemon.adopted_g3();
        eprintln!(
            "round {round}: {} blocks acknowledged, {adopted} adopted",
            acked.len()
        );
        assert!(
            adopted >= acked.len() as u64,
            "{adopted} blocks adopted from the disk log, {} acknowledged; {}",
            acked.len(),
            daemon.ready_line()
        );
        // The blocks acknowledged since the last check, and a sample of
        // the older ones (every one is checked again at the end).
        let mut keys = acked[checked..].to_vec();
        keys.extend((0..OLD_SAMPLE.min(checked)).map(|_| acked[rng.random_range(0..checked)]));
        check_acked(&daemon, &keys, acked.len());
        checked = acked.len();
    }

    std::fs::write(&stop, b"").expect("create the stop file");
    for c in clients {
        for line in c.finish() {
            note_ack(&mut acked, &line);
        }
    }
    check_acked(&daemon, &acked, acked.len());
    let (status, log) = daemon.terminate();
    assert!(status.success(), "exit {status}; log:\n{}", log.join("\n"));
}

/// Records an `acked <key>` report.
fn note_ack(acked: &mut Vec<u128>, line: &str) {
    if let Some(key) = line.strip_prefix("acked ") {
        acked.push(key.parse().expect("a key"));
    }
}

/// Each of `keys` (acknowledged blocks) reads back exact, through a fresh
/// client; the disk log holds at least the `total` blocks acknowledged,
/// and the daemon counts the adoption its ready line announced.
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
    assert_eq!(stats.get("adopted_g3"), daemon.adopted_g3());
    let g3 = stats.get("blocks_g3");
    assert!(
        g3 >= total as u64,
        "{g3} blocks in G3, {total} acknowledged"
    );
}

/// A traffic client: stores batches of 1 to 3 new blocks of its own key
/// range ([`BATCHES_PER_LIFE`] per connection, then loads only), and
/// loads blocks it stored (which must read back exact) and blocks of
/// another client (exact or a miss). Reports `connected` on each
/// connection, `acked <key>` for each block stored, and `lost <error>`
/// when the daemon goes away, which must be `Disconnected` or `Io`. Stops
/// when the stop file appears.
fn traffic() {
    let stop: PathBuf = param("stop");
    let mut rng = StdRng::seed_from_u64(param("seed"));
    let mut state = Traffic {
        next: param("first"),
        others: param("others"),
        mine: Vec::new(),
        batches: 0,
    };
    while !stop.exists() {
        let Some(mut client) = connect() else {
            std::thread::sleep(RECONNECT_PAUSE);
            continue;
        };
        report("connected");
        state.batches = 0;
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
}

impl Traffic {
    /// One store (within the budget) and two loads.
    fn step(&mut self, client: &mut Client, rng: &mut StdRng) -> Result<(), ClientError> {
        if self.batches < BATCHES_PER_LIFE {
            self.store(client, rng.random_range(1..=3))?;
            self.batches += 1;
        }
        if !self.mine.is_empty() {
            let key = self.mine[rng.random_range(0..self.mine.len())];
            let got = try_read_held_block(client, key)?;
            assert!(got.is_some(), "block {key} it stored is not readable");
            assert!(got == Some(block(key)), "block {key} read back wrong bytes");
        }
        let other = self.others + rng.random_range(0..64);
        if let Some(bytes) = try_read_block(client, other)? {
            assert!(bytes == block(other), "block {other} read back wrong bytes");
        }
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
            assert_eq!(outcome, StoreOutcome::Stored, "new block {key}");
            report(format!("acked {key}"));
            self.mine.push(*key);
        }
        Ok(())
    }
}
