//! Baselines the store is compared against, measured in the same run on the
//! same directory: a plain io_uring loop (written here against the
//! `io-uring` crate directly, not through kvtier's engine, so it shares none
//! of our code), fio when it is installed, and single-thread memcpy.

use anyhow::{Context, Result, bail};
use io_uring::{IoUring, opcode, types};
use rand::{Rng, SeedableRng, rngs::StdRng};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use super::measure::{Latencies, Run, process_cpu_time};
use kvtier_io::AlignedBuf;

/// What memory the I/O buffers of both sides are (`--huge-pages`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pages {
    /// Ordinary 4 KiB pages.
    Ordinary,
    /// Transparent huge pages (2 MiB).
    Huge,
}

impl Pages {
    /// `Huge` when `huge`.
    pub fn from_flag(huge: bool) -> Self {
        match huge {
            true => Pages::Huge,
            false => Pages::Ordinary,
        }
    }

    /// A zeroed I/O buffer of at least `len` bytes, 4 KiB-aligned: whole
    /// huge pages, or exactly `len` bytes of ordinary pages.
    pub fn buf(self, len: usize) -> AlignedBuf {
        match self {
            Pages::Huge => AlignedBuf::zeroed_huge(len),
            Pages::Ordinary => AlignedBuf::zeroed(len, 4096),
        }
    }
}

/// A file the raw loop runs on: the file, its size, and the memory of the
/// loop's buffers.
#[derive(Clone, Copy)]
pub struct RawFile<'a> {
    /// Opened for direct I/O.
    pub file: &'a File,
    /// Bytes the loop may touch, from offset 0.
    pub size: u64,
    /// What the loop's buffers are.
    pub pages: Pages,
}

/// The header write of [`Pattern::SeqWriteHeadered`], the disk tier's slot
/// header size.
const HEADER_BYTES: u64 = 4096;

/// Access pattern of a raw I/O baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// Sequential writes from offset 0, wrapping at the file's end.
    SeqWrite,
    /// Sequential writes, each object preceded by a write of a 4 KiB
    /// header right before it (`HEADER_BYTES + object` per object), as the
    /// disk tier writes block-major slots: the same ops as the tier's, so
    /// what the tier adds beyond its header op shows apart.
    SeqWriteHeadered,
    /// Reads at uniformly random aligned offsets.
    RandRead,
}

/// Opens (creating, preallocating and prefilling) `path` for direct I/O.
/// The prefill matters: the disk tier prefills its data file, and a first
/// write into a preallocated extent is slower than an overwrite, so both
/// sides must start from written files.
pub fn open_direct_file(path: &Path, size: u64) -> Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .with_context(|| format!("open {}", path.display()))?;
    // SAFETY: fallocate on a valid fd with valid arguments.
    let rc = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, size as libc::off_t) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        bail!("fallocate {} bytes on {}: {e}", size, path.display());
    }
    kvtier_io::prefill(&f, path, size, &mut |_, _| {})?;
    Ok(f)
}

/// Opens an existing file read-only for direct I/O.
pub fn open_direct_read(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .with_context(|| format!("open {}", path.display()))
}

/// Name of the raw io_uring baseline for `pattern`.
pub fn uring_name(pattern: Pattern) -> String {
    format!("raw io_uring O_DIRECT registered buffers, {pattern:?}")
}

