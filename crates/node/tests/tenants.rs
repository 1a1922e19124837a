//! Tenants that do not trust each other, on one real node (arena, disk
//! log, block manager and socket, in this process): a client of one
//! namespace can neither name nor replace another namespace's blocks, with
//! any key it sends and anything it can read (the arena's slot table shows
//! every stored key), and a client that rewrites what it can write of the
//! arena (slot bytes, slot-table entries) gets the owner a miss, never its
//! bytes (docs/node-protocol.md §11.1, docs/server.md "Trust model of the
//! node daemon").

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;

use kvtier_client::{BlockHash, Client, ClientConfig, Namespace, StoreOutcome, WireGeometry};
use kvtier_core::BlockSums;
use kvtier_node::test_support::{TestNode, namespace, small_config};
use proptest::prelude::*;

/// The arena's slot count (every slot a block of one tenant or the other).
const SLOTS: u64 = 16;

struct Daemon {
    test: TestNode,
    _dir: tempfile::TempDir,
}

impl Daemon {
    fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = small_config(dir.path(), SLOTS);
        Self {
            test: TestNode::start(config, Vec::new()),
            _dir: dir,
        }
    }

    fn len(&self) -> usize {
        self.test.node.geometry().block_bytes() as usize
    }

    fn layer(&self) -> usize {
        self.test.node.geometry().layer_bytes() as usize
    }

    fn client(&self, ns: Namespace) -> Client {
        let geometry = WireGeometry::from(self.test.node.geometry());
        Client::connect(ClientConfig::new(self.test.socket(), ns, geometry)).expect("connect")
    }

    fn shm_path(&self) -> std::path::PathBuf {
        self.test.node.memory().shm_path().to_path_buf()
    }
}

fn tenant(salt: &[u8]) -> Namespace {
    Namespace {
        tenant_salt: Some(salt.to_vec()),
        ..namespace("shared-model")
    }
}

fn block(k: u128, fill: u8, len: usize) -> Vec<u8> {
    let seed = (k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len as u64)
        .map(|i| (seed.wrapping_mul(i + 7) >> 29) as u8 ^ fill)
        .collect()
}

fn keys(ks: &[u128]) -> Vec<BlockHash> {
    ks.iter().map(|k| BlockHash(*k)).collect()
}

/// Tenant A's blocks: keys 1..=4, stored by A.
const A_KEYS: [u128; 4] = [1, 2, 3, 4];

fn store_a(d: &Daemon, a: &mut Client) {
    let bytes: Vec<Vec<u8>> = A_KEYS.iter().map(|&k| block(k, 0, d.len())).collect();
    let batch: Vec<(BlockHash, &[u8])> = A_KEYS
        .iter()
        .zip(&bytes)
        .map(|(&k, b)| (BlockHash(k), b.as_slice()))
        .collect();
    assert_eq!(a.store(&batch).unwrap(), vec![StoreOutcome::Stored; 4]);
}

/// Loads A's blocks through A; how many leading ones are A's exact bytes.
fn a_reads_back(d: &Daemon, a: &mut Client) -> usize {
    let mut bufs = vec![vec![0u8; d.len()]; A_KEYS.len()];
    let mut dsts: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
    let n = a.load_into(&keys(&A_KEYS), &mut dsts).unwrap();
    for (i, buf) in bufs.iter().enumerate().take(n) {
        assert_eq!(*buf, block(A_KEYS[i], 0, d.len()), "block {i} served wrong");
    }
    n
}

/// The published entries of the slot table as any client can read them
/// from the arena file: (slot, stored key, table entry offset).
fn table_entries(path: &std::path::Path) -> Vec<(u64, u128, u64)> {
    let file = std::fs::File::open(path).expect("open the arena file");
    let word = |at: u64| {
        let mut b = [0u8; 8];
        file.read_exact_at(&mut b, at).expect("read the arena");
        u64::from_le_bytes(b)
    };
    let (slots, entry_bytes, table) = (word(32), word(60) & 0xffff_ffff, word(64));
    (0..slots)
        .filter_map(|s| {
            let at = table + s * entry_bytes;
            let key = u128::from(word(at + 8)) | u128::from(word(at + 16)) << 64;
            (word(at + 32) != 0).then_some((s, key, at))
        })
        .collect()
}

/// Keys an attacker of namespace `m` can derive from a stored key it read
/// in the table: the key itself, XORed with every namespace digest it can
/// compute (the scheme before protocol 3.0), and A's own client keys.
fn derived_keys(stored: u128, m: &Namespace) -> Vec<BlockHash> {
    let mut out = vec![
        BlockHash(stored),
        BlockHash(stored ^ m.digest()),
        BlockHash(stored ^ tenant(b"tenant-a").digest()),
    ];
    out.extend(keys(&A_KEYS));
    out
}

