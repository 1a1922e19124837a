//! A full disk under the metadata service, on a real tmpfs filled to the
//! last byte: the embedded index refuses writes with a typed error while
//! it cannot write, keeps serving reads, and takes writes again once space
//! is freed, without a reopen by the caller and without losing anything;
//! it opens on a full disk. (A file pool on a full file system:
//! `crates/backend/tests/pool_enospc.rs`.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvtier_meta::test_support::Tmpfs;
use kvtier_meta::*;

/// Size of every test file system.
const FS_BYTES: u64 = 8 << 20;

/// How long writes may take to resume once space is freed (the index
/// retries at most every 5 s).
const RESUME_WITHIN: Duration = Duration::from_secs(30);

fn mount() -> Tmpfs {
    Tmpfs::mount(FS_BYTES).expect("a tmpfs to fill (these tests need root)")
}

/// A serving block record for `key`, about 1 KiB encoded.
fn block(key: u64) -> BlockMeta {
    BlockMeta {
        key: BlockKey(key),
        locations: vec![CacheLocation {
            id: LocationId(key + 1),
            storage: "s".into(),
            kind: StorageKind::FilePool,
            status: LocationStatus::Serving,
            specs: vec![LocationSpec {
                name: "tp0".into(),
                uri: format!("file:///kv/{key}/{}", "x".repeat(1000)),
                size: 100,
            }],
        }],
        last_access_ms: key,
        access_count: 1,
        depth: 0,
    }
}

/// Every key in `acked` reads back exactly as written.
fn assert_all_readable(idx: &RedbIndex, acked: &[u64]) {
    let keys: Vec<BlockKey> = acked.iter().map(|&k| BlockKey(k)).collect();
    let got = idx.get("i", &keys).expect("reads are served");
    for (k, m) in acked.iter().zip(got) {
        assert_eq!(m, Some(block(*k)), "block {k}");
    }
    assert_eq!(idx.count("i").expect("count"), acked.len() as u64);
}

/// Writes fresh blocks from `next` on until the index refuses one; returns
/// that error. redb may fit a few writes into pages it already has, so the
/// refusal need not be the first write after the disk filled up.
fn write_until_refused(idx: &RedbIndex, next: &mut u64, acked: &mut Vec<u64>) -> MetaError {
    let limit = *next + 10_000;
    loop {
        assert!(
            *next < limit,
            "the index never refused a write on a full disk"
        );
        match idx.put("i", &[block(*next)]) {
            Ok(()) => acked.push(*next),
            Err(e) => return e,
        }
        *next += 1;
    }
}

fn assert_refused(e: &MetaError) {
    assert_eq!(e.code(), "STORE_UNWRITABLE", "{e}");
    let msg = e.to_string();
    assert!(msg.contains("metadata store cannot write"), "{msg}");
    assert!(
        msg.to_lowercase().contains("no space left on device"),
        "{msg}"
    );
}

/// Retries writing `key` until it is taken; every refusal on the way must
/// be the typed one.
fn write_once_resumed(idx: &RedbIndex, key: u64) {
    let deadline = Instant::now() + RESUME_WITHIN;
    while let Err(e) = idx.put("i", &[block(key)]) {
        assert_eq!(e.code(), "STORE_UNWRITABLE", "{e}");
        assert!(Instant::now() < deadline, "writes never resumed: {e}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn redb_refuses_writes_while_full_serves_reads_and_recovers_in_place() {
    let fs = mount();
    let path = fs.path().join("meta.redb");
    let idx = RedbIndex::open(&path, 1 << 20).expect("open");
    let mut acked: Vec<u64> = Vec::new();
    for k in 0..50 {
        idx.put("i", &[block(k)])
            .expect("write before the disk fills");
        acked.push(k);
    }
    idx.put_record(RecordKind::Group, "g1", b"group")
        .expect("record");

    fs.fill().expect("fill the file system");
    let mut next = 1000;
    let err = write_until_refused(&idx, &mut next, &mut acked);
    assert_refused(&err);

    // While the disk stays full every kind of write is refused the same
    // way and changes nothing; reads answer throughout.
    for _ in 0..3 {
        assert_refused(&idx.put("i", &[block(next)]).unwrap_err());
        assert_refused(&idx.delete("i", &[BlockKey(0)]).unwrap_err());
        assert_refused(&idx.put_record(RecordKind::Group, "g2", b"g").unwrap_err());
        assert_all_readable(&idx, &acked);
        assert_eq!(
            idx.get_record(RecordKind::Group, "g1")
                .expect("record read"),
            Some(b"group".to_vec())
        );
    }

    fs.free().expect("free the filler");
    write_once_resumed(&idx, next);
    acked.push(next);
    assert_eq!(idx.delete("i", &[BlockKey(0)]).expect("delete"), 1);
    acked.retain(|&k| k != 0);
    assert_all_readable(&idx, &acked);

    // Nothing acknowledged was lost: a fresh open sees it all.
    drop(idx);
    let idx = RedbIndex::open(&path, 1 << 20).expect("reopen");
    assert_all_readable(&idx, &acked);
}

#[test]
fn redb_opens_on_a_full_disk_serves_reads_and_writes_once_freed() {
    let fs = mount();
    let path = fs.path().join("meta.redb");
    let acked: Vec<u64> = (0..50).collect();
    {
        let idx = RedbIndex::open(&path, 1 << 20).expect("open");
        for &k in &acked {
            idx.put("i", &[block(k)]).expect("write");
        }
    }
    fs.fill().expect("fill the file system");

    let idx = RedbIndex::open(&path, 1 << 20).expect("an existing index opens on a full disk");
    assert_all_readable(&idx, &acked);
    assert_refused(&idx.put("i", &[block(500)]).unwrap_err());
    assert_all_readable(&idx, &acked);

    fs.free().expect("free the filler");
    write_once_resumed(&idx, 500);
    let mut all = acked.clone();
    all.push(500);
    assert_all_readable(&idx, &all);
}

/// Accounts provisioned at every start (`[[meta.accounts]]`, the bootstrap
/// admin key) are not rewritten when unchanged, so a restart on a full
/// disk still starts; a changed account is refused with the typed error.
#[test]
fn unchanged_accounts_are_provisioned_on_a_full_disk() {
    const KEY: &str = "provisioned-admin-key-0123456789";
    let fs = mount();
    let path = fs.path().join("meta.redb");
    let open = || {
        let idx = RedbIndex::open(&path, 1 << 20).expect("open");
        MetaService::new(Arc::new(idx), MetaConfig::default()).expect("service")
    };
    {
        let svc = open();
        svc.put_account("admin", Role::Admin, ApiKey::Clear(KEY), vec![])
            .expect("first provisioning");
    }
    fs.fill().expect("fill the file system");
    let svc = open();
    svc.put_account("admin", Role::Admin, ApiKey::Clear(KEY), vec![])
        .expect("an unchanged account needs no write");
    assert!(svc.authenticate(KEY).expect("the key works").is_admin());
    let changed = svc
        .put_account("admin", Role::User, ApiKey::Clear(KEY), vec![])
        .unwrap_err();
    assert_refused(&changed);
    assert!(svc.authenticate(KEY).expect("still an admin").is_admin());
}
