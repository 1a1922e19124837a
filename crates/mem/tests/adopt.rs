//! An owner killed with SIGKILL leaves its arena in /dev/shm; the next
//! owner with the same table key and layout adopts it (docs/memory-arena.md,
//! "Adoption after a crash"): every block the dead owner published, whose
//! entry authenticates and whose bytes verify, stays readable; a
//! reservation never committed, an entry someone rewrote, bytes that no
//! longer match, an arena of another key are dropped; an arena of another
//! layout, or without a key, is replaced as before.
//!
//! The crashed owner is this test binary started again (`--exact
//! child_owner`, selected by `KVTIER_MEM_ADOPT_CHILD`): it creates a tier,
//! publishes blocks 1..=5, leaves block 100 reserved and filled and block
//! 101 reserved and half filled, says so, and waits to be killed. Without
//! the variable, `child_owner` does nothing.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use kvtier_arena::{ArenaReader, MemError};
use kvtier_core::{BlockHash, BlockSums, Lookup};
use kvtier_mem::{ArenaAdoption, MemoryTier, MemoryTierConfig, PutOutcome, Reserve, TableKey};

const BLOCK: usize = 64 * 1024;
const LAYER: usize = 16 * 1024;
const SLOTS: u64 = 8;
const CHILD_ENV: &str = "KVTIER_MEM_ADOPT_CHILD";
const KEY_ENV: &str = "KVTIER_MEM_ADOPT_KEY";
/// What the dead owner published.
const PUBLISHED: [u128; 5] = [1, 2, 3, 4, 5];
/// What it reserved and never committed (100 filled, 101 half filled).
const RESERVED: [u128; 2] = [100, 101];

fn block(k: u128) -> Vec<u8> {
    let seed = (k as u64).wrapping_mul(0x2545_f491_4f6c_dd1d) | 1;
    (0..BLOCK as u64)
        .map(|i| (seed.wrapping_mul(i + 7) >> 31) as u8)
        .collect()
}

fn sums(k: u128) -> BlockSums {
    BlockSums::compute(BlockHash(k), LAYER, &block(k))
}

fn key(byte: u8) -> TableKey {
    TableKey::from_bytes([byte; 32])
}

fn config(name: &str, slots: u64, table_key: Option<TableKey>) -> MemoryTierConfig {
    MemoryTierConfig {
        shm_name: name.to_owned(),
        capacity_bytes: slots * BLOCK as u64,
        block_bytes: BLOCK,
        layer_bytes: LAYER,
        hugepages: false,
        table_key,
        access_group: None,
    }
}

fn path(name: &str) -> PathBuf {
    PathBuf::from("/dev/shm").join(name)
}

fn inode(name: &str) -> u64 {
    std::fs::metadata(path(name)).expect("the arena file").ino()
}

/// The child role: a no-op unless started by [`crashed_arena`].
#[test]
fn child_owner() {
    let Ok(name) = std::env::var(CHILD_ENV) else {
        return;
    };
    let byte: u8 = std::env::var(KEY_ENV).unwrap().parse().unwrap();
    let tier = MemoryTier::create(config(&name, SLOTS, Some(key(byte)))).unwrap();
    for k in PUBLISHED {
        assert_eq!(
            tier.put(BlockHash(k), &block(k), &sums(k)).unwrap(),
            PutOutcome::Stored
        );
    }
    let mut held = Vec::new();
    for (k, filled) in RESERVED.into_iter().zip([BLOCK, BLOCK / 2]) {
        let Reserve::Reserved(mut r) = tier.reserve(BlockHash(k)).unwrap() else {
            panic!("no slot for {k}");
        };
        r.as_mut_slice()[..filled].copy_from_slice(&block(k)[..filled]);
        held.push(r);
    }
    println!("CHILD-READY");
    // Killed here, holding everything.
    loop {
        std::thread::park();
    }
}

/// A unique arena name for this process and `tag`.
fn name(tag: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "kvtier-mem-adopt-{}-{}-{tag}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Runs the child owner on arena `name` under table key `byte` and
/// SIGKILLs it once it has published and reserved: the arena is left as a
/// crashed owner leaves it.
fn crashed_arena(name: &str, byte: u8) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_owner", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, name)
        .env(KEY_ENV, byte.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the child owner");
    let stdout = child.stdout.take().unwrap();
    let ready = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|l| l.contains("CHILD-READY"));
    child.kill().expect("SIGKILL the child owner");
    let status = child.wait().expect("reap the child owner");
    assert!(ready, "the child owner died before it was ready: {status}");
    assert!(path(name).exists(), "a killed owner's arena is gone");
}

