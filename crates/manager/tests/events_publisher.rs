//! The event publisher and the in-process sinks: batching by count, by age
//! (on Tokio's paused clock) and on demand, ordering, fan-out, close, and
//! full or slow sinks that drop and count instead of blocking.

use std::sync::Arc;
use std::time::Duration;

use kvtier_core::{BlockHash, TierKind};
use kvtier_manager::Tier;
use kvtier_manager::events::{
    BatchTransport, BlockRemoved, BlockStored, ChannelSink, EventBatch, EventError, EventPublisher,
    EventSink, KvEvent, Overflow, PublisherConfig, QueueConfig, QueuedSink,
};
use proptest::prelude::*;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// A distinct event per `n`, so order and loss are visible.
fn event(n: u64) -> KvEvent {
    match n % 3 {
        0 => KvEvent::Stored(BlockStored {
            block_hashes: vec![BlockHash(u128::from(n))],
            parent_hash: None,
            tier: Tier::G2,
            kind: TierKind::Memory,
            bytes: 4096,
            location: None,
            token_ids: None,
            block_size: 16,
        }),
        1 => KvEvent::Removed(BlockRemoved {
            block_hashes: vec![BlockHash(u128::from(n))],
            tier: Tier::G3,
            kind: TierKind::Disk,
        }),
        _ => KvEvent::Removed(BlockRemoved {
            block_hashes: vec![BlockHash(u128::from(n)), BlockHash(u128::from(n) << 64)],
            tier: Tier::G1,
            kind: TierKind::Device,
        }),
    }
}

fn config(max_batch_events: usize, max_batch_delay: Duration) -> PublisherConfig {
    PublisherConfig {
        max_batch_events,
        max_batch_delay,
    }
}

const NEVER: Duration = Duration::from_secs(3600);

#[tokio::test(start_paused = true)]
async fn batches_are_cut_by_count_in_order() {
    let (sink, mut rx) = ChannelSink::new(16);
    let publisher = EventPublisher::new(config(3, NEVER), vec![Arc::new(sink)]).unwrap();
    for n in 0..7 {
        publisher.emit(event(n));
    }
    let first = rx.try_recv().expect("first full batch");
    let second = rx.try_recv().expect("second full batch");
    assert!(rx.try_recv().is_err(), "the seventh event waits");
    assert_eq!((first.seq, second.seq), (0, 1));
    assert_eq!(first.events, (0..3).map(event).collect::<Vec<_>>());
    assert_eq!(second.events, (3..6).map(event).collect::<Vec<_>>());
    assert_eq!(publisher.pending_events(), 1);

    publisher.flush();
    let third = rx.try_recv().expect("flushed batch");
    assert_eq!((third.seq, third.events.clone()), (2, vec![event(6)]));
    publisher.flush();
    assert!(rx.try_recv().is_err(), "flushing nothing cuts no batch");
    assert_eq!(publisher.next_seq(), 3);
}

#[tokio::test(start_paused = true)]
async fn batches_are_cut_by_age_on_the_paused_clock() {
    let delay = Duration::from_millis(50);
    let (sink, mut rx) = ChannelSink::new(16);
    let publisher = EventPublisher::new(config(100, delay), vec![Arc::new(sink)]).unwrap();
    let start = Instant::now();
    publisher.emit(event(0));
    publisher.emit(event(1));

    tokio::time::advance(Duration::from_millis(49)).await;
    tokio::task::yield_now().await;
    assert!(rx.try_recv().is_err(), "cut before the batch was due");

    // The paused clock jumps to the timer's deadline once all tasks idle.
    let batch = rx.recv().await.expect("batch cut by age");
    assert_eq!(batch.events, vec![event(0), event(1)]);
    assert_eq!(Instant::now() - start, delay);
}

#[tokio::test(start_paused = true)]
async fn the_age_limit_counts_from_the_first_event_of_each_batch() {
    let delay = Duration::from_millis(50);
    let (sink, mut rx) = ChannelSink::new(16);
    let publisher = EventPublisher::new(config(100, delay), vec![Arc::new(sink)]).unwrap();
    let start = Instant::now();
    publisher.emit(event(0));
    tokio::time::advance(Duration::from_millis(30)).await;
    publisher.flush();
    assert_eq!(rx.recv().await.unwrap().seq, 0);

    // A batch opened at t = 30 ms is due at 80 ms, not at the 50 ms the
    // first batch's timer was set for.
    publisher.emit(event(1));
    let batch = rx.recv().await.expect("second batch");
    assert_eq!((batch.seq, batch.events.clone()), (1, vec![event(1)]));
    assert_eq!(Instant::now() - start, Duration::from_millis(80));
}

