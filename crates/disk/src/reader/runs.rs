//! Layer-major reads: slots next to each other read one layer per op.
//!
//! The layer-major requests of a pass are sorted by place; slots adjacent
//! in one region life form a run (up to [`max_run_slots`]). Layer `l >= 1`
//! of a run's slots is one contiguous range of the region's row `l` (I14),
//! read with one vectored op whose segments are the slots' landings. Row 0
//! interleaves each slot's header with its layer-0 piece, so a run's
//! layer-0 op also reads the headers, into a buffer of the run: every
//! slot's layer sums arrive with its first layer, without another I/O
//! (design/layer-stripe.md 4.2). A slot alone (or any slot, when runs are
//! off) is read piece by piece with plain ops, and its header, when needed,
//! with one of its own.
//!
//! A failed op of a run fails no block by itself: its slots are read again
//! alone (`Outcome::Retry`), so each slot's outcome rests on its own bytes
//! (I17). Nothing here needs a vectored op to succeed: one that cannot be
//! planned sends its slots to the retry too.

use std::ops::Range;

use kvtier_io::{AlignedBuf, FileId, IoBatch, IoKind, IoOp};

use super::{HeaderAt, Plan, Planned};
use crate::format::{Layout, RegionLayout};
use crate::index::Loc;
use crate::stats::add;
use crate::tier::Shared;

/// Most bytes one run op reads. Large enough that a run's layer costs one
/// op for 64 KiB layers of up to 60 blocks, small enough not to hold the
/// device for long.
const MAX_RUN_BYTES: u64 = 4 << 20;

/// Plans the reads of the layer-major requests of `planned` (those with a
/// landing), layers `range`; `want_headers`: layer reads, which need the
/// slots' layer sums when they are not cached.
pub(super) fn plan<T>(
    shared: &Shared,
    plan: &mut Plan,
    planned: &mut [Planned<T>],
    (range, want_headers): (&Range<u32>, bool),
    runs: bool,
) {
    // (index into `planned`, landing address) of the layer-major requests.
    let mut idx: Vec<(usize, usize)> = (0..planned.len())
        .filter_map(|i| planned[i].landing.map(|at| (i, at)))
        .collect();
    idx.sort_by_key(|&(i, _)| {
        let loc = planned[i].check.entry.loc;
        (loc.dir, loc.region, loc.slot)
    });
    let max = if runs {
        max_run_slots(&shared.layout)
    } else {
        1
    };
    let mut start = 0;
    while start < idx.len() {
        let mut end = start + 1;
        while end < idx.len()
            && end - start < max
            && next_to(
                planned[idx[end - 1].0].check.entry.loc,
                planned[idx[end].0].check.entry.loc,
            )
        {
            end += 1;
        }
        let run = &idx[start..end];
        match run {
            [(one, at)] => plan_alone(shared, plan, (&mut planned[*one], *at), range, want_headers),
            _ => plan_run(shared, plan, planned, run, range, want_headers),
        }
        start = end;
    }
}

/// Whether slot `b` directly follows slot `a` in one region life.
fn next_to(a: Loc, b: Loc) -> bool {
    a.dir == b.dir && a.region == b.region && a.slot + 1 == b.slot
}

/// Slots per run: layer 0 takes two segments per slot (header, piece), and
/// an op reads at most [`MAX_RUN_BYTES`].
pub(crate) fn max_run_slots(l: &Layout) -> usize {
    let per_slot = l.slot_header_bytes + l.layer_bytes;
    ((MAX_RUN_BYTES / per_slot) as usize).clamp(1, IoBatch::MAX_SEGMENTS / 2)
}

/// One slot alone (its plan, its landing address): a plain read per
/// piece, and its header on its own.
fn plan_alone<T>(
    shared: &Shared,
    plan: &mut Plan,
    (p, landing): (&mut Planned<T>, usize),
    range: &Range<u32>,
    want_headers: bool,
) {
    let l = &shared.layout;
    let loc = p.check.entry.loc;
    let file = shared.dirs[loc.dir as usize].file;
    let first_op = plan.batch.len();
    for layer in range.clone() {
        let op = IoOp {
            kind: IoKind::Read,
            file,
            offset: l.piece_offset(RegionLayout::Layer, loc.region, layer, loc.slot),
            buf: (landing + piece_at(l, range, layer)) as *mut u8,
            len: l.layer_bytes as u32,
        };
        // SAFETY: the piece lies inside the landing (sized to the layers
        // read), which the batch owns (`land`) until the reads end.
        unsafe { plan.batch.push(op) };
    }
    p.data_ops = plan.data_ops(first_op..plan.batch.len());
    add(&shared.stats.layer_pieces, range.len() as u64);
    if want_headers && p.check.cached_sums.is_none() {
        let at = l.header_offset(RegionLayout::Layer, loc.region, loc.slot);
        p.check.header = Some(plan.read_header(shared, file, at));
    }
}

/// Offset of layer `layer`'s piece in a landing of layers `range`.
fn piece_at(l: &Layout, range: &Range<u32>, layer: u32) -> usize {
    (layer - range.start) as usize * l.layer_bytes as usize
}

