//! `kvtier serve` end to end: it recovers the blocks a data directory holds,
//! stops cleanly on SIGTERM after checkpointing, and leaves the blocks
//! readable; an engine stores, looks up, loads and removes blocks through
//! it with `kvtier-client`, and what it stored is adopted again after a
//! restart; bad configuration fails with a clear message and no state.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Command;

use kvtier_client::{ClientError, StoreOutcome, Tier};
use kvtier_core::{BlockHash, BlockSums, ModelPreset};
use kvtier_disk::DiskConfig;
use kvtier_disk::{DiskTier, DiskTierConfig};
use kvtier_tier::BlockPut;
use support::node::{Daemon, Stats, block_bytes, check_block, shm_name};

mod support;

const CAPACITY: &str = "16MiB";
const REGION: &str = "1MiB";

fn disk_cfg(dir: &Path) -> DiskTierConfig {
    let cfg = DiskConfig {
        capacity_per_dir: CAPACITY.parse().unwrap(),
        region_size: REGION.parse().unwrap(),
        checkpoint_interval_secs: 0,
        ..Default::default()
    };
    DiskTierConfig::new(
        &cfg,
        vec![dir.to_path_buf()],
        ModelPreset::Tiny.geometry(32),
        4096,
    )
}

fn block(k: u128, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u128 * 7 + k * 13) as u8).collect()
}

fn kvtier(data: &Path, shm: &str) -> Command {
    let mut c = support::serve(data, shm);
    c.env("KVTIER_DISK__CAPACITY_PER_DIR", CAPACITY)
        .env("KVTIER_DISK__REGION_SIZE", REGION);
    c
}

#[test]
fn serve_recovers_blocks_and_stops_cleanly_on_sigterm() {
    let data = tempfile::tempdir().unwrap();
    let disk_dir = data.path().join("disk");
    let g = ModelPreset::Tiny.geometry(32);
    let len = g.block_bytes() as usize;
    // Blocks written by an earlier life of the store.
    {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let engine = kvtier_io::build_engine(kvtier_core::IoEngineKind::Auto, 32, 4).unwrap();
        let tier = DiskTier::open(disk_cfg(&disk_dir), engine).unwrap();
        let blocks: Vec<(BlockHash, Vec<u8>, BlockSums)> = (0..10u128)
            .map(|k| {
                let b = block(k, len);
                let s = BlockSums::compute(BlockHash(k), g.layer_bytes() as usize, &b);
                (BlockHash(k), b, s)
            })
            .collect();
        let puts: Vec<BlockPut<'_>> = blocks
            .iter()
            .map(|(k, b, s)| BlockPut {
                key: *k,
                data: b,
                sums: s,
                pinned: None,
            })
            .collect();
        rt.block_on(async {
            assert!(tier.put_batch(&puts).await.iter().all(|r| r.is_ok()));
            tier.close().await.unwrap();
        });
    }

    let shm = format!("kvtier-serve-test-{}", std::process::id());
    let mut child = kvtier(data.path(), &shm)
        .spawn()
        .expect("start kvtier serve");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    // Wait for the ready line (no sleeping: we read until it appears).
    let mut admin_http = None;
    let ready = lines
        .by_ref()
        .map_while(Result::ok)
        .inspect(|l| {
            if let Some(at) = l.find("admin_http=") {
                let rest = &l[at + "admin_http=".len()..];
                admin_http = rest.split_whitespace().next().and_then(|a| a.parse().ok());
            }
        })
        .find(|l| l.contains("kvtier serving"))
        .expect("serve printed its ready line");
    // The node adopted what the disk log held.
    assert!(ready.contains("adopted_g3=10"), "{ready}");
    // The node's figures are on the admin /metrics, per tier.
    let admin_http = admin_http.expect("serve logged its admin HTTP address");
    let (status, metrics) = support::http_text(admin_http, "GET", "/metrics", None, "");
    assert_eq!(status, 200, "{metrics}");
    assert!(
        metrics.contains("kvtier_tier_blocks{tier=\"g3\"} 10"),
        "{metrics}"
    );
    assert!(metrics.contains("kvtier_node_sessions_open 0"), "{metrics}");
    assert!(metrics.trim_end().ends_with("# EOF"), "{metrics}");
    assert!(
        Path::new("/dev/shm").join(&shm).exists(),
        "arena not in /dev/shm"
    );

    // SAFETY: kill(2) on our own child's pid, which has not been reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = child.wait().unwrap();
    assert!(status.success(), "exit {status:?}; log: {rest:?}");
    assert!(
        rest.iter().any(|l| l.contains("stopped cleanly")),
        "{rest:?}"
    );
    assert!(
        !Path::new("/dev/shm").join(&shm).exists(),
        "arena left behind"
    );

    // Every block is still there and exact.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let engine = kvtier_io::build_engine(kvtier_core::IoEngineKind::Auto, 32, 4).unwrap();
    let tier = DiskTier::open(disk_cfg(&disk_dir), engine).unwrap();
    let reqs: Vec<(BlockHash, kvtier_io::AlignedBuf)> = (0..10u128)
        .map(|k| (BlockHash(k), kvtier_io::AlignedBuf::zeroed(len, 4096)))
        .collect();
    let got = rt.block_on(tier.get_batch(reqs));
    for (k, (buf, lookup)) in got.into_iter().enumerate() {
        assert!(lookup.is_hit(), "block {k}: {lookup:?}");
        assert_eq!(&buf[..], &block(k as u128, len)[..]);
    }
}