#[tokio::test(start_paused = true)]
async fn every_sink_gets_every_batch() {
    let (a, mut rx_a) = ChannelSink::new(16);
    let (b, mut rx_b) = ChannelSink::new(16);
    let publisher = EventPublisher::new(config(2, NEVER), vec![Arc::new(a), Arc::new(b)]).unwrap();
    for n in 0..6 {
        publisher.emit(event(n));
    }
    for seq in 0..3 {
        let (x, y) = (rx_a.try_recv().unwrap(), rx_b.try_recv().unwrap());
        assert_eq!(x.seq, seq);
        assert_eq!(x, y);
    }
    for sink in publisher.sinks() {
        assert_eq!(sink.counts().delivered, 3);
    }
}

#[tokio::test(start_paused = true)]
async fn close_and_drop_flush_and_end_the_stream() {
    let (sink, mut rx) = ChannelSink::new(16);
    let sink = Arc::new(sink);
    let publisher = EventPublisher::new(config(100, NEVER), vec![sink.clone()]).unwrap();
    publisher.emit(event(0));
    publisher.emit(event(1));
    publisher.close();
    publisher.emit(event(2));
    assert_eq!(publisher.dropped_after_close(), 1);
    let batch = rx.recv().await.expect("flushed on close");
    assert_eq!(batch.events, vec![event(0), event(1)]);
    assert!(rx.recv().await.is_none(), "close ends the channel");

    let (sink, mut rx) = ChannelSink::new(16);
    let publisher = EventPublisher::new(config(100, NEVER), vec![Arc::new(sink)]).unwrap();
    publisher.emit(event(5));
    drop(publisher);
    assert_eq!(rx.recv().await.unwrap().events, vec![event(5)]);
    assert!(rx.recv().await.is_none());
}

#[test]
fn a_publisher_outside_a_runtime_is_an_error() {
    let (sink, _rx) = ChannelSink::new(1);
    let result = EventPublisher::new(PublisherConfig::default(), vec![Arc::new(sink)]);
    assert!(matches!(result, Err(EventError::NoRuntime { .. })));
}

#[tokio::test(start_paused = true)]
async fn a_full_channel_drops_and_counts() {
    let (sink, mut rx) = ChannelSink::new(2);
    let sink = Arc::new(sink);
    let publisher = EventPublisher::new(config(1, NEVER), vec![sink.clone()]).unwrap();
    // Nobody reads: emitting must still return at once.
    for n in 0..5 {
        publisher.emit(event(n));
    }
    let counts = sink.counts();
    assert_eq!((counts.delivered, counts.dropped), (2, 3));
    assert_eq!(rx.try_recv().unwrap().seq, 0);
    assert_eq!(rx.try_recv().unwrap().seq, 1);
    assert!(rx.try_recv().is_err());
    // Room again: the next batch goes through and keeps its seq, so the
    // consumer sees the gap 1 -> 5.
    publisher.emit(event(5));
    assert_eq!(rx.try_recv().unwrap().seq, 5);
}

/// A transport that reports each batch it starts, then waits for the test
/// to open the gate: a consumer that is stuck.
struct GatedTransport {
    started: mpsc::UnboundedSender<u64>,
    gate: Option<oneshot::Receiver<()>>,
    delivered: mpsc::UnboundedSender<u64>,
}

impl BatchTransport for GatedTransport {
    async fn send(&mut self, batch: &EventBatch) -> Result<(), EventError> {
        let _ = self.started.send(batch.seq);
        if let Some(gate) = self.gate.take() {
            let _ = gate.await;
        }
        let _ = self.delivered.send(batch.seq);
        Ok(())
    }
}

/// Publishes batch 0, waits until the worker is stuck sending it, publishes
/// `1..=extra + capacity` and returns the seqs delivered once unstuck.
async fn stuck_sink_delivers(overflow: Overflow, capacity: usize, extra: u64) -> (Vec<u64>, u64) {
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let (delivered_tx, mut delivered) = mpsc::unbounded_channel();
    let (open, gate) = oneshot::channel();
    let transport = GatedTransport {
        started: started_tx,
        gate: Some(gate),
        delivered: delivered_tx,
    };
    let sink = Arc::new(
        QueuedSink::spawn("gated", transport, QueueConfig { capacity, overflow }).unwrap(),
    );
    let publisher = EventPublisher::new(config(1, NEVER), vec![sink.clone()]).unwrap();
    publisher.emit(event(0));
    assert_eq!(started.recv().await, Some(0), "worker took batch 0");
    for n in 1..=(capacity as u64 + extra) {
        publisher.emit(event(n));
    }
    assert_eq!(sink.queued(), capacity);
    let dropped = sink.counts().dropped;
    open.send(()).unwrap();
    publisher.close();
    sink.close_and_wait().await;
    let mut seqs = Vec::new();
    while let Ok(seq) = delivered.try_recv() {
        seqs.push(seq);
    }
    assert_eq!(sink.counts().delivered, seqs.len() as u64);
    (seqs, dropped)
}

