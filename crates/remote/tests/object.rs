//! ObjectBlocks: one block object at a path chosen outside the crate,
//! under a key given per call, on a real S3 server (moto; fails when moto
//! is not installed) and a local directory. Reads verify exactly as the
//! tier's; a corrupt object is a miss and is never deleted.

use bytes::Bytes;
use kvtier_core::{BlockHash, BlockSums, Geometry};
use kvtier_remote::test_support::{MotoServer, file_config};
use kvtier_remote::{ObjectBlocks, RemoteError, RemoteRead};
use kvtier_tier::BlockPut;
use object_store::ObjectStore;

const LAYERS: u32 = 4;
const LAYER_BYTES: usize = 512;

fn geometry() -> Geometry {
    Geometry::raw(LAYERS, (LAYERS as usize * LAYER_BYTES) as u64).unwrap()
}

fn block(key: BlockHash) -> (Vec<u8>, BlockSums) {
    let data: Vec<u8> = (0..LAYERS as usize * LAYER_BYTES)
        .map(|i| (i as u64 ^ key.fold64()) as u8)
        .collect();
    let sums = BlockSums::compute(key, LAYER_BYTES, &data);
    (data, sums)
}

/// Puts, reads back, refuses the wrong key, a flipped byte and bad bytes,
/// and keeps the corrupt object in place.
async fn scenario(blocks: &ObjectBlocks, raw: &dyn ObjectStore) {
    let url = blocks.url().to_owned();
    let uri = format!("{url}/inst/0000000000000007-01/block");
    let path = blocks.path_of(&uri).expect("a URI under the store");
    let key = BlockHash(0x77 << 64 | 7);
    let (data, sums) = block(key);
    let put = BlockPut {
        key,
        data: &data,
        sums: &sums,
        pinned: None,
    };
    assert!(matches!(blocks.get(&path, key).await, RemoteRead::Miss));
    blocks.put(&path, &put).await.unwrap();
    match blocks.get(&path, key).await {
        RemoteRead::Hit { bytes, sums: got } => {
            assert_eq!(&bytes[..], &data[..]);
            assert_eq!(got, sums);
        }
        other => panic!("not a hit: {other:?}"),
    }
    // The header names another key: another namespace's object.
    assert!(matches!(
        blocks.get(&path, BlockHash(8)).await,
        RemoteRead::Corrupt
    ));
    // Bytes that do not match their sums are never written.
    let mut bad = data.clone();
    bad[3] ^= 1;
    let refused = BlockPut { data: &bad, ..put };
    assert!(matches!(
        blocks.put(&path, &refused).await,
        Err(RemoteError::Corrupt)
    ));
    // A byte flipped in the store: a miss, and the object stays.
    let mut object = raw
        .get(&path)
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
        .to_vec();
    let last = object.len() - 1;
    object[last] ^= 0x40;
    raw.put(&path, Bytes::from(object).into()).await.unwrap();
    assert!(matches!(blocks.get(&path, key).await, RemoteRead::Corrupt));
    assert!(raw.head(&path).await.is_ok(), "a read never deletes");
    // URIs of another store or escaping the prefix name nothing.
    for foreign in [
        "s3://elsewhere/x/inst/k/block".to_owned(),
        format!("{url}/inst/../../x"),
        format!("{url}/inst//block"),
        format!("{url}/inst/k/block?offset=0"),
        format!("{url}/"),
        format!("{url}x/inst/k/block"),
    ] {
        assert_eq!(blocks.path_of(&foreign), None, "{foreign}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_round_trip_verified_on_s3() {
    let moto = MotoServer::start();
    moto.create_bucket("shared");
    let blocks = ObjectBlocks::open(&moto.config("shared", "g4"), geometry()).unwrap();
    assert_eq!(blocks.url(), "s3://shared/g4");
    scenario(&blocks, moto.store("shared").as_ref()).await;
}

#[tokio::test]
async fn objects_round_trip_verified_in_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let blocks = ObjectBlocks::open(&file_config(dir.path()), geometry()).unwrap();
    let raw = object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap();
    scenario(&blocks, &raw).await;
}