#[test]
fn a_client_stores_loads_and_removes_and_blocks_survive_a_restart() {
    let data = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::start(data.path(), &shm_name("serve-client"), &[]);
    let mut client = daemon.client();
    assert_eq!(client.hello().shm_name, daemon.shm());
    assert_eq!(client.arena().block_bytes(), block_bytes());

    let blocks: Vec<(u128, Vec<u8>)> = (1..=6).map(|k| (k, support::node::block(k))).collect();
    let batch: Vec<(BlockHash, &[u8])> = blocks
        .iter()
        .map(|(k, b)| (BlockHash(*k), b.as_slice()))
        .collect();
    assert_eq!(client.store(&batch).unwrap(), vec![StoreOutcome::Stored; 6]);
    // A lookup is the longest stored prefix, with each block's tier.
    assert_eq!(
        client.lookup(&hashes(&[1, 2, 3, 4, 5, 6, 99])).unwrap(),
        vec![Tier::G2; 6]
    );
    assert_eq!(client.lookup(&hashes(&[1, 99, 2])).unwrap(), vec![Tier::G2]);
    let mut bufs = vec![vec![0u8; block_bytes()]; 6];
    let mut dsts: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
    assert_eq!(
        client
            .load_into(&hashes(&[1, 2, 3, 4, 5, 6]), &mut dsts)
            .unwrap(),
        6
    );
    for ((_, want), got) in blocks.iter().zip(&bufs) {
        assert!(got == want, "a block loaded with other bytes");
    }
    let stats = Stats::of(&mut client);
    for (name, want) in [
        ("committed", 6),
        ("reserved", 6),
        ("blocks_g2", 6),
        ("loaded", 6),
    ] {
        assert_eq!(stats.get(name), want, "{name}");
    }
    assert_eq!(stats.get("sessions_open"), 1);

    client.remove(&hashes(&[5, 6])).unwrap();
    assert!(client.lookup(&hashes(&[5])).unwrap().is_empty());
    assert!(!check_block(&mut client, 6), "a removed block is readable");
    let stats = Stats::of(&mut client);
    assert_eq!((stats.get("removed"), stats.get("blocks_g2")), (2, 4));

    // SIGTERM: a clean exit that moves G2 to disk and leaves no socket or
    // arena behind; the client learns the daemon is gone.
    let (status, log) = daemon.terminate();
    assert!(status.success(), "exit {status}; log:\n{}", log.join("\n"));
    assert!(log.iter().any(|l| l.contains("stopped cleanly")), "{log:?}");
    assert!(!daemon.socket().exists(), "socket file left behind");
    assert!(
        !Path::new("/dev/shm").join(daemon.shm()).exists(),
        "arena left behind"
    );
    assert!(matches!(client.stats(), Err(ClientError::Disconnected)));

    // Restart: what G2 held is adopted from the disk log and loads exact;
    // the removed blocks stay removed.
    daemon.restart();
    assert_eq!(daemon.adopted_g3(), 4, "{}", daemon.ready_line());
    let mut client = daemon.client();
    let stats = Stats::of(&mut client);
    assert_eq!((stats.get("blocks_g2"), stats.get("blocks_g3")), (0, 4));
    assert_eq!(stats.get("adopted_g3"), 4);
    // A clean stop leaves no arena: adopting one is for crashes only.
    assert_eq!(stats.get("adopted_g2"), 0);
    assert_eq!(
        client.lookup(&hashes(&[1, 2, 3, 4, 5])).unwrap(),
        vec![Tier::G3; 4]
    );
    for key in 1..=4 {
        assert!(
            check_block(&mut client, key),
            "block {key} lost over the restart"
        );
    }
    assert!(!check_block(&mut client, 5), "a removed block came back");
    // Exclusive mode: loading moved the blocks up; each lives in one tier.
    let stats = Stats::of(&mut client);
    assert_eq!((stats.get("blocks_g2"), stats.get("blocks_g3")), (4, 0));
    drop(client);
    let (status, log) = daemon.terminate();
    assert!(status.success(), "exit {status}; log:\n{}", log.join("\n"));
}

fn hashes(keys: &[u128]) -> Vec<BlockHash> {
    keys.iter().map(|k| BlockHash(*k)).collect()
}

#[test]
fn bad_configuration_is_a_clear_error() {
    let data = tempfile::tempdir().unwrap();
    let out = kvtier(data.path(), "kvtier-serve-test-bad")
        .env("KVTIER_DISK__REGION_SISE", "1MiB")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("region_sise"), "{err}");
    assert!(
        !data.path().join("disk").exists(),
        "a failed start created state"
    );
}