/// Runs `ops` operations of `object_bytes` on `raw` keeping `qd` ops in
/// flight (a headered object takes two), with registered buffers, and
/// returns its totals (bytes: the objects', headers not counted).
/// Sequential writes start at operation `first_op` (so rounds continue
/// where the previous one stopped).
pub fn uring(
    raw: &RawFile<'_>,
    object_bytes: u64,
    qd: u32,
    ops: u64,
    pattern: Pattern,
    first_op: u64,
) -> Result<Run> {
    let qd = qd.max(1);
    // Buffers are declared before the ring so that on any early return the
    // ring (and with it every in-flight operation) is torn down first.
    let mut bufs: Vec<AlignedBuf> = (0..qd)
        .map(|i| {
            let mut b = raw.pages.buf(object_bytes as usize);
            b.fill(i as u8 ^ 0x5a);
            b
        })
        .collect();
    let iov: Vec<libc::iovec> = bufs
        .iter_mut()
        .map(|b| libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.len(),
        })
        .collect();
    let mut ring =
        IoUring::new(qd.next_power_of_two()).context("io_uring_setup for the baseline")?;
    // SAFETY: the buffers outlive the ring (declared before it, dropped after).
    let fixed = unsafe { ring.submitter().register_buffers(&iov) }.is_ok();
    let headered = pattern == Pattern::SeqWriteHeadered;
    // Bytes per object on disk, and ops per object.
    let (stride, ops_per_object) = match headered {
        true => (HEADER_BYTES + object_bytes, 2),
        false => (object_bytes, 1),
    };
    let slots = raw.size / stride;
    if slots == 0 {
        bail!("file smaller than one object");
    }
    let mut rng = StdRng::seed_from_u64(7 + first_op);
    let fd = types::Fd(raw.file.as_raw_fd());
    let mut started = vec![Instant::now(); qd as usize];
    // Ops in flight per buffer: it is free again at zero.
    let mut pending = vec![0u32; qd as usize];
    let mut lat = Latencies::default();
    let (mut submitted, mut done, mut seq) = (0u64, 0u64, first_op);
    let mut in_flight = 0u32;
    let mut free: Vec<u32> = (0..qd).collect();
    let cpu0 = process_cpu_time();
    let t0 = Instant::now();
    while done < ops {
        // At most `qd` ops in flight, as kvtier's engine allows.
        while submitted < ops && in_flight + ops_per_object <= qd {
            let Some(slot) = free.pop() else { break };
            let offset = match pattern {
                Pattern::SeqWrite | Pattern::SeqWriteHeadered => {
                    let o = (seq % slots) * stride;
                    seq += 1;
                    o
                }
                Pattern::RandRead => rng.random_range(0..slots) * object_bytes,
            };
            let ptr = bufs[slot as usize].as_mut_ptr();
            let mut entries = Vec::with_capacity(2);
            if headered {
                // The header's bytes: the buffer's first 4 KiB (content is
                // irrelevant to the device).
                entries.push((
                    rw_entry(true, fixed, fd, ptr, HEADER_BYTES, slot, offset),
                    true,
                ));
            }
            let data_at = offset + (stride - object_bytes);
            let write = pattern != Pattern::RandRead;
            entries.push((
                rw_entry(write, fixed, fd, ptr, object_bytes, slot, data_at),
                false,
            ));
            started[slot as usize] = Instant::now();
            pending[slot as usize] = ops_per_object;
            in_flight += ops_per_object;
            for (entry, is_header) in entries {
                let tag = slot as u64 | (u64::from(is_header) << 32);
                // SAFETY: the buffer stays alive and untouched until its CQEs.
                unsafe { ring.submission().push(&entry.user_data(tag)) }
                    .map_err(|_| anyhow::anyhow!("submission queue full"))?;
            }
            submitted += 1;
        }
        ring.submit_and_wait(1).context("io_uring_enter")?;
        for cqe in ring.completion() {
            let slot = cqe.user_data() as u32;
            let want = match cqe.user_data() >> 32 {
                0 => object_bytes,
                _ => HEADER_BYTES,
            };
            if cqe.result() != want as i32 {
                bail!("baseline I/O failed: result {}", cqe.result());
            }
            in_flight -= 1;
            pending[slot as usize] -= 1;
            if pending[slot as usize] == 0 {
                lat.push(started[slot as usize].elapsed());
                free.push(slot);
                done += 1;
            }
        }
    }
    let wall = t0.elapsed();
    let cpu = process_cpu_time() - cpu0;
    drop(ring); // the ring goes before the buffers it may reference
    drop(bufs);
    if !fixed {
        eprintln!(
            "warning: the baseline could not register its buffers (memlock limit?); it used plain I/O"
        );
    }
    Ok(Run {
        bytes: ops * object_bytes,
        ops,
        wall,
        cpu,
        lat,
    })
}

/// One read or write of `len` bytes at `offset` into or from `ptr`, the
/// buffer registered at index `slot` (used as such when `fixed`).
fn rw_entry(
    write: bool,
    fixed: bool,
    fd: types::Fd,
    ptr: *mut u8,
    len: u64,
    slot: u32,
    offset: u64,
) -> io_uring::squeue::Entry {
    let len = len as u32;
    match (write, fixed) {
        (true, true) => opcode::WriteFixed::new(fd, ptr, len, slot as u16)
            .offset(offset)
            .build(),
        (true, false) => opcode::Write::new(fd, ptr, len).offset(offset).build(),
        (false, true) => opcode::ReadFixed::new(fd, ptr, len, slot as u16)
            .offset(offset)
            .build(),
        (false, false) => opcode::Read::new(fd, ptr, len).offset(offset).build(),
    }
}

/// Direction of a memcpy baseline, matching the tier operation it is the
/// baseline of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyPattern {
    /// One hot source buffer into slots cycling through a pool (as a put).
    Scatter,
    /// Slots picked across a pool into one destination buffer (as a get).
    Gather,
}

/// Single-thread memcpy of `object_bytes` blocks between one buffer and a
/// pool, in the order the tier benchmark uses: the DRAM baseline. The pool
/// is allocated (and touched) once, then measured in rounds.
pub struct Memcpy {
    object_bytes: usize,
    slots: usize,
    pool: AlignedBuf,
    one: AlignedBuf,
}

