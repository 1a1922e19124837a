//! [`LoadHandle`]: a layer-wise load, awaited layer by layer, with bubble
//! accounting.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use kvtier_core::BlockHash;

use super::io::SchedInner;
use crate::transfer::{BlockResult, completion::CompletionCell};

/// The blocks of one layer of a load, with their results.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerOutcome {
    /// The layer.
    pub layer: u32,
    /// Every block of the load with its result for this layer, in order.
    pub blocks: Vec<(BlockHash, BlockResult)>,
}

impl LayerOutcome {
    /// Whether this layer of every block is resident.
    pub fn all_delivered(&self) -> bool {
        self.blocks.iter().all(|(_, r)| r.is_ok())
    }

    /// Blocks whose layer did not arrive (recompute them).
    pub fn failed(&self) -> Vec<BlockHash> {
        self.blocks
            .iter()
            .filter(|(_, r)| r.is_err())
            .map(|(k, _)| *k)
            .collect()
    }
}

/// A load of many blocks into G2, one read batch per layer, issued
/// in layer order. [`wait_layer`](Self::wait_layer) resolves as soon as
/// layer `l` of every block is resident, so the consumer computes layer
/// `l` while layer `l + 1` is read.
///
/// While the handle lives a forward pass is in progress: offload writes
/// run only inside compute windows. Drop it (or call
/// [`finish`](Self::finish)) when the pass is over.
pub struct LoadHandle {
    pub(crate) keys: Arc<[BlockHash]>,
    pub(crate) layers: Vec<Arc<CompletionCell>>,
    pub(crate) sched: Arc<SchedInner>,
}

impl std::fmt::Debug for LoadHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadHandle")
            .field("blocks", &self.keys.len())
            .field("layers", &self.layers.len())
            .finish()
    }
}

impl LoadHandle {
    /// The blocks, in request order.
    pub fn keys(&self) -> &[BlockHash] {
        &self.keys
    }

    /// Layers of the load.
    pub fn layers(&self) -> u32 {
        self.layers.len() as u32
    }

    /// Whether layer `layer` of every block has completed (delivered or
    /// failed).
    pub fn is_layer_ready(&self, layer: u32) -> bool {
        self.layers.get(layer as usize).is_some_and(|c| c.is_done())
    }

    /// Waits until layer `layer` of every block is resident (or failed).
    /// Time spent waiting here is the consumer's bubble, added to the
    /// scheduler's stats; when the wait resolves, layer `layer` is taken to
    /// start computing (a compute window opens for deferred writes until
    /// [`IoScheduler::record_layer_compute`](super::IoScheduler::record_layer_compute)).
    /// A layer past the end resolves at once with no blocks.
    pub fn wait_layer(&self, layer: u32) -> LayerWait {
        let cell = self.layers.get(layer as usize).cloned();
        let start = self.sched.clock.now();
        let ready_at_start = cell.as_ref().is_none_or(|c| c.is_done());
        LayerWait {
            cell,
            layer,
            keys: self.keys.clone(),
            start,
            ready_at_start,
            sched: self.sched.clone(),
        }
    }

    /// Waits for every layer without counting bubble time (tools, tests).
    pub async fn wait_all(&self) -> Vec<LayerOutcome> {
        let mut out = Vec::with_capacity(self.layers.len());
        for (l, cell) in self.layers.iter().enumerate() {
            let results = crate::transfer::completion::WaitAll::new(cell.clone()).await;
            out.push(LayerOutcome {
                layer: l as u32,
                blocks: self.keys.iter().copied().zip(results).collect(),
            });
        }
        out
    }

    /// Ends the forward pass now (same as dropping the handle).
    pub fn finish(self) {}
}

impl Drop for LoadHandle {
    fn drop(&mut self) {
        self.sched.end_forward();
    }
}

/// The future of [`LoadHandle::wait_layer`].
pub struct LayerWait {
    cell: Option<Arc<CompletionCell>>,
    layer: u32,
    keys: Arc<[BlockHash]>,
    start: Duration,
    ready_at_start: bool,
    sched: Arc<SchedInner>,
}

impl Future for LayerWait {
    type Output = LayerOutcome;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<LayerOutcome> {
        let this = self.get_mut();
        let Some(cell) = &this.cell else {
            return Poll::Ready(LayerOutcome {
                layer: this.layer,
                blocks: Vec::new(),
            });
        };
        match cell.poll_all(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(results) => {
                let bubble = if this.ready_at_start {
                    Duration::ZERO
                } else {
                    this.sched.clock.now().saturating_sub(this.start)
                };
                this.sched.layer_consumed(this.layer, bubble);
                Poll::Ready(LayerOutcome {
                    layer: this.layer,
                    blocks: this.keys.iter().copied().zip(results).collect(),
                })
            }
        }
    }
}
