//! Blocks read over real loopback TCP: byte-exact, whole and by layer
//! range, in order, and verified (a corrupt copy is a miss).

mod common;

use std::sync::Arc;

use common::*;
use kvtier_core::BlockHash;
use kvtier_peer::{Expect, LayerRange, MemorySource, PeerClient, ReadStats, Want};

fn trusted(n: u8) -> Want {
    Want {
        key: BlockHash(n as u128),
        expect: Expect::Checksum(sums(n).block),
    }
}

/// A source holding blocks `0..count`.
fn source_of(count: u8) -> Arc<MemorySource> {
    let source = Arc::new(MemorySource::new());
    for n in 0..count {
        source.insert(BlockHash(n as u128), LAYER, block_bytes(n));
    }
    source
}

async fn client(addr: std::net::SocketAddr) -> PeerClient {
    let within = std::time::Duration::from_secs(30);
    PeerClient::connect(addr, &client_id(), within)
        .await
        .unwrap()
}

#[tokio::test]
async fn whole_blocks_round_trip_byte_exact_in_order() {
    let server = start(source_of(20)).await;
    let mut c = client(server.local_addr()).await;
    assert_eq!(c.peer_node(), "a");
    // More keys than the server asks its source for at once, and a miss.
    let mut wants: Vec<Want> = (0..20).rev().map(trusted).collect();
    wants.insert(5, trusted(200));
    let got = c.read(&wants, LayerRange::All, later()).await.unwrap();
    assert_eq!(got.len(), wants.len());
    for (want, block) in wants.iter().zip(&got) {
        let n = want.key.0 as u8;
        if n == 200 {
            assert!(block.is_none());
            continue;
        }
        let block = block.as_ref().expect("a held block is found");
        assert_eq!(block.bytes, block_bytes(n));
        assert_eq!(block.sums, sums(n));
    }
    let stats = ReadStats {
        found: 20,
        missing: 1,
        corrupt: 0,
    };
    assert_eq!(c.stats(), stats);
    // The connection serves the next request too.
    let again = c
        .read(&[trusted(3)], LayerRange::All, later())
        .await
        .unwrap();
    assert_eq!(again[0].as_ref().unwrap().bytes, block_bytes(3));
    // The server counted what it sent (this runtime has one thread: its
    // count follows its write before the reader runs).
    let s = server.stats().snapshot();
    let bytes: usize = (0..20).chain([3]).map(|n| block_bytes(n).len()).sum();
    assert_eq!((s.accepted, s.authenticated, s.reads), (1, 1, 2));
    assert_eq!((s.blocks_sent, s.blocks_missing), (21, 1));
    assert_eq!(s.bytes_sent, bytes as u64);
    assert_eq!(s.open, 1);
    // Shut down with the client still connected: its connection is closed,
    // and counted so.
    let stats = server.stats();
    server.shutdown().await;
    assert_eq!(stats.snapshot().open, 0);
}

#[tokio::test]
async fn every_layer_range_round_trips_byte_exact() {
    let server = start(source_of(2)).await;
    let mut c = client(server.local_addr()).await;
    for start in 0..LAYERS as u32 {
        for end in start + 1..=LAYERS as u32 {
            let range = LayerRange::Span { start, end };
            let got = c
                .read(&[trusted(1), trusted(0)], range, later())
                .await
                .unwrap();
            let bytes = &got[0].as_ref().unwrap().bytes;
            assert_eq!(*bytes, layers_of(1, start, end), "{start}..{end}");
            assert!(got[1].is_some());
        }
    }
    // A range past the block's layers is a miss, not an error.
    let past = LayerRange::Span {
        start: 2,
        end: LAYERS as u32 + 1,
    };
    let got = c.read(&[trusted(1)], past, later()).await.unwrap();
    assert!(got[0].is_none());
    server.shutdown().await;
}

