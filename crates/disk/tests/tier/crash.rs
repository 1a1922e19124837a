//! Crash test: a child process (this test binary, re-executed with
//! `KVTIER_CRASH_CHILD` set) writes blocks whose bytes are a function of
//! their key and prints every acknowledged key; the parent kills it with
//! SIGKILL at a random moment after a random amount of progress, reopens the
//! tier and checks that every acknowledged block reads back exactly and that
//! no block ever reads back wrong. Repeated on the same directory, so each
//! child also recovers what the previous ones left. Runs alternate between
//! block- and layer-major region lives.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use kvtier_core::BlockHash;
use kvtier_disk::{DiskTier, DiskTierConfig};
use rand::{Rng, SeedableRng};

use crate::common::*;

const CHILD_ENV: &str = "KVTIER_CRASH_CHILD";
const ITER_ENV: &str = "KVTIER_CRASH_ITER";
const MODE_ENV: &str = "KVTIER_CRASH_MODE";
const CAPACITY: u64 = 384 * REGION;
/// Small enough that the child reclaims regions all the time.
const RECLAIM_CAPACITY: u64 = 6 * REGION;

/// `plain`: no reclaim, every acknowledged block must survive.
/// `reclaim`: a tiny tier that reclaims (LRU or FIFO, re-inserting hot
/// blocks) while the child also reads; only "never wrong bytes" holds.
fn crash_config(dir: std::path::PathBuf, iter: u64, reclaim: bool) -> DiskTierConfig {
    let mut c = config(vec![dir], if reclaim { RECLAIM_CAPACITY } else { CAPACITY });
    c.sync = iter.is_multiple_of(3);
    // Layouts alternate every two runs (engines every run, so each layout
    // meets both): regions are reopened, and lives scanned, in the other
    // layout than the one they were written in (crash case 11). The first
    // runs write a v1 directory, which the first `layer` run makes v2.
    c.layout = if (iter / 2).is_multiple_of(2) {
        kvtier_disk::RegionLayout::Block
    } else {
        kvtier_disk::RegionLayout::Layer
    };
    if reclaim {
        c.reinsert_hot = true;
        if iter.is_multiple_of(2) {
            c.eviction = kvtier_core::RegionEvictionKind::Lru;
        }
    }
    c
}

fn kind_of(iter: u64) -> Kind {
    if iter.is_multiple_of(2) {
        Kind::Psync
    } else {
        Kind::Uring
    }
}