impl Memcpy {
    /// A pool of `pool_bytes` (at least one object), every page touched.
    pub fn new(object_bytes: usize, pool_bytes: usize) -> Self {
        let slots = (pool_bytes / object_bytes).max(1);
        let mut pool = AlignedBuf::zeroed(slots * object_bytes, 4096);
        for (i, b) in pool.iter_mut().enumerate() {
            *b = (i * 131 + 7) as u8;
        }
        let mut one = AlignedBuf::zeroed(object_bytes, 4096);
        one.fill(3);
        Memcpy {
            object_bytes,
            slots,
            pool,
            one,
        }
    }

    /// What [`run`](Self::run) measures for `pattern`.
    pub fn name(pattern: CopyPattern) -> &'static str {
        match pattern {
            CopyPattern::Scatter => "memcpy (single thread, one buffer into a pool)",
            CopyPattern::Gather => "memcpy (single thread, a pool into one buffer)",
        }
    }

    /// Copies `ops` objects in `pattern`, operations `first..first + ops`
    /// of the pattern's sequence (so rounds continue where the last one
    /// stopped).
    pub fn run(&mut self, ops: u64, pattern: CopyPattern, first: u64) -> Run {
        let (size, n) = (self.object_bytes, self.slots);
        let mut lat = Latencies::default();
        let cpu0 = process_cpu_time();
        let t0 = Instant::now();
        for i in first as usize..(first + ops) as usize {
            let t = Instant::now();
            match pattern {
                CopyPattern::Scatter => {
                    let d = i % n * size;
                    self.pool[d..d + size].copy_from_slice(&self.one);
                }
                CopyPattern::Gather => {
                    let s = (i * 7919) % n * size;
                    self.one.copy_from_slice(&self.pool[s..s + size]);
                }
            }
            lat.push(t.elapsed());
        }
        std::hint::black_box((&self.pool, &self.one));
        Run {
            bytes: ops * size as u64,
            ops,
            wall: t0.elapsed(),
            cpu: process_cpu_time() - cpu0,
            lat,
        }
    }
}

/// fio's figures for one pattern.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct FioResult {
    /// Bandwidth, MB/s (10^6 B).
    pub mb_s: f64,
    /// fio's CPU (user + system) per I/O, microseconds.
    pub cpu_us_per_io: f64,
}

/// Runs fio for the same pattern if it is installed; `None` when it is not
/// (or fails), so the benchmark still runs on a bare machine.
///
/// fio moves `io_bytes`, the same bytes as the other sides of a round, and
/// draws random offsets with replacement like them. (Run for a fixed time
/// over a small file, it read the file several times over per round and
/// the host's cache under this VM's virtual disk served it the later
/// passes: 2 MiB reads came out 1.6x faster than a raw loop reading a
/// sixth of the file.)
pub fn fio(
    path: &Path,
    file_size: u64,
    object_bytes: u64,
    qd: u32,
    pattern: Pattern,
    io_bytes: u64,
) -> Option<FioResult> {
    let rw = match pattern {
        Pattern::SeqWrite => "write",
        Pattern::RandRead => "randread",
        // fio has no header-beside-each-object pattern.
        Pattern::SeqWriteHeadered => return None,
    };
    let out = Command::new("fio")
        .args([
            "--name=kvtier-baseline",
            &format!("--filename={}", path.display()),
            &format!("--size={file_size}"),
            &format!("--bs={object_bytes}"),
            &format!("--iodepth={qd}"),
            &format!("--rw={rw}"),
            "--direct=1",
            "--ioengine=io_uring",
            "--fixedbufs=1",
            &format!("--io_size={}", io_bytes.max(object_bytes)),
            "--norandommap=1",
            "--randrepeat=0",
            "--output-format=json",
        ])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let job = &v["jobs"][0];
    let side = if pattern == Pattern::SeqWrite {
        "write"
    } else {
        "read"
    };
    // fio reports bw_bytes in bytes per second, CPU as percentages of the
    // job's runtime (milliseconds).
    let mb_s = job[side]["bw_bytes"].as_f64()? / 1e6;
    let ios = job[side]["total_ios"].as_f64().unwrap_or(0.0);
    let cpu_pct = job["usr_cpu"].as_f64().unwrap_or(0.0) + job["sys_cpu"].as_f64().unwrap_or(0.0);
    let runtime_us = job["job_runtime"].as_f64().unwrap_or(0.0) * 1000.0;
    let cpu_us_per_io = if ios > 0.0 {
        cpu_pct / 100.0 * runtime_us / ios
    } else {
        0.0
    };
    Some(FioResult {
        mb_s,
        cpu_us_per_io,
    })
}
