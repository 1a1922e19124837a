//! RemoteTier against both real stores: a LocalFileSystem directory and an
//! S3 server (moto, started here; the S3 tests fail when moto is not
//! installed). Every scenario runs on both.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use kvtier_core::{BlockHash, BlockSums, Geometry};
use kvtier_remote::format::{Header, header_len};
use kvtier_remote::test_support::{MotoServer, file_config, free_port};
use kvtier_remote::{RemoteConfig, RemoteError, RemoteRead, RemoteTier};
use kvtier_tier::BlockPut;
use object_store::ObjectStore;
use object_store::local::LocalFileSystem;
use object_store::path::Path;

const LAYERS: u32 = 4;
const LAYER_BYTES: usize = 1024;
const BLOCK_BYTES: usize = LAYERS as usize * LAYER_BYTES;

fn geometry() -> Geometry {
    Geometry::raw(LAYERS, BLOCK_BYTES as u64).unwrap()
}

fn block(key: BlockHash) -> (Vec<u8>, BlockSums) {
    let seed = key.fold64();
    let data: Vec<u8> = (0..BLOCK_BYTES as u64)
        .map(|i| (seed.wrapping_mul(31).wrapping_add(i * 7) >> 3) as u8)
        .collect();
    let sums = BlockSums::compute(key, LAYER_BYTES, &data);
    (data, sums)
}

/// The store behind a tier, and what keeps it alive.
enum Backing {
    Dir(tempfile::TempDir),
    S3 { _moto: MotoServer },
}

struct Env {
    tier: RemoteTier,
    /// The same store, bypassing the tier.
    raw: Arc<dyn ObjectStore>,
    /// The tier's key prefix inside `raw`.
    prefix: &'static str,
    backing: Backing,
}

fn file_env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("g4");
    let cfg = file_config(&root);
    let tier = RemoteTier::open(&cfg, geometry()).unwrap();
    let raw = Arc::new(LocalFileSystem::new_with_prefix(&root).unwrap());
    Env {
        tier,
        raw,
        prefix: "",
        backing: Backing::Dir(dir),
    }
}

fn s3_env() -> Env {
    let moto = MotoServer::start();
    moto.create_bucket("kvremote");
    let mut cfg = moto.config("kvremote", "cache/v1");
    cfg.max_concurrency = 4;
    let tier = RemoteTier::open(&cfg, geometry()).unwrap();
    Env {
        tier,
        raw: moto.store("kvremote"),
        prefix: "cache/v1",
        backing: Backing::S3 { _moto: moto },
    }
}

impl Env {
    async fn put(&self, keys: &[BlockHash]) {
        let blocks: Vec<_> = keys.iter().map(|&k| (k, block(k))).collect();
        let puts: Vec<_> = blocks
            .iter()
            .map(|(k, (data, sums))| BlockPut {
                key: *k,
                data,
                sums,
                pinned: None,
            })
            .collect();
        for r in self.tier.put_batch(&puts).await {
            r.unwrap();
        }
    }

    fn file_of(&self, key: BlockHash) -> Option<PathBuf> {
        match &self.backing {
            Backing::Dir(d) => Some(
                d.path()
                    .join("g4")
                    .join(self.tier.object_path(key).as_ref()),
            ),
            Backing::S3 { .. } => None,
        }
    }

    async fn raw_bytes(&self, key: BlockHash) -> Vec<u8> {
        let p = self.tier.object_path(key);
        self.raw
            .get(&p)
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap()
            .to_vec()
    }

    /// Replaces block `key`'s stored object: on disk by editing the file, on
    /// S3 by overwriting the object with a modified copy.
    async fn mutate(&self, key: BlockHash, f: impl FnOnce(&mut Vec<u8>)) {
        let mut b = self.raw_bytes(key).await;
        f(&mut b);
        match self.file_of(key) {
            Some(file) => std::fs::write(file, &b).unwrap(),
            None => {
                self.raw
                    .put(&self.tier.object_path(key), b.into())
                    .await
                    .unwrap();
            }
        }
    }

    /// Stores block `from`'s object under block `to`'s name.
    async fn copy_object(&self, from: BlockHash, to: BlockHash) {
        let b = self.raw_bytes(from).await;
        self.raw
            .put(&self.tier.object_path(to), b.into())
            .await
            .unwrap();
    }

    async fn exists(&self, key: BlockHash) -> bool {
        match self.raw.head(&self.tier.object_path(key)).await {
            Ok(_) => true,
            Err(object_store::Error::NotFound { .. }) => false,
            Err(e) => panic!("head: {e}"),
        }
    }