#[tokio::test(start_paused = true)]
async fn a_stuck_sink_drops_the_oldest_and_counts() {
    let (seqs, dropped) = stuck_sink_delivers(Overflow::DropOldest, 4, 3).await;
    assert_eq!(dropped, 3);
    assert_eq!(seqs, vec![0, 4, 5, 6, 7]);
}

#[tokio::test(start_paused = true)]
async fn a_stuck_sink_drops_the_newest_and_counts() {
    let (seqs, dropped) = stuck_sink_delivers(Overflow::DropNewest, 4, 3).await;
    assert_eq!(dropped, 3);
    assert_eq!(seqs, vec![0, 1, 2, 3, 4]);
}

/// A transport that always fails: every batch is counted as an error and the
/// worker carries on.
struct FailingTransport;

impl BatchTransport for FailingTransport {
    async fn send(&mut self, _batch: &EventBatch) -> Result<(), EventError> {
        Err(EventError::Encode {
            format: "test",
            message: "refused".into(),
        })
    }
}

#[tokio::test(start_paused = true)]
async fn transport_errors_are_counted_and_do_not_stop_the_sink() {
    let sink =
        Arc::new(QueuedSink::spawn("failing", FailingTransport, QueueConfig::default()).unwrap());
    let publisher = EventPublisher::new(config(1, NEVER), vec![sink.clone()]).unwrap();
    for n in 0..4 {
        publisher.emit(event(n));
    }
    publisher.close();
    sink.close_and_wait().await;
    let counts = sink.counts();
    assert_eq!((counts.delivered, counts.errors, counts.dropped), (0, 4, 0));
}

#[test]
fn concurrent_emitters_see_batches_in_seq_order_with_nothing_lost() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    let (sink, mut rx) = ChannelSink::new(100_000);
    let publisher = {
        let _guard = runtime.enter();
        Arc::new(EventPublisher::new(config(7, NEVER), vec![Arc::new(sink)]).unwrap())
    };
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let publisher = Arc::clone(&publisher);
            std::thread::spawn(move || {
                for n in 0..500 {
                    publisher.emit(event(t * 1000 + n));
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    publisher.close();
    let mut expected_seq = 0;
    let mut per_thread_last = [None::<u64>; 4];
    let mut total = 0;
    while let Ok(batch) = rx.try_recv() {
        assert_eq!(batch.seq, expected_seq);
        expected_seq += 1;
        for event in &batch.events {
            let id = match event {
                KvEvent::Stored(s) => s.block_hashes[0].0 as u64,
                KvEvent::Removed(r) => r.block_hashes[0].0 as u64,
                KvEvent::AllCleared { .. } => unreachable!(),
            };
            // Each thread's events arrive in the order it emitted them.
            let slot = &mut per_thread_last[(id / 1000) as usize];
            assert!(slot.is_none_or(|last| last < id));
            *slot = Some(id);
            total += 1;
        }
    }
    assert_eq!(total, 2000);
}

proptest! {
    /// Whatever mix of emits and flushes, the batches concatenate to the
    /// emitted events, none exceeds the count limit, and seqs have no gaps.
    #[test]
    fn batches_partition_the_event_stream(
        ops in proptest::collection::vec(prop_oneof![4 => Just(None), 1 => Just(Some(()))], 0..200),
        max in 1usize..10,
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let _guard = runtime.enter();
        let (sink, mut rx) = ChannelSink::new(1000);
        let publisher = EventPublisher::new(config(max, NEVER), vec![Arc::new(sink)]).unwrap();
        let mut emitted = Vec::new();
        for (n, op) in ops.iter().enumerate() {
            match op {
                None => {
                    publisher.emit(event(n as u64));
                    emitted.push(event(n as u64));
                }
                Some(()) => publisher.flush(),
            }
        }
        publisher.close();
        let mut seen = Vec::new();
        let mut seq = 0;
        while let Ok(batch) = rx.try_recv() {
            prop_assert_eq!(batch.seq, seq);
            prop_assert!(!batch.events.is_empty() && batch.events.len() <= max);
            seq += 1;
            seen.extend(batch.events.iter().cloned());
        }
        prop_assert_eq!(seen, emitted);
    }
}