fn get(t: &MemoryTier, k: u128) -> Lookup {
    let mut out = vec![0u8; BLOCK];
    let got = t.get(BlockHash(k), &mut out);
    if got == Lookup::Hit {
        assert!(out == block(k), "block {k} read back other bytes");
    }
    got
}

/// A writable mapping of a whole arena file: what a hostile client has
/// once it maps the file itself (it may; the file is group-writable).
struct Scribbler {
    ptr: NonNull<u8>,
    len: usize,
    _file: File,
}

impl Scribbler {
    fn open(name: &str) -> Self {
        let file = File::options()
            .read(true)
            .write(true)
            .open(path(name))
            .unwrap();
        let len = file.metadata().unwrap().len() as usize;
        // SAFETY: a fresh shared mapping chosen by the kernel aliases no Rust
        // object; only this struct touches it, while no owner is alive.
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                &file,
                0,
            )
        }
        .unwrap();
        Self {
            ptr: NonNull::new(p.cast()).unwrap(),
            len,
            _file: file,
        }
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is ours, `len` bytes long, and no other
        // reference to it exists while the borrow of `self` lasts (the owner
        // is dead and the next one not started).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    fn word(&mut self, at: usize) -> u64 {
        u64::from_le_bytes(self.bytes()[at..at + 8].try_into().unwrap())
    }

    fn set_word(&mut self, at: usize, v: u64) {
        self.bytes()[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }

    /// Byte offset of slot `slot`'s table entry: the table starts at 4096,
    /// entries are round_up(64 + 8 * layers, 64) = 128 bytes (4 layers).
    fn entry(slot: usize) -> usize {
        4096 + slot * 128
    }

    /// The slot whose entry publishes key `k`.
    fn slot_of(&mut self, k: u128) -> usize {
        (0..SLOTS as usize)
            .find(|&s| {
                let e = Self::entry(s);
                self.word(e + 32) != 0
                    && self.word(e + 8) == k as u64
                    && self.word(e + 16) == (k >> 64) as u64
            })
            .unwrap_or_else(|| panic!("no entry publishes {k}"))
    }

    /// Byte offset of slot `slot`'s data (the header's data offset at 72).
    fn data(&mut self, slot: usize) -> usize {
        self.word(72) as usize + slot * BLOCK
    }
}