    async fn get(&self, key: BlockHash) -> RemoteRead {
        self.tier.get_batch(&[key]).await.remove(0)
    }

    async fn layers(&self, key: BlockHash, layers: std::ops::Range<u32>) -> RemoteRead {
        self.tier.read_layers(&[key], layers).await.remove(0)
    }
}

fn assert_hit(r: &RemoteRead, key: BlockHash, layers: std::ops::Range<u32>) {
    let (data, sums) = block(key);
    let want = &data[layers.start as usize * LAYER_BYTES..layers.end as usize * LAYER_BYTES];
    match r {
        RemoteRead::Hit { bytes, sums: got } => {
            assert_eq!(bytes.as_ref(), want, "{key} {layers:?}");
            assert_eq!(got, &sums);
        }
        other => panic!("{key} {layers:?}: expected a hit, got {other:?}"),
    }
}

fn assert_corrupt(r: &RemoteRead, what: &str) {
    assert!(matches!(r, RemoteRead::Corrupt), "{what}: {r:?}");
}

async fn round_trip(env: Env) {
    let keys: Vec<BlockHash> = (1..=6u128).map(|i| BlockHash(i << 124 | i)).collect();
    env.put(&keys).await;
    let missing = BlockHash(0xdead);
    let mut ask = keys.clone();
    ask.insert(2, missing);
    let got = env.tier.get_batch(&ask).await;
    assert_eq!(got.len(), ask.len());
    for (k, r) in ask.iter().zip(&got) {
        if *k == missing {
            assert!(matches!(r, RemoteRead::Miss), "{r:?}");
        } else {
            assert_hit(r, *k, 0..LAYERS);
        }
    }
    for layers in [0..1, 1..3, 3..4, 0..LAYERS, 2..4] {
        let got = env.tier.read_layers(&ask, layers.clone()).await;
        for (k, r) in ask.iter().zip(&got) {
            if *k == missing {
                assert!(matches!(r, RemoteRead::Miss), "{r:?}");
            } else {
                assert_hit(r, *k, layers.clone());
            }
        }
    }
    for bad in [2..2, 3..5, 4..5] {
        let r = env.layers(keys[0], bad.clone()).await;
        assert!(
            matches!(r, RemoteRead::Failed(RemoteError::BadRange { .. })),
            "{bad:?}: {r:?}"
        );
    }
    // Overwriting a block with the same content is fine.
    env.put(&keys[..1]).await;
    assert_hit(&env.get(keys[0]).await, keys[0], 0..LAYERS);

    let uri = env.tier.object_uri(keys[0]);
    assert!(uri.starts_with(env.tier.url()), "{uri}");
    assert!(
        uri.ends_with("/blocks/10/10000000000000000000000000000001"),
        "{uri}"
    );
    let s = env.tier.stats();
    assert_eq!(s.puts, 7);
    assert_eq!(s.bytes_written, 7 * BLOCK_BYTES as u64);
    assert_eq!(s.misses, 6);
    assert_eq!(s.gets, 6 + 5 * 6 + 1);
    assert_eq!(s.corrupt, 0);
    assert_eq!(s.errors, 3);
}

