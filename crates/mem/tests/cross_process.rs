//! A second process maps the arena by name and reads blocks.
//!
//! The parent tests re-run this test binary as a child (`--exact
//! child_reader`, selected by the `KVTIER_MEM_CHILD` variable); the child
//! opens an [`ArenaReader`], reads the keys it is given and prints one line
//! per key with the outcome and a digest of the bytes; the parent checks
//! them. Without the variable, `child_reader` does nothing.

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use kvtier_arena::ArenaReader;
use kvtier_core::{BlockHash, BlockSums, Lookup};
use kvtier_mem::{MemoryTier, MemoryTierConfig, PutOutcome};

const BLOCK: usize = 64 * 1024;
const LAYER: usize = 16 * 1024;
const CHILD_ENV: &str = "KVTIER_MEM_CHILD";
const KEYS_ENV: &str = "KVTIER_MEM_CHILD_KEYS";

fn block(k: u128) -> Vec<u8> {
    let seed = (k as u64).wrapping_mul(0x2545_f491_4f6c_dd1d) | 1;
    (0..BLOCK as u64)
        .map(|i| (seed.wrapping_mul(i + 7) >> 31) as u8)
        .collect()
}

fn digest(bytes: &[u8]) -> String {
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(bytes))
}

fn tier(tag: &str) -> MemoryTier {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    MemoryTier::create(MemoryTierConfig {
        shm_name: format!(
            "kvtier-mem-xproc-{}-{}-{tag}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ),
        capacity_bytes: 8 * BLOCK as u64,
        block_bytes: BLOCK,
        layer_bytes: LAYER,
        hugepages: false,
        table_key: None,
        access_group: None,
    })
    .unwrap()
}

fn put(t: &MemoryTier, k: u128) {
    let data = block(k);
    let sums = BlockSums::compute(BlockHash(k), LAYER, &data);
    assert_eq!(
        t.put(BlockHash(k), &data, &sums).unwrap(),
        PutOutcome::Stored
    );
}

/// Runs the child on `t`'s arena for `keys`; returns its report lines
/// (`<key> <Hit|Miss|Corrupt> <digest or ->`), after the `keys` line.
fn run_child(t: &MemoryTier, keys: &[u128]) -> (Vec<String>, Vec<u128>) {
    let name = t.shm_name();
    let list: Vec<String> = keys.iter().map(u128::to_string).collect();
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_reader", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, name)
        .env(KEYS_ENV, list.join(","))
        .output()
        .expect("spawn the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Shown if an assertion below fails. The harness may print its
    // "test child_reader ... " prefix on the first report line.
    eprintln!("child stdout:\n{stdout}");
    let mut lines = Vec::new();
    let mut visible = Vec::new();
    for line in stdout.lines() {
        if let Some((_, rest)) = line.split_once("CHILD-KEYS ") {
            visible = rest
                .split(',')
                .filter(|s| !s.is_empty())
                .map(|s| s.parse().unwrap())
                .collect();
            visible.sort_unstable();
        } else if let Some((_, rest)) = line.split_once("CHILD ") {
            lines.push(rest.to_owned());
        }
    }
    (lines, visible)
}

fn expect_line(k: u128, lookup: Lookup) -> String {
    match lookup {
        Lookup::Hit => format!("{k} Hit {}", digest(&block(k))),
        other => format!("{k} {other:?} -"),
    }
}

/// The child role: a no-op unless started by a parent test.
#[test]
fn child_reader() {
    let Ok(name) = std::env::var(CHILD_ENV) else {
        return;
    };
    let reader = ArenaReader::open(&name).expect("open the arena by name");
    assert_ne!(reader.owner_pid(), std::process::id());
    let keys: Vec<String> = reader.keys().iter().map(|k| k.0.to_string()).collect();
    println!("CHILD-KEYS {}", keys.join(","));
    let wanted = std::env::var(KEYS_ENV).unwrap_or_default();
    let mut dst = vec![0u8; reader.block_bytes()];
    for k in wanted.split(',').filter(|s| !s.is_empty()) {
        let k: u128 = k.parse().unwrap();
        match reader.get(BlockHash(k), &mut dst) {
            Lookup::Hit => println!("CHILD {k} Hit {}", digest(&dst)),
            other => println!("CHILD {k} {other:?} -"),
        }
    }
}

#[test]
fn another_process_reads_blocks_by_name() {
    let t = tier("read");
    for k in 1..=4 {
        put(&t, k);
    }
    assert!(t.remove(BlockHash(4)));
    let (lines, visible) = run_child(&t, &[1, 2, 3, 4, 99]);
    assert_eq!(visible, vec![1, 2, 3]);
    let want: Vec<String> = [
        (1, Lookup::Hit),
        (2, Lookup::Hit),
        (3, Lookup::Hit),
        (4, Lookup::Miss),
        (99, Lookup::Miss),
    ]
    .into_iter()
    .map(|(k, l)| expect_line(k, l))
    .collect();
    assert_eq!(lines, want);
}

#[test]
fn a_corrupted_byte_is_never_served_to_another_process() {
    let t = tier("corrupt");
    for k in 1..=3 {
        put(&t, k);
    }
    let slot = t.get_ref(BlockHash(2)).unwrap().slot();
    let (arena, _) = t.arena();
    // SAFETY: one byte of a resident slot of our own arena, no copy in flight.
    unsafe { *arena.add(slot * t.slot_bytes() + BLOCK - 1) ^= 1 };
    let (lines, _) = run_child(&t, &[1, 2, 3]);
    assert_eq!(
        lines,
        vec![
            expect_line(1, Lookup::Hit),
            expect_line(2, Lookup::Corrupt),
            expect_line(3, Lookup::Hit)
        ]
    );
    // The owner finds it too, counts it and drops it; then it is a miss
    // everywhere.
    let mut dst = vec![0u8; BLOCK];
    assert_eq!(t.get(BlockHash(2), &mut dst), Lookup::Corrupt);
    assert_eq!(t.stats().corrupt, 1);
    let (lines, visible) = run_child(&t, &[2]);
    assert_eq!(lines, vec![expect_line(2, Lookup::Miss)]);
    assert_eq!(visible, vec![1, 3]);
}
