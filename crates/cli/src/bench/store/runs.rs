//! The run-layer read case: one layer of a run of blocks on adjacent slots
//! per request, as a prefix hit loads blocks that one offload round wrote
//! together (docs/design/layer-stripe.md, step 4).
//!
//! Runs are cut from where the tier put the written blocks
//! ([`DiskTier::location`]), so the case measures what the layout makes of
//! co-written blocks: in block-major regions a run's layer is one read per
//! block; the layer-major layout's aim is one read per run. Two baselines
//! run in each round: the raw loop reading objects of a run's layer size
//! (the device's speed at that size, and fio beside it), and the raw loop
//! reading single layers for the same bytes (what per-block layer reads
//! could reach at best).

use std::sync::Arc;

use anyhow::{Result, bail};
use kvtier_core::{BlockHash, Geometry};
use kvtier_disk::DiskTier;
use kvtier_disk::index::Loc;

use super::{Pick, ReadBench, ReadTargets, WRITERS, baseline, batch_of};
use crate::bench::baseline::Pattern;
use crate::bench::measure::Case;

/// Cuts `keys` into runs of `k` blocks on adjacent slots of one region, in
/// slot order. Blocks left over at a region's end or next to a gap are left
/// out.
pub(super) fn cut_runs(tier: &DiskTier, keys: &[BlockHash], k: usize) -> Vec<Vec<BlockHash>> {
    let placed = keys
        .iter()
        .filter_map(|key| tier.location(*key).map(|loc| (loc, *key)))
        .collect();
    runs_of(placed, k)
}

/// [`cut_runs`] over blocks and where they are.
fn runs_of(mut placed: Vec<(Loc, BlockHash)>, k: usize) -> Vec<Vec<BlockHash>> {
    placed.sort_by_key(|(loc, _)| (loc.dir, loc.region, loc.slot));
    let k = k.max(1);
    let mut runs = Vec::new();
    let mut run: Vec<BlockHash> = Vec::with_capacity(k);
    let mut last: Option<Loc> = None;
    for (loc, key) in placed {
        let adjacent = last
            .is_some_and(|p| p.dir == loc.dir && p.region == loc.region && p.slot + 1 == loc.slot);
        if !adjacent {
            run.clear();
        }
        run.push(key);
        last = Some(loc);
        if run.len() == k {
            runs.push(std::mem::replace(&mut run, Vec::with_capacity(k)));
        }
    }
    runs
}

/// The run-layer cases of one geometry: `disk_read_run_layer_<label>`
/// against the raw loop reading a run's layer bytes at once (and fio), and
/// `disk_read_run_layer_<label>_vs_layer` against the raw loop reading one
/// layer per op. `layer_ops` layers are read per round, as in the layer
/// case.
pub(super) async fn run_layer_cases(
    bench: &ReadBench<'_>,
    written: &[BlockHash],
    geometry: Geometry,
    label: &str,
    run_blocks: usize,
    layer_ops: u64,
) -> Result<Vec<Case>> {
    let runs = cut_runs(bench.tier, written, run_blocks);
    if runs.is_empty() {
        bail!("the disk tier holds no {run_blocks} written blocks on adjacent slots");
    }
    let layer = geometry.layer_bytes();
    let per_batch = batch_of(bench.qd);
    let ops = (layer_ops / run_blocks as u64).max((WRITERS * per_batch) as u64);
    let count = per_batch * run_blocks;
    let mut targets = ReadTargets::new(bench.engine, layer as usize, count, bench.raw.pages);
    let pick = Pick::RunLayers(Arc::new(runs), geometry.layers);
    let (against_runs, against_layers) = bench.rounds(&pick, &mut targets, ops, true).await?;
    let what = format!(
        "disk tier read_layers of one layer of {run_blocks} adjacent blocks, verified \
         ({WRITERS} concurrent batches of {per_batch} runs)"
    );
    let raw = baseline::uring_name(Pattern::RandRead);
    Ok(vec![
        against_runs.case(
            &format!("disk_read_run_layer_{label}"),
            layer * run_blocks as u64,
            bench.qd,
            format!("{raw}, {run_blocks} layers' bytes per read"),
            what.clone(),
        ),
        against_layers.case(
            &format!("disk_read_run_layer_{label}_vs_layer"),
            layer * run_blocks as u64,
            bench.qd,
            format!("{raw}, one layer per read"),
            what,
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(dir: u8, region: u32, slot: u32) -> (Loc, BlockHash) {
        let key = BlockHash(((dir as u128) << 64) | ((region as u128) << 32) | slot as u128);
        (Loc { dir, region, slot }, key)
    }

    #[test]
    fn runs_are_adjacent_slots_of_one_region_in_slot_order() {
        // Region 0: slots 0..5 then a gap; region 1: slots 0..3; dir 1
        // continues region 1's numbering but is another file.
        let mut placed: Vec<_> = (0..5).map(|s| at(0, 0, s)).collect();
        placed.extend((6..8).map(|s| at(0, 0, s)));
        placed.extend((0..3).map(|s| at(0, 1, s)));
        placed.push(at(1, 1, 3));
        placed.reverse();
        let runs = runs_of(placed, 2);
        let want: Vec<Vec<BlockHash>> = [
            [at(0, 0, 0), at(0, 0, 1)],
            [at(0, 0, 2), at(0, 0, 3)],
            [at(0, 0, 6), at(0, 0, 7)],
            [at(0, 1, 0), at(0, 1, 1)],
        ]
        .iter()
        .map(|r| r.iter().map(|(_, k)| *k).collect())
        .collect();
        assert_eq!(runs, want);
    }
}