async fn corruption(env: Env) {
    let keys: Vec<BlockHash> = (100..110u128).map(BlockHash).collect();
    env.put(&keys).await;
    let hl = header_len(LAYERS);
    let data_at = |layer: usize, off: usize| hl + layer * LAYER_BYTES + off;

    // A flipped data byte: whole-block read and a read of its layer.
    env.mutate(keys[0], |b| b[data_at(2, 17)] ^= 0x40).await;
    assert_corrupt(&env.get(keys[0]).await, "data flip, get");
    assert!(!env.exists(keys[0]).await, "corrupt object not removed");
    assert!(matches!(env.get(keys[0]).await, RemoteRead::Miss));

    env.mutate(keys[1], |b| b[data_at(2, 17)] ^= 0x01).await;
    // Layers that do not hold the flip are intact and served.
    assert_hit(&env.layers(keys[1], 0..2).await, keys[1], 0..2);
    assert_hit(&env.layers(keys[1], 3..4).await, keys[1], 3..4);
    assert_corrupt(&env.layers(keys[1], 1..3).await, "data flip, layers");
    assert!(!env.exists(keys[1]).await);

    // A flipped header byte (a layer sum, the key, the magic).
    for (i, at) in [(2, 64 + 8), (3, 20), (4, 0)] {
        env.mutate(keys[i], |b| b[at] ^= 0x80).await;
        assert_corrupt(&env.get(keys[i]).await, "header flip, get");
        assert!(!env.exists(keys[i]).await);
    }
    env.mutate(keys[5], |b| b[hl - 1] ^= 0x02).await;
    assert_corrupt(&env.layers(keys[5], 0..1).await, "header flip, layers");
    assert!(!env.exists(keys[5]).await);

    // Truncated objects: mid-data, mid-header, empty.
    env.mutate(keys[6], |b| b.truncate(data_at(3, 100))).await;
    assert_corrupt(&env.get(keys[6]).await, "truncated, get");
    assert!(!env.exists(keys[6]).await);
    env.mutate(keys[7], |b| b.truncate(data_at(2, 5))).await;
    assert_corrupt(&env.layers(keys[7], 2..4).await, "truncated, layers");
    assert!(!env.exists(keys[7]).await);
    env.mutate(keys[8], |b| b.truncate(hl / 2)).await;
    assert_corrupt(&env.layers(keys[8], 0..1).await, "truncated header, layers");
    env.put(&keys[8..9]).await;
    env.mutate(keys[8], |b| b.clear()).await;
    assert_corrupt(&env.get(keys[8]).await, "empty object");

    // Another block's object under this block's name.
    let (a, b) = (keys[9], BlockHash(0xbbbb));
    env.copy_object(a, b).await;
    assert_corrupt(&env.get(b).await, "wrong key, get");
    assert!(!env.exists(b).await);
    env.copy_object(a, b).await;
    assert_corrupt(&env.layers(b, 0..1).await, "wrong key, layers");
    assert!(!env.exists(b).await);
    assert_hit(&env.get(a).await, a, 0..LAYERS);

    assert_eq!(env.tier.stats().corrupt, 12);
    assert_eq!(env.tier.stats().errors, 0);
}

async fn refused_puts(env: Env) {
    let key = BlockHash(0x51);
    let (mut data, sums) = block(key);
    data[BLOCK_BYTES - 1] ^= 1;
    let r = env
        .tier
        .put_batch(&[BlockPut {
            key,
            data: &data,
            sums: &sums,
            pinned: None,
        }])
        .await;
    assert_eq!(r, vec![Err(RemoteError::Corrupt)]);
    // Sums of another block.
    let (good, _) = block(key);
    let (_, other_sums) = block(BlockHash(0x52));
    // Sums whose layers do not combine to the block sum.
    let mut inconsistent = sums.clone();
    inconsistent.block ^= 1;
    let short = &good[..BLOCK_BYTES - 1];
    let mut few = sums.clone();
    few.layers.pop();
    let r = env
        .tier
        .put_batch(&[
            BlockPut {
                key,
                data: &good,
                sums: &other_sums,
                pinned: None,
            },
            BlockPut {
                key,
                data: &good,
                sums: &inconsistent,
                pinned: None,
            },
            BlockPut {
                key,
                data: short,
                sums: &sums,
                pinned: None,
            },
            BlockPut {
                key,
                data: &good,
                sums: &few,
                pinned: None,
            },
        ])
        .await;
    assert_eq!(r[0], Err(RemoteError::Corrupt));
    assert_eq!(r[1], Err(RemoteError::Corrupt));
    assert!(
        matches!(r[2], Err(RemoteError::WrongLength { what: "bytes", .. })),
        "{:?}",
        r[2]
    );
    assert!(
        matches!(
            r[3],
            Err(RemoteError::WrongLength {
                what: "layer checksums",
                ..
            })
        ),
        "{:?}",
        r[3]
    );
    assert!(!env.exists(key).await, "a refused block was stored");
    assert!(matches!(env.get(key).await, RemoteRead::Miss));
    assert_eq!(env.tier.list().await.unwrap(), vec![]);
    let s = env.tier.stats();
    assert_eq!((s.puts, s.corrupt, s.errors), (0, 3, 2));
}