/// Slots `run` ((index into `planned`, landing address), adjacent slots in
/// slot order): one vectored op per layer, layer 0's bringing the headers.
fn plan_run<T>(
    shared: &Shared,
    plan: &mut Plan,
    planned: &mut [Planned<T>],
    run: &[(usize, usize)],
    range: &Range<u32>,
    want_headers: bool,
) {
    let l = &shared.layout;
    let first = planned[run[0].0].check.entry.loc;
    let file = shared.dirs[first.dir as usize].file;
    let mut ops = Vec::with_capacity(range.len());
    let mut all_planned = true;
    for layer in range.clone() {
        let planned_op = match layer {
            0 => row0(shared, plan, planned, run, file),
            _ => row(shared, plan, planned, run, file, (range, layer)),
        };
        // An op that could not be planned leaves the slots unplanned: their
        // read counts as failed, and they are retried alone.
        all_planned &= planned_op.is_some();
        ops.extend(planned_op.map(|(op, _)| op));
        if let (Some((_, Some(buf))), true) = (planned_op, want_headers) {
            let h = l.slot_header_bytes as usize;
            for (k, &(i, _)) in run.iter().enumerate() {
                if planned[i].check.cached_sums.is_none() {
                    planned[i].check.header = Some(HeaderAt::Run { buf, at: k * h });
                }
            }
        }
    }
    let data_ops = plan.data_ops(ops);
    for &(i, _) in run {
        planned[i].data_ops = data_ops.clone();
        planned[i].in_run = true;
        planned[i].planned = all_planned;
    }
    if !range.contains(&0) && want_headers {
        for &(i, _) in run {
            if planned[i].check.cached_sums.is_none() {
                let loc = planned[i].check.entry.loc;
                let at = l.header_offset(RegionLayout::Layer, loc.region, loc.slot);
                planned[i].check.header = Some(plan.read_header(shared, file, at));
            }
        }
    }
    add(&shared.stats.read_runs, range.len() as u64);
    add(&shared.stats.layer_pieces, (range.len() * run.len()) as u64);
}

/// Layer `layer >= 1` of a run: one contiguous range of row `layer`.
/// Returns the op's index, `None` if it could not be planned.
fn row<T>(
    shared: &Shared,
    plan: &mut Plan,
    planned: &mut [Planned<T>],
    run: &[(usize, usize)],
    file: FileId,
    (range, layer): (&Range<u32>, u32),
) -> Option<(usize, Option<usize>)> {
    let l = &shared.layout;
    let first = planned[run[0].0].check.entry.loc;
    let at = piece_at(l, range, layer);
    let segments = run
        .iter()
        .map(|&(_, landing)| ((landing + at) as *mut u8, l.layer_bytes as usize));
    let offset = l.piece_offset(RegionLayout::Layer, first.region, layer, first.slot);
    push_readv(shared, plan, file, offset, segments).map(|op| (op, None))
}

/// Layer 0 of a run: each slot's header, into a buffer of the run, then
/// its piece, for all slots in one op. Returns the op and the header
/// buffer's index in the pass's header buffers.
fn row0<T>(
    shared: &Shared,
    plan: &mut Plan,
    planned: &mut [Planned<T>],
    run: &[(usize, usize)],
    file: FileId,
) -> Option<(usize, Option<usize>)> {
    let l = &shared.layout;
    let h = l.slot_header_bytes as usize;
    let first = planned[run[0].0].check.entry.loc;
    let mut headers = AlignedBuf::zeroed(run.len() * h, shared.align.mem.max(4096));
    let base = headers.as_mut_ptr();
    let segments = run.iter().enumerate().flat_map(|(k, &(_, landing))| {
        let landing = landing as *mut u8;
        [
            (base.wrapping_add(k * h), h),
            (landing, l.layer_bytes as usize),
        ]
    });
    let offset = l.header_offset(RegionLayout::Layer, first.region, first.slot);
    let op = push_readv(shared, plan, file, offset, segments)?;
    plan.batch.keep_alive(headers);
    let owner = plan.owner();
    plan.header_bufs.push(owner);
    Some((op, Some(plan.header_bufs.len() - 1)))
}

/// Adds a vectored read; `None` (logged) if the engine's checks refuse it,
/// which the layout rules out (whole sectors, aligned landings, segments
/// and bytes bounded by [`max_run_slots`]).
fn push_readv(
    shared: &Shared,
    plan: &mut Plan,
    file: FileId,
    offset: u64,
    segments: impl Iterator<Item = (*mut u8, usize)>,
) -> Option<usize> {
    let op = plan.batch.len();
    // SAFETY: every segment is a header buffer the caller gives the batch
    // right after, or a piece inside a landing the batch owns (`land`),
    // until the reads end; segments do not overlap.
    let pushed = unsafe {
        plan.batch
            .push_vectored(IoKind::ReadV, file, offset, segments, Some(shared.align))
    };
    match pushed {
        Ok(()) => Some(op),
        Err(e) => {
            tracing::error!(error = %e, offset, "a run read could not be planned; its slots are read alone");
            None
        }
    }
}
