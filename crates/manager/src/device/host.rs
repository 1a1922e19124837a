//! [`HostDevice`]: a [`Device`] whose "device memory" is host memory.

use std::time::Duration;

use kvtier_core::Geometry;
use parking_lot::{Mutex, RwLock};

use super::{
    CopyCompletion, CopyResults, Device, DeviceBlockId, DeviceError, Download, HostSink,
    HostSource, Span, Upload,
};

/// Knobs of a [`HostDevice`]. The delays exist for experiments (what does
/// the scheduler do with a slow device); tests never rely on them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostDeviceOptions {
    /// Fixed time added to every batch before it completes. Default: zero.
    pub latency: Duration,
    /// Simulated link bandwidth in bytes per second; a batch completes no
    /// sooner than `bytes / bandwidth` after submission. Default: `None`
    /// (as fast as `memcpy`).
    pub bandwidth_bytes_per_sec: Option<u64>,
}

impl HostDeviceOptions {
    fn delay(&self, bytes: u64) -> Duration {
        let link = match self.bandwidth_bytes_per_sec {
            Some(bw) if bw > 0 => Duration::from_secs_f64(bytes as f64 / bw as f64),
            _ => Duration::ZERO,
        };
        self.latency + link
    }
}

/// A pool of block buffers in host memory with real `memcpy` copies: the
/// G1 stand-in for tests, CI and machines without a GPU.
///
/// Each block sits behind its own lock so copies to different blocks run in
/// parallel and a copy never observes a half-written block of another copy.
pub struct HostDevice {
    geometry: Geometry,
    blocks: Vec<RwLock<Box<[u8]>>>,
    /// `allocated[i]`: whether block `i` is handed out; the free list is the
    /// complement, kept explicitly so allocation is O(n) in blocks asked.
    pool: Mutex<Pool>,
    options: HostDeviceOptions,
}

struct Pool {
    allocated: Vec<bool>,
    free: Vec<u32>,
}

impl HostDevice {
    /// A device of `capacity_blocks` zeroed blocks of `geometry`.
    pub fn new(geometry: Geometry, capacity_blocks: usize, options: HostDeviceOptions) -> Self {
        let len = geometry.block_bytes() as usize;
        let blocks = (0..capacity_blocks)
            .map(|_| RwLock::new(vec![0u8; len].into_boxed_slice()))
            .collect();
        let free = (0..capacity_blocks as u32).rev().collect();
        Self {
            geometry,
            blocks,
            pool: Mutex::new(Pool {
                allocated: vec![false; capacity_blocks],
                free,
            }),
            options,
        }
    }

    /// A copy of an allocated block's bytes (for tests and tools; a real
    /// device would download).
    pub fn read_block(&self, id: DeviceBlockId) -> Result<Vec<u8>, DeviceError> {
        self.check(id)?;
        let block = self
            .blocks
            .get(id.0 as usize)
            .ok_or(DeviceError::NotAllocated(id))?;
        Ok(block.read().to_vec())
    }

    fn check(&self, id: DeviceBlockId) -> Result<(), DeviceError> {
        let pool = self.pool.lock();
        match pool.allocated.get(id.0 as usize) {
            Some(true) => Ok(()),
            _ => Err(DeviceError::NotAllocated(id)),
        }
    }

    fn copy_in(&self, span: Span, dst: DeviceBlockId, src: &[u8]) -> Result<(), DeviceError> {
        let range = span
            .range(&self.geometry)
            .ok_or(DeviceError::BadSpan(span))?;
        let want = range.end - range.start;
        if src.len() as u64 != want {
            return Err(DeviceError::LengthMismatch {
                want,
                got: src.len(),
            });
        }
        self.check(dst)?;
        let block = self
            .blocks
            .get(dst.0 as usize)
            .ok_or(DeviceError::NotAllocated(dst))?;
        block.write()[range.start as usize..range.end as usize].copy_from_slice(src);
        Ok(())
    }

    fn copy_out(&self, span: Span, src: DeviceBlockId, dst: &mut [u8]) -> Result<(), DeviceError> {
        let range = span
            .range(&self.geometry)
            .ok_or(DeviceError::BadSpan(span))?;
        let want = range.end - range.start;
        if dst.len() as u64 != want {
            return Err(DeviceError::LengthMismatch {
                want,
                got: dst.len(),
            });
        }
        self.check(src)?;
        let block = self
            .blocks
            .get(src.0 as usize)
            .ok_or(DeviceError::NotAllocated(src))?;
        dst.copy_from_slice(&block.read()[range.start as usize..range.end as usize]);
        Ok(())
    }

    /// Completes `results` now, or after the configured delay on a helper
    /// thread (the bytes are already copied; only the completion waits).
    fn finish<S: Send + 'static>(&self, results: CopyResults<S>, bytes: u64) -> CopyCompletion<S> {
        let delay = self.options.delay(bytes);
        if delay.is_zero() {
            return CopyCompletion::ready(results);
        }
        let (completer, completion) = CopyCompletion::pair();
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            completer.complete(results);
        });
        completion
    }
}

impl Device for HostDevice {
    fn name(&self) -> &str {
        "host"
    }

    fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    fn capacity_blocks(&self) -> usize {
        self.blocks.len()
    }

    fn free_blocks(&self) -> usize {
        self.pool.lock().free.len()
    }

    fn allocate(&self, n: usize) -> Result<Vec<DeviceBlockId>, DeviceError> {
        let mut pool = self.pool.lock();
        if pool.free.len() < n {
            return Err(DeviceError::OutOfMemory {
                wanted: n,
                free: pool.free.len(),
            });
        }
        let at = pool.free.len() - n;
        let ids: Vec<u32> = pool.free.split_off(at);
        for &i in &ids {
            pool.allocated[i as usize] = true;
        }
        Ok(ids.into_iter().rev().map(DeviceBlockId).collect())
    }

    fn release(&self, blocks: &[DeviceBlockId]) {
        let mut pool = self.pool.lock();
        for id in blocks {
            if let Some(slot) = pool.allocated.get_mut(id.0 as usize)
                && *slot
            {
                *slot = false;
                pool.free.push(id.0);
            }
        }
    }

    fn upload(
        &self,
        span: Span,
        copies: Vec<Upload<Box<dyn HostSource>>>,
    ) -> CopyCompletion<Box<dyn HostSource>> {
        let mut bytes = 0u64;
        let results = copies
            .into_iter()
            .map(|c| {
                let r = self.copy_in(span, c.dst, c.src.host_bytes());
                if r.is_ok() {
                    bytes += c.src.host_bytes().len() as u64;
                }
                (c.src, r)
            })
            .collect();
        self.finish(results, bytes)
    }

    fn download(
        &self,
        span: Span,
        copies: Vec<Download<Box<dyn HostSink>>>,
    ) -> CopyCompletion<Box<dyn HostSink>> {
        let mut bytes = 0u64;
        let results = copies
            .into_iter()
            .map(|mut c| {
                let r = self.copy_out(span, c.src, c.dst.host_bytes_mut());
                if r.is_ok() {
                    bytes += c.dst.host_bytes_mut().len() as u64;
                }
                (c.dst, r)
            })
            .collect();
        self.finish(results, bytes)
    }
}