async fn list_and_remove(env: Env) {
    assert_eq!(env.tier.list().await.unwrap(), vec![]);
    let mut keys: Vec<BlockHash> = [7u128, 0xff << 120, 3 << 64, 42]
        .into_iter()
        .map(BlockHash)
        .collect();
    env.put(&keys).await;
    // Foreign objects under and beside the prefix.
    let join = |rest: &str| {
        if env.prefix.is_empty() {
            Path::from(rest)
        } else {
            Path::from(format!("{}/{rest}", env.prefix))
        }
    };
    for foreign in [
        "blocks/readme.txt",
        "blocks/00/notakey",
        "blocks/01/00000000000000000000000000000007",
        "other/00/00000000000000000000000000000007",
    ] {
        env.raw
            .put(&join(foreign), b"foreign".to_vec().into())
            .await
            .unwrap();
    }
    // What a crash mid-write leaves on a file system: a temporary file.
    if let Some(file) = env.file_of(BlockHash(9)) {
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        let mut tmp = file.into_os_string();
        tmp.push("#1");
        std::fs::write(tmp, b"half an object").unwrap();
    }
    keys.sort();
    assert_eq!(env.tier.list().await.unwrap(), keys);

    let gone = [keys[0], keys[2], BlockHash(0x404)];
    for r in env.tier.remove_batch(&gone).await {
        r.unwrap();
    }
    for k in gone {
        assert!(matches!(env.get(k).await, RemoteRead::Miss));
        assert!(matches!(env.layers(k, 1..2).await, RemoteRead::Miss));
    }
    assert_eq!(env.tier.list().await.unwrap(), vec![keys[1], keys[3]]);
    assert_hit(&env.get(keys[1]).await, keys[1], 0..LAYERS);
    // The foreign objects are untouched.
    let all: Vec<_> = env.raw.list(None).try_collect().await.unwrap();
    assert!(all.len() >= 6, "{all:?}");
}

