//! [`HostDevice`] and [`GatedDevice`]: allocation, copies of whole blocks
//! and single layers, per-copy errors, gated completions.

use std::sync::Arc;
use std::time::Duration;

use kvtier_core::Geometry;
use kvtier_manager::device::{
    CopyDirection, Device, DeviceBlockId, DeviceError, Download, GatedDevice, HostDevice,
    HostDeviceOptions, HostSink, HostSource, Span, Upload,
};

fn geometry() -> Geometry {
    Geometry::raw(4, 16 << 10).expect("geometry")
}

fn up(dst: DeviceBlockId, bytes: Vec<u8>) -> Upload<Box<dyn HostSource>> {
    Upload {
        dst,
        src: Box::new(bytes),
    }
}

fn down(src: DeviceBlockId, len: usize) -> Download<Box<dyn HostSink>> {
    Download {
        src,
        dst: Box::new(vec![0u8; len]),
    }
}

fn bytes_of(sink: Box<dyn HostSink>) -> Vec<u8> {
    let any: Box<dyn std::any::Any> = sink;
    *any.downcast::<Vec<u8>>().expect("a Vec<u8> sink")
}

#[test]
fn allocation_is_all_or_nothing_and_released_blocks_return() {
    let d = HostDevice::new(geometry(), 4, HostDeviceOptions::default());
    let a = d.allocate(3).expect("3 of 4");
    assert_eq!(d.free_blocks(), 1);
    assert_eq!(
        d.allocate(2),
        Err(DeviceError::OutOfMemory { wanted: 2, free: 1 })
    );
    assert_eq!(d.free_blocks(), 1);
    d.release(&a[..2]);
    d.release(&a[..1]); // twice: ignored
    assert_eq!(d.free_blocks(), 3);
    let b = d.allocate(3).expect("3 again");
    let mut all: Vec<u32> = b.iter().chain(&a[2..]).map(|i| i.0).collect();
    all.sort();
    assert_eq!(all, vec![0, 1, 2, 3], "ids are distinct");
}

#[tokio::test]
async fn whole_blocks_and_layers_round_trip() {
    let g = geometry();
    let len = g.block_bytes() as usize;
    let lb = g.layer_bytes() as usize;
    let d = HostDevice::new(g, 4, HostDeviceOptions::default());
    let ids = d.allocate(2).expect("blocks");
    let a: Vec<u8> = (0..len).map(|i| (i * 3) as u8).collect();
    let b: Vec<u8> = (0..len).map(|i| (i * 5 + 1) as u8).collect();
    let done = d
        .upload(
            Span::Block,
            vec![up(ids[0], a.clone()), up(ids[1], b.clone())],
        )
        .await
        .expect("completion");
    assert!(done.iter().all(|(_, r)| r.is_ok()));
    // Overwrite layer 2 of both blocks in one batch.
    let l2 = vec![0xEEu8; lb];
    let done = d
        .upload(
            Span::Layer(2),
            vec![up(ids[0], l2.clone()), up(ids[1], l2.clone())],
        )
        .await
        .expect("completion");
    assert!(done.iter().all(|(_, r)| r.is_ok()));
    let out = d
        .download(Span::Block, vec![down(ids[0], len), down(ids[1], len)])
        .await
        .expect("completion");
    let mut expect_a = a.clone();
    expect_a[2 * lb..3 * lb].copy_from_slice(&l2);
    let mut expect_b = b.clone();
    expect_b[2 * lb..3 * lb].copy_from_slice(&l2);
    let got: Vec<Vec<u8>> = out
        .into_iter()
        .map(|(s, r)| {
            r.expect("copy");
            bytes_of(s)
        })
        .collect();
    assert!(got[0] == expect_a && got[1] == expect_b);
    // One layer back.
    let out = d
        .download(Span::Layer(1), vec![down(ids[1], lb)])
        .await
        .expect("completion");
    let (sink, r) = out.into_iter().next().expect("one copy");
    r.expect("copy");
    assert!(bytes_of(sink) == b[lb..2 * lb]);
}

#[tokio::test]
async fn bad_copies_fail_alone() {
    let g = geometry();
    let len = g.block_bytes() as usize;
    let d = HostDevice::new(g, 4, HostDeviceOptions::default());
    let ids = d.allocate(1).expect("block");
    let out = d
        .upload(
            Span::Block,
            vec![
                up(ids[0], vec![1u8; len]),
                up(DeviceBlockId(3), vec![1u8; len]),
                up(ids[0], vec![1u8; 10]),
            ],
        )
        .await
        .expect("completion");
    assert_eq!(out[0].1, Ok(()));
    assert_eq!(out[1].1, Err(DeviceError::NotAllocated(DeviceBlockId(3))));
    assert!(matches!(out[2].1, Err(DeviceError::LengthMismatch { .. })));
    let out = d
        .upload(Span::Layer(9), vec![up(ids[0], vec![1u8; 10])])
        .await
        .expect("completion");
    assert_eq!(out[0].1, Err(DeviceError::BadSpan(Span::Layer(9))));
    assert_eq!(Span::Layer(9).range(&g), None);
}

/// Injected latency only delays the completion; the bytes are the same.
#[tokio::test]
async fn injected_latency_completes_with_the_same_bytes() {
    let g = geometry();
    let len = g.block_bytes() as usize;
    let d = HostDevice::new(
        g,
        1,
        HostDeviceOptions {
            latency: Duration::from_micros(200),
            bandwidth_bytes_per_sec: Some(10 << 30),
        },
    );
    let id = d.allocate(1).expect("block")[0];
    let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
    let out = d
        .upload(Span::Block, vec![up(id, data.clone())])
        .await
        .expect("completion");
    assert_eq!(out[0].1, Ok(()));
    assert_eq!(d.read_block(id).expect("block"), data);
}

/// A gated device holds completions until released, logs batches in
/// order, and passes through what it does not hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gated_device_holds_until_released() {
    let g = geometry();
    let len = g.block_bytes() as usize;
    let host: Arc<dyn Device> = Arc::new(HostDevice::new(g, 4, HostDeviceOptions::default()));
    let d = GatedDevice::new(host);
    let ids = d.allocate(2).expect("blocks");
    d.hold(CopyDirection::Upload, true);
    let pending = d.upload(Span::Block, vec![up(ids[0], vec![7u8; len])]);
    assert_eq!(d.held(), 1);
    // Downloads are not held.
    let out = d
        .download(Span::Block, vec![down(ids[1], len)])
        .await
        .expect("completion");
    assert_eq!(out[0].1, Ok(()));
    let ev = d.release_next(CopyDirection::Upload).await;
    assert_eq!(ev.blocks, vec![ids[0]]);
    assert_eq!(pending.await.expect("completion")[0].1, Ok(()));
    assert_eq!(d.held(), 0);
    let log: Vec<CopyDirection> = d.log().iter().map(|e| e.direction).collect();
    assert_eq!(log, vec![CopyDirection::Upload, CopyDirection::Download]);
}