impl Drop for Scribbler {
    fn drop(&mut self) {
        // SAFETY: we mapped exactly this range; nothing refers to it now.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[test]
fn a_crashed_owners_blocks_are_adopted_and_its_reservations_dropped() {
    let name = name("kept");
    crashed_arena(&name, 1);
    let before = inode(&name);
    let t = MemoryTier::create(config(&name, SLOTS, Some(key(1)))).unwrap();
    assert_eq!(inode(&name), before, "the arena was replaced, not adopted");
    assert_eq!(
        t.adoption(),
        Some(ArenaAdoption {
            kept: 5,
            unfinished: 2,
            ..ArenaAdoption::default()
        })
    );
    for k in PUBLISHED {
        assert_eq!(get(&t, k), Lookup::Hit, "block {k}");
    }
    for k in RESERVED {
        assert_eq!(get(&t, k), Lookup::Miss, "uncommitted block {k} is served");
    }
    assert_eq!((t.len(), t.free_blocks()), (5, 3));
    // Another process sees exactly the adopted blocks.
    let mut visible = ArenaReader::open(&name).unwrap().keys();
    visible.sort_unstable();
    assert_eq!(visible, PUBLISHED.map(BlockHash).to_vec());
    // Adopted blocks are ordinary: the tier fills up, and its owner
    // removes them to make room.
    for k in [6, 7, 8] {
        assert_eq!(
            t.put(BlockHash(k), &block(k), &sums(k)).unwrap(),
            PutOutcome::Stored
        );
    }
    assert_eq!(
        t.put(BlockHash(9), &block(9), &sums(9)).unwrap(),
        PutOutcome::Full
    );
    assert!(t.remove(BlockHash(1)));
    assert_eq!(
        t.put(BlockHash(9), &block(9), &sums(9)).unwrap(),
        PutOutcome::Stored
    );
    drop(t);
    assert!(
        !path(&name).exists(),
        "a clean drop leaves the arena behind"
    );
}

#[test]
fn entries_a_client_rewrote_are_dropped() {
    let name = name("forged");
    crashed_arena(&name, 2);
    let mut s = Scribbler::open(&name);
    // Block 2's entry made to claim block 9: key, sums and bytes all
    // consistent, as a client can make them; only the MAC is not.
    let slot = s.slot_of(2);
    let (e, d) = (Scribbler::entry(slot), s.data(slot));
    let forged = sums(9);
    s.set_word(e + 8, 9);
    s.set_word(e + 24, forged.block);
    for (l, sum) in forged.layers.iter().enumerate() {
        s.set_word(e + 64 + 8 * l, *sum);
    }
    s.bytes()[d..d + BLOCK].copy_from_slice(&block(9));
    // Block 3's entry given block 4's MAC words.
    let (three, four) = (
        Scribbler::entry(s.slot_of(3)),
        Scribbler::entry(s.slot_of(4)),
    );
    for w in [48, 56] {
        let mac = s.word(four + w);
        s.set_word(three + w, mac);
    }
    // Block 5's bytes changed under an intact entry.
    let five = s.slot_of(5);
    let d5 = s.data(five);
    s.bytes()[d5 + BLOCK - 1] ^= 0x40;
    drop(s);

    let t = MemoryTier::create(config(&name, SLOTS, Some(key(2)))).unwrap();
    assert_eq!(
        t.adoption(),
        Some(ArenaAdoption {
            kept: 2,
            unfinished: 2,
            unauthentic: 2,
            corrupt: 1,
            duplicates: 0,
        })
    );
    for k in [1, 4] {
        assert_eq!(get(&t, k), Lookup::Hit, "block {k}");
    }
    for k in [2, 3, 5, 9] {
        assert_eq!(get(&t, k), Lookup::Miss, "block {k} survived tampering");
    }
    let mut visible = ArenaReader::open(&name).unwrap().keys();
    visible.sort_unstable();
    assert_eq!(visible, vec![BlockHash(1), BlockHash(4)]);
}

#[test]
fn an_arena_made_under_another_key_is_dropped_entirely() {
    let name = name("otherkey");
    crashed_arena(&name, 3);
    let before = inode(&name);
    let t = MemoryTier::create(config(&name, SLOTS, Some(key(4)))).unwrap();
    assert_eq!(inode(&name), before);
    assert_eq!(
        t.adoption(),
        Some(ArenaAdoption {
            unfinished: 2,
            unauthentic: 5,
            ..ArenaAdoption::default()
        })
    );
    assert_eq!((t.len(), t.free_blocks()), (0, SLOTS as usize));
    for k in PUBLISHED {
        assert_eq!(get(&t, k), Lookup::Miss);
    }
    assert!(ArenaReader::open(&name).unwrap().keys().is_empty());
}

#[test]
fn an_arena_of_another_layout_or_without_a_key_is_replaced() {
    for (tag, cfg) in [
        ("layout", config("", SLOTS * 2, Some(key(5)))),
        ("nokey", config("", SLOTS, None)),
    ] {
        let name = name(tag);
        crashed_arena(&name, 5);
        let before = inode(&name);
        let t = MemoryTier::create(MemoryTierConfig {
            shm_name: name.clone(),
            ..cfg
        })
        .unwrap();
        assert_ne!(inode(&name), before, "{tag}: the old arena is still there");
        assert_eq!(t.adoption(), None, "{tag}");
        assert_eq!(t.len(), 0, "{tag}");
        assert_eq!(get(&t, 1), Lookup::Miss, "{tag}");
    }
}

#[test]
fn an_arena_others_may_open_is_replaced() {
    let name = name("open");
    crashed_arena(&name, 6);
    let before = inode(&name);
    std::fs::set_permissions(path(&name), std::fs::Permissions::from_mode(0o664)).unwrap();
    let t = MemoryTier::create(config(&name, SLOTS, Some(key(6)))).unwrap();
    assert_ne!(inode(&name), before);
    assert_eq!((t.adoption(), t.len()), (None, 0));
}

#[test]
fn a_live_owner_is_never_adopted() {
    let name = name("live");
    let owner = MemoryTier::create(config(&name, SLOTS, Some(key(7)))).unwrap();
    assert_eq!(
        owner.put(BlockHash(1), &block(1), &sums(1)).unwrap(),
        PutOutcome::Stored
    );
    assert!(matches!(
        MemoryTier::create(config(&name, SLOTS, Some(key(7)))),
        Err(MemError::InUse { .. })
    ));
    assert_eq!(get(&owner, 1), Lookup::Hit);
}