/// Layers far from the header (more than 1 MiB in) are read with two ranged
/// requests; a truncation that cuts them off entirely is still corrupt.
async fn far_layers(env: Env) {
    let g = Geometry::raw(3, 3 << 20).unwrap();
    let tier = RemoteTier::with_store(
        env.raw.clone(),
        "test://big",
        "big",
        g,
        Duration::from_secs(10),
        2,
    );
    let keys = [BlockHash(1), BlockHash(2), BlockHash(3)];
    let data: Vec<Vec<u8>> = keys
        .iter()
        .map(|k| (0..3u64 << 20).map(|i| (i as u8) ^ (k.0 as u8)).collect())
        .collect();
    let sums: Vec<BlockSums> = keys
        .iter()
        .zip(&data)
        .map(|(k, d)| BlockSums::compute(*k, 1 << 20, d))
        .collect();
    let puts: Vec<BlockPut> = (0..3)
        .map(|i| BlockPut {
            key: keys[i],
            data: &data[i],
            sums: &sums[i],
            pinned: None,
        })
        .collect();
    for r in tier.put_batch(&puts).await {
        r.unwrap();
    }
    let got = tier.read_layers(&keys, 2..3).await;
    for (i, r) in got.iter().enumerate() {
        match r {
            RemoteRead::Hit { bytes, .. } => assert_eq!(bytes.as_ref(), &data[i][2 << 20..]),
            other => panic!("{other:?}"),
        }
    }
    let hl = header_len(3);
    let path = tier.object_path(keys[0]);
    let mut short = data[0].clone();
    short.truncate((3 << 19) + hl);
    let mut obj = Header::new(keys[0], &g, sums[0].clone()).encode();
    obj.extend_from_slice(&short);
    obj.truncate(hl + (3 << 19));
    env.raw.put(&path, obj.into()).await.unwrap();
    let r = tier.read_layers(&keys[..1], 2..3).await;
    assert!(matches!(r[0], RemoteRead::Corrupt), "{r:?}");
    assert!(matches!(
        env.raw.head(&path).await,
        Err(object_store::Error::NotFound { .. })
    ));
    // A flip in a far layer.
    let path = tier.object_path(keys[1]);
    let mut obj = env
        .raw
        .get(&path)
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
        .to_vec();
    obj[hl + (5 << 19)] ^= 4;
    env.raw.put(&path, obj.into()).await.unwrap();
    assert!(matches!(
        tier.read_layers(&keys[1..2], 1..2).await[0],
        RemoteRead::Hit { .. }
    ));
    assert!(matches!(
        tier.read_layers(&keys[1..2], 2..3).await[0],
        RemoteRead::Corrupt
    ));
    assert_eq!(tier.list().await.unwrap(), vec![keys[2]]);
    assert!(
        tier.object_uri(keys[2])
            .starts_with("test://big/blocks/00/")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn far_layers_on_a_file_system() {
    far_layers(file_env()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn far_layers_on_s3() {
    far_layers(s3_env()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_on_a_file_system() {
    round_trip(file_env()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_on_s3() {
    round_trip(s3_env()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_objects_are_never_served_on_a_file_system() {
    corruption(file_env()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_objects_are_never_served_on_s3() {
    corruption(s3_env()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_not_matching_their_sums_are_not_stored_on_a_file_system() {
    refused_puts(file_env()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_not_matching_their_sums_are_not_stored_on_s3() {
    refused_puts(s3_env()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_ignores_foreign_objects_and_remove_misses_on_a_file_system() {
    list_and_remove(file_env()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_ignores_foreign_objects_and_remove_misses_on_s3() {
    list_and_remove(s3_env()).await;
}

/// Every call against `tier` answers Unavailable, within `bound`.
async fn all_unavailable(tier: &RemoteTier, bound: Duration) {
    let key = BlockHash(1);
    let (data, sums) = block(key);
    let guard = Duration::from_secs(60);
    let start = Instant::now();
    let r = tokio::time::timeout(
        guard,
        tier.put_batch(&[BlockPut {
            key,
            data: &data,
            sums: &sums,
            pinned: None,
        }]),
    )
    .await
    .expect("put hung");
    assert!(matches!(r[0], Err(RemoteError::Unavailable(_))), "{r:?}");
    let r = tokio::time::timeout(guard, tier.get_batch(&[key, BlockHash(2)]))
        .await
        .expect("get hung");
    assert!(
        r.iter()
            .all(|r| matches!(r, RemoteRead::Failed(RemoteError::Unavailable(_)))),
        "{r:?}"
    );
    let r = tokio::time::timeout(guard, tier.read_layers(&[key], 1..2))
        .await
        .expect("read_layers hung");
    assert!(
        matches!(r[0], RemoteRead::Failed(RemoteError::Unavailable(_))),
        "{r:?}"
    );
    let r = tokio::time::timeout(guard, tier.remove_batch(&[key]))
        .await
        .expect("remove hung");
    assert!(matches!(r[0], Err(RemoteError::Unavailable(_))), "{r:?}");
    let r = tokio::time::timeout(guard, tier.list())
        .await
        .expect("list hung");
    assert!(matches!(r, Err(RemoteError::Unavailable(_))), "{r:?}");
    // Six bounded calls (the read_layers failure also asks HEAD).
    assert!(
        start.elapsed() <= bound * 7,
        "took {:?} for a {bound:?} bound",
        start.elapsed()
    );
    let s = tier.stats();
    assert_eq!((s.errors, s.gets, s.misses, s.corrupt), (6, 0, 0, 0));
}

fn s3_config(port: u16, timeout_ms: u64) -> RemoteConfig {
    RemoteConfig {
        url: "s3://kvremote/cache".into(),
        endpoint: Some(format!("http://127.0.0.1:{port}")),
        access_key_id: Some("testing".into()),
        secret_access_key: Some("testing".into()),
        allow_http: true,
        timeout_ms,
        ..RemoteConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_endpoint_fails_within_the_timeout() {
    let cfg = s3_config(free_port(), 1_000);
    let tier = RemoteTier::open(&cfg, geometry()).unwrap();
    all_unavailable(&tier, cfg.timeout()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_answers_times_out() {
    // Accepts connections and reads, but never answers.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming().flatten() {
            held.push(s);
        }
    });
    let cfg = s3_config(port, 500);
    let tier = RemoteTier::open(&cfg, geometry()).unwrap();
    all_unavailable(&tier, cfg.timeout()).await;
}

#[tokio::test]
async fn a_header_for_another_geometry_is_corrupt() {
    let env = file_env();
    let key = BlockHash(5);
    env.put(&[key]).await;
    // A well-formed object for a block with 2 layers of 2 KiB.
    let (data, _) = block(key);
    let sums = BlockSums::compute(key, 2 * LAYER_BYTES, &data);
    let mut obj = Header::new(key, &Geometry::raw(2, BLOCK_BYTES as u64).unwrap(), sums).encode();
    obj.extend_from_slice(&data);
    env.raw
        .put(&env.tier.object_path(key), obj.into())
        .await
        .unwrap();
    assert_corrupt(&env.get(key).await, "other geometry");
}

#[test]
fn open_refuses_bad_urls() {
    for url in ["", "s3://", "file://relative", "gs://bucket/x"] {
        let cfg = RemoteConfig {
            url: url.into(),
            ..RemoteConfig::default()
        };
        let r = RemoteTier::open(&cfg, geometry());
        assert!(matches!(r, Err(RemoteError::BadUrl { .. })), "{url}: {r:?}");
    }
}