/// The child role: runs only when the parent set `KVTIER_CRASH_CHILD`.
#[test]
fn crash_child() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let iter: u64 = std::env::var(ITER_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let reclaim = std::env::var(MODE_ENV).is_ok_and(|m| m == "reclaim");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let tier = DiskTier::open(
            crash_config(dir.into(), iter, reclaim),
            kind_of(iter).engine(),
        )
        .expect("child open");
        println!("READY");
        // Two writers with their own key streams, so extents of one region
        // are in flight together; one of them checkpoints now and then.
        let mut tasks = Vec::new();
        for stream in 0..2u64 {
            let tier = tier.clone();
            tasks.push(tokio::spawn(async move {
                let seed = iter * 2 + stream;
                let g = geometry();
                let mut i = 0u64;
                let mut batches = 0u64;
                loop {
                    let n = 1 + (i + stream) % 9;
                    let blocks = Blocks::range(&g, seed, i..i + n);
                    let res = tier.put_batch(&blocks.puts()).await;
                    for (r, j) in res.iter().zip(i..i + n) {
                        if r.is_ok() {
                            println!("ACK {seed} {j}");
                        }
                    }
                    if reclaim && stream == 1 && i > 0 {
                        // Read a few recent blocks: they become hot and are
                        // re-inserted when their region is reclaimed.
                        let step = (i / 6).max(1) as usize;
                        let mut back: Vec<BlockHash> =
                            (0..i).step_by(step).map(|j| key(seed, j)).collect();
                        // And some of the previous child's blocks, which sit
                        // in the oldest regions: the next victims.
                        if iter > 0 {
                            let prev = (iter - 1) * 2;
                            back.extend((0..60).step_by(6).map(|j| key(prev, j)));
                        }
                        check_never_wrong(&tier, &back).await;
                    }
                    i += n;
                    batches += 1;
                    if stream == 0 && batches.is_multiple_of(8) {
                        tier.checkpoint().await.expect("checkpoint");
                        let st = tier.stats();
                        println!("STAT {} {}", st.regions_reclaimed, st.reinserted);
                    }
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
    });
}

#[test]
fn sigkill_at_random_moments_never_serves_wrong_bytes() {
    crash_loop(false, 24);
}

#[test]
fn sigkill_while_reclaiming_never_serves_wrong_bytes() {
    crash_loop(true, 12);
}

fn crash_loop(reclaim: bool, iterations: u64) {
    let root = tempfile::Builder::new()
        .prefix("kvtier-crash")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let dir = root.path().join("d0");
    let exe = std::env::current_exe().expect("current exe");
    let seed: u64 = std::env::var("KVTIER_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    eprintln!("crash test seed {seed} (set KVTIER_CRASH_SEED to replay the kill points)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut acked_before: Vec<BlockHash> = Vec::new();
    let mut written_before: Vec<BlockHash> = Vec::new();
    let (mut reclaimed, mut reinserted) = (0u64, 0u64);
    for iter in 0..iterations {
        let stderr_path = root.path().join(format!("child{iter}.stderr"));
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "crash::crash_child",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(CHILD_ENV, &dir)
            .env(ITER_ENV, iter.to_string())
            .env(MODE_ENV, if reclaim { "reclaim" } else { "plain" })
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr_path).expect("stderr file"))
            .spawn()
            .expect("spawn child");
        let stdout = child.stdout.take().expect("child stdout");
        let mut lines = BufReader::new(stdout).lines();
        let mut acked: Vec<(u64, u64)> = Vec::new();
        let ready = lines
            .by_ref()
            .map_while(|l| l.ok())
            .any(|l| l.ends_with("READY"));
        assert!(
            ready,
            "child {iter} never got ready: {}",
            std::fs::read_to_string(&stderr_path).unwrap_or_default()
        );
        // Reclaim mode runs longer so children wrap around their tiny tier
        // (and re-insert hot blocks) before they die.
        let want = rng.random_range(1..if reclaim { 800usize } else { 150 });
        for line in lines.by_ref().map_while(|l| l.ok()) {
            if let Some((r, h)) = parse_stat(&line) {
                reclaimed += r;
                reinserted += h;
            }
            if let Some(a) = parse_ack(&line) {
                acked.push(a);
                if acked.len() >= want {
                    break;
                }
            }
        }
        std::thread::sleep(Duration::from_micros(rng.random_range(0..4000)));
        child.kill().expect("SIGKILL");
        let status = child.wait().expect("wait");
        // Acknowledgements printed before the kill are still in the pipe.
        acked.extend(lines.map_while(|l| l.ok()).filter_map(|l| parse_ack(&l)));
        assert!(
            acked.len() >= want,
            "child {iter} exited ({status}) before making progress: {}",
            std::fs::read_to_string(&stderr_path).unwrap_or_default()
        );
        rt.block_on(async {
            let tier = DiskTier::open(
                crash_config(dir.clone(), iter, reclaim),
                kind_of(iter).engine(),
            )
            .expect("reopen after kill");
            let keys: Vec<BlockHash> = acked.iter().map(|&(s, i)| key(s, i)).collect();
            if reclaim {
                // Blocks come and go with reclaim: whatever is indexed, from
                // this run or any earlier one, must read back exactly.
                assert!(tier.len() <= tier.capacity_blocks());
                check_never_wrong(&tier, &keys).await;
                check_never_wrong(&tier, &written_before).await;
            } else {
                // Every acknowledged block of this run reads back exactly.
                check_all_hit(&tier, &keys).await;
            }
            // Every block this run may have written is exact or a miss.
            for stream in 0..2u64 {
                let s = iter * 2 + stream;
                let top = acked
                    .iter()
                    .filter(|a| a.0 == s)
                    .map(|a| a.1)
                    .max()
                    .unwrap_or(0);
                let maybe: Vec<BlockHash> = (0..top + 20).map(|i| key(s, i)).collect();
                check_never_wrong(&tier, &maybe).await;
                written_before.extend(maybe);
            }
            if reclaim {
                tier.close().await.expect("close");
                return;
            }
            // Earlier runs' acknowledged blocks are all still indexed (no
            // reclaim at this capacity), and a sample reads back exactly.
            assert!(
                tier.stats().region_bytes_used + 16 * REGION <= CAPACITY,
                "crash test outgrew its capacity; raise CAPACITY"
            );
            for k in &acked_before {
                assert!(tier.contains(*k), "acknowledged block {k} lost");
            }
            let sample: Vec<BlockHash> = (0..64.min(acked_before.len()))
                .map(|_| acked_before[rng.random_range(0..acked_before.len())])
                .collect();
            check_all_hit(&tier, &sample).await;
            if iter.is_multiple_of(2) {
                tier.close().await.expect("close");
            }
        });
        acked_before.extend(acked.iter().map(|&(s, i)| key(s, i)));
    }
    eprintln!(
        "{} acknowledged blocks checked over {iterations} kills (reclaim: {reclaim}; children reported {reclaimed} regions reclaimed, {reinserted} blocks re-inserted)",
        acked_before.len()
    );
    if reclaim {
        assert!(reclaimed > 0, "the reclaim crash test never reclaimed");
    }
}

fn parse_ack(line: &str) -> Option<(u64, u64)> {
    let at = line.find("ACK ")?;
    let mut it = line[at + 4..].split(' ');
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

fn parse_stat(line: &str) -> Option<(u64, u64)> {
    let at = line.find("STAT ")?;
    let mut it = line[at + 5..].split(' ');
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}