#[tokio::test]
async fn a_corrupt_or_substituted_block_is_a_miss() {
    let source = source_of(3);
    // Block 1's copy rotted: its stored sums, other bytes.
    let mut rotten = block_bytes(1);
    rotten[LAYER as usize + 17] ^= 0x40;
    source.insert_with_sums(BlockHash(1), LAYER, rotten, sums(1));
    // Block 2 holds a self-consistent block that is not the one trusted.
    source.insert(BlockHash(2), LAYER, block_bytes(9));
    let server = start(source).await;
    let mut c = client(server.local_addr()).await;

    let wants = [trusted(0), trusted(1), trusted(2)];
    let got = c.read(&wants, LayerRange::All, later()).await.unwrap();
    assert!(got[0].is_some());
    assert!(got[1].is_none(), "rotten bytes are never returned");
    assert!(
        got[2].is_none(),
        "the trusted checksum rules out another block"
    );
    // A range holding the rotten layer is a miss; one without it is fine.
    let layer1 = LayerRange::Span { start: 1, end: 2 };
    assert!(c.read(&[trusted(1)], layer1, later()).await.unwrap()[0].is_none());
    let layer3 = LayerRange::Span { start: 3, end: 4 };
    assert!(c.read(&[trusted(1)], layer3, later()).await.unwrap()[0].is_some());
    assert_eq!(c.stats().corrupt, 3);
    server.shutdown().await;
}

#[tokio::test]
async fn many_clients_read_at_once() {
    let server = start(source_of(8)).await;
    let addr = server.local_addr();
    let readers = (0..8u8).map(|n| {
        tokio::spawn(async move {
            let mut c = client(addr).await;
            let got = c
                .read(&[trusted(n)], LayerRange::All, later())
                .await
                .unwrap();
            got[0].as_ref().map(|b| b.bytes == block_bytes(n))
        })
    });
    for r in readers.collect::<Vec<_>>() {
        assert_eq!(r.await.unwrap(), Some(true));
    }
    server.shutdown().await;
}

/// The bytes of layers `start..end` of test block `n`.
fn layers_of(n: u8, start: u32, end: u32) -> Vec<u8> {
    let whole = block_bytes(n);
    let to = ((end * LAYER) as usize).min(whole.len());
    whole[(start * LAYER) as usize..to].to_vec()
}

#[tokio::test]
async fn blocks_land_in_the_callers_buffers_verified() {
    let source = source_of(12);
    let mut rotten = block_bytes(4);
    rotten[3] ^= 1;
    source.insert_with_sums(BlockHash(4), LAYER, rotten, sums(4));
    let server = start(source).await;
    let mut c = client(server.local_addr()).await;

    // Whole blocks, one of them rotten, one the peer lacks, one target of
    // the wrong length: each lands or is a miss.
    let wants: Vec<Want> = [0, 4, 200, 7, 11].into_iter().map(trusted).collect();
    let mut buffers: Vec<Vec<u8>> = vec![vec![0; block_bytes(0).len()]; wants.len()];
    buffers[3].pop();
    let mut targets: Vec<&mut [u8]> = buffers.iter_mut().map(|b| b.as_mut_slice()).collect();
    let got = c
        .read_into(&wants, LayerRange::All, &mut targets, later())
        .await
        .unwrap();
    assert_eq!(got[0], Some(sums(0)));
    assert_eq!(buffers[0], block_bytes(0));
    assert_eq!(got[1], None, "rotten");
    assert_eq!(got[2], None, "absent");
    assert_eq!(got[3], None, "wrong length");
    assert_eq!(got[4], Some(sums(11)));
    assert_eq!(buffers[4], block_bytes(11));
    assert_eq!(
        c.stats(),
        ReadStats {
            found: 2,
            missing: 1,
            corrupt: 2
        }
    );

    // A layer range lands as those layers' bytes, on the same connection.
    let range = LayerRange::Span {
        start: 2,
        end: LAYERS as u32,
    };
    let mut buffer = vec![0; layers_of(9, 2, LAYERS as u32).len()];
    let got = c
        .read_into(&[trusted(9)], range, &mut [&mut buffer[..]], later())
        .await
        .unwrap();
    assert_eq!(got[0], Some(sums(9)));
    assert_eq!(buffer, layers_of(9, 2, LAYERS as u32));
    server.shutdown().await;
}