/// The exact attack of issue 30 item 1: tenant M reads A's stored keys
/// from the slot table and sends every key it can derive from them; it
/// can neither find, load, remove nor replace A's blocks.
#[test]
fn a_tenant_cannot_reach_another_tenants_blocks_through_the_protocol() {
    let d = Daemon::start();
    let mut a = d.client(tenant(b"tenant-a"));
    let mut m = d.client(tenant(b"tenant-m"));
    store_a(&d, &mut a);
    let entries = table_entries(&d.shm_path());
    assert_eq!(entries.len(), A_KEYS.len(), "A's blocks are in the table");
    let m_ns = tenant(b"tenant-m");
    let guesses: Vec<BlockHash> = entries
        .iter()
        .flat_map(|&(_, stored, _)| derived_keys(stored, &m_ns))
        .collect();
    for k in &guesses {
        assert!(m.lookup(&[*k]).unwrap().is_empty(), "M finds {k}");
        let load = m.load(&[*k]).unwrap();
        assert_eq!(load.prefix_len(), 0, "M loads {k}");
        m.release_load(load).unwrap();
    }
    m.remove(&guesses).unwrap();
    // Replace: M stores its own bytes under every guess; each lands in
    // M's namespace.
    let evil: Vec<Vec<u8>> = guesses.iter().map(|k| block(k.0, 0x5a, d.len())).collect();
    for (k, bytes) in guesses.iter().zip(&evil) {
        let out = m.store(&[(*k, bytes.as_slice())]).unwrap();
        assert!(
            matches!(out[0], StoreOutcome::Stored | StoreOutcome::AlreadyStored),
            "{k}: {out:?}"
        );
    }
    assert_eq!(a_reads_back(&d, &mut a), A_KEYS.len(), "A lost a block");
}

/// Issue 30 item 2: M rewrites, through its own writable mapping of the
/// arena, one of A's slots and its table entry so that they agree (bytes
/// and checksums computed with the stored key the table shows). A never
/// gets those bytes: its client verifies against the checksums the daemon
/// sent, so the block is a miss (and is removed, to be stored again).
#[test]
fn rewritten_slot_bytes_or_table_entries_are_never_served() {
    let d = Daemon::start();
    let mut a = d.client(tenant(b"tenant-a"));
    store_a(&d, &mut a);
    let memory = d.test.node.memory();
    let victim = a.key_map().stored(BlockHash(A_KEYS[1]));
    let slot = memory.get_ref(victim).expect("resident").slot() as u64;
    let (_, _, entry_at) = *table_entries(&d.shm_path())
        .iter()
        .find(|(s, _, _)| *s == slot)
        .expect("the victim's entry");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(d.shm_path())
        .expect("a same-group client opens the arena read-write");
    let evil = block(99, 0xa5, d.len());
    let sums = BlockSums::compute(victim, d.layer(), &evil);
    let data_offset = memory.slot_offset(slot as usize);
    file.write_all_at(&evil, data_offset)
        .expect("write the slot");
    file.write_all_at(&sums.block.to_le_bytes(), entry_at + 24)
        .expect("forge the block sum");
    for (l, s) in sums.layers.iter().enumerate() {
        file.write_all_at(&s.to_le_bytes(), entry_at + 64 + 8 * l as u64)
            .expect("forge a layer sum");
    }
    // The forgery is complete: a reader that trusted the table would take
    // M's bytes for A's block.
    let trusting = kvtier_arena::ArenaReader::open(memory.shm_name()).expect("map read-only");
    let mut seen = vec![0u8; d.len()];
    assert_eq!(trusting.get(victim, &mut seen), kvtier_core::Lookup::Hit);
    assert_eq!(seen, evil);
    // Layer by layer, no forged layer reads as a hit.
    let load = a.load(&keys(&A_KEYS[1..2])).unwrap();
    let layers = d.test.node.geometry().layers;
    a.wait_layer(&load, layers - 1).unwrap();
    let mut part = vec![0u8; d.layer()];
    for l in 0..layers {
        let got = load.read_layer(0, l, &mut part).unwrap();
        assert_eq!(got, kvtier_core::Lookup::Corrupt, "layer {l}");
    }
    a.release_load(load).unwrap();
    // Whole blocks: block 0 is served; block 1 (forged) ends the verified
    // prefix.
    assert_eq!(a_reads_back(&d, &mut a), 1);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// Whatever keys M sends (random ones, A's own client keys, the stored
    /// keys it reads in the table), it cannot load, pin, remove or replace
    /// A's blocks.
    #[test]
    fn no_key_of_another_namespace_reaches_a_block(
        random in proptest::collection::vec(any::<u128>(), 1..64),
        salt in proptest::collection::vec(any::<u8>(), 0..16),
    ) {
        let d = Daemon::start();
        let mut a = d.client(tenant(b"tenant-a"));
        let m_ns = Namespace { tenant_salt: Some(salt.clone()), ..tenant(b"") };
        prop_assume!(m_ns != tenant(b"tenant-a"));
        let mut m = d.client(m_ns.clone());
        store_a(&d, &mut a);
        let mut sent = keys(&random);
        for (_, stored, _) in table_entries(&d.shm_path()) {
            sent.extend(derived_keys(stored, &m_ns));
        }
        prop_assert!(m.lookup(&sent).unwrap().is_empty());
        let load = m.load(&sent).unwrap();
        prop_assert_eq!(load.prefix_len(), 0);
        m.release_load(load).unwrap();
        m.remove(&sent).unwrap();
        let evil: Vec<Vec<u8>> = sent.iter().map(|k| block(k.0, 0x3c, d.len())).collect();
        for chunk in sent.iter().zip(&evil).collect::<Vec<_>>().chunks(8) {
            let batch: Vec<(BlockHash, &[u8])> =
                chunk.iter().map(|(k, b)| (**k, b.as_slice())).collect();
            m.store(&batch).unwrap();
        }
        prop_assert_eq!(a_reads_back(&d, &mut a), A_KEYS.len());
    }
}
