//! The remote tier through the [`TierStore`] trait object, on a `file://`
//! store: round trips of whole blocks and layer ranges, a damaged object
//! never read as a hit, keys (the store's listing) and remove.

use std::path::PathBuf;
use std::sync::Arc;

use kvtier_core::Geometry;
use kvtier_remote::RemoteTier;
use kvtier_remote::test_support::file_config;
use kvtier_tier::conformance::{self, TestBlock};
use kvtier_tier::{TierKind, TierStore};

const LAYERS: u32 = 4;
const LAYER_BYTES: usize = 1024;

/// A tier over a fresh directory, and the directory's root.
fn tier(dir: &tempfile::TempDir) -> (Arc<RemoteTier>, PathBuf) {
    let root = dir.path().join("g4");
    let cfg = file_config(&root);
    let geometry = Geometry::raw(LAYERS, u64::from(LAYERS) * LAYER_BYTES as u64).unwrap();
    (Arc::new(RemoteTier::open(&cfg, geometry).unwrap()), root)
}

fn blocks(n: u64) -> Vec<TestBlock> {
    conformance::blocks(4, n, LAYERS as usize, LAYER_BYTES)
}

#[tokio::test]
async fn round_trip_keys_and_remove() {
    let dir = tempfile::tempdir().unwrap();
    let (t, _) = tier(&dir);
    let store: Arc<dyn TierStore> = t;
    assert_eq!(store.kind(), TierKind::Remote);
    let b = blocks(6);
    conformance::put_all(&*store, &b).await;
    conformance::check_round_trip(&*store, &b, LAYER_BYTES, 1..3).await;
    conformance::check_wrong_length_fails(&*store, &b[0]).await;
    conformance::check_keys_and_remove(&*store, &b).await;
}

#[tokio::test]
async fn a_damaged_object_is_never_a_hit() {
    let dir = tempfile::tempdir().unwrap();
    let (t, root) = tier(&dir);
    let store: Arc<dyn TierStore> = t.clone();
    let b = blocks(4);
    conformance::put_all(&*store, &b).await;
    let file = root.join(t.object_path(b[0].key).as_ref());
    let mut bytes = std::fs::read(&file).unwrap();
    let last = bytes.len() - 5;
    bytes[last] ^= 0x10;
    std::fs::write(&file, &bytes).unwrap();
    conformance::check_damaged_never_hit(&*store, &b[..1], &b[1..]).await;
}
