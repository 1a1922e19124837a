//! Region layouts and format versions: where layer-major lives put their
//! bytes, how a v1 directory becomes v2, and why bytes a client stored in
//! one life cannot pass for a slot header of a life of the other layout.

use std::path::Path;

use kvtier_core::{BlockHash, BlockSums, Lookup};
use kvtier_disk::format::{
    FORMAT_VERSION, FORMAT_VERSION_2, LifeFormat, REGION_HEADER_BYTES, RegionHeader, SlotHeader,
    SlotSeal,
};
use kvtier_disk::meta::{META_FILE, Meta};
use kvtier_disk::{DiskTier, RegionLayout};
use kvtier_tier::BlockPut;

use crate::both_engines;
use crate::common::*;

both_engines!(
    layer_major_pieces_lie_in_their_rows,
    a_layer_major_extent_of_copied_blocks_is_one_run_per_row,
    layer_reads_trust_only_a_header_of_this_place_and_life,
    a_v1_directory_opened_with_layer_keeps_its_blocks_and_becomes_v2,
    a_v1_directory_opened_with_block_stays_v1,
    a_header_forged_in_block_data_is_not_recovered_by_a_life_of_the_other_layout,
);

/// The meta file of `dir`.
fn meta(dir: &Path) -> Meta {
    let p = dir.join(META_FILE);
    Meta::decode(&std::fs::read(&p).expect("meta file"), &p, dir).expect("meta")
}

/// The decoded header of region `r`.
fn region_header(tier: &DiskTier, r: u32) -> RegionHeader {
    let path = tier.data_file(0).expect("data file");
    let at = tier.layout().region_offset(r);
    RegionHeader::decode(&peek(&path, at, REGION_HEADER_BYTES as usize)).expect("region header")
}

fn open(d: &[std::path::PathBuf], kind: Kind, layout: RegionLayout) -> DiskTier {
    let mut cfg = config(d.to_vec(), 8 * REGION);
    cfg.layout = layout;
    DiskTier::open(cfg, kind.engine()).expect("open")
}

async fn layer_major_pieces_lie_in_their_rows(kind: Kind) {
    let (_t, d) = dirs(1);
    let g = geometry();
    let tier = DiskTier::open(config(d.clone(), 4 * REGION), kind.engine()).unwrap();
    let blocks = Blocks::range(&g, 80, 0..70);
    // Uneven batches: extents of 1, 7 and more slots extend the same rows.
    put_all(&tier, &blocks, 7).await;
    put_all(&tier, &Blocks::range(&g, 81, 0..1), 1).await;
    let k = layout();
    let lb = g.layer_bytes() as usize;
    let path = tier.data_file(0).unwrap();
    let creation_id = meta(&d[0]).creation_id;
    for (i, key) in blocks.keys.iter().enumerate() {
        let loc = tier.location(*key).unwrap();
        let h = peek(
            &path,
            header_offset(&tier, loc),
            tier.layout().slot_header_bytes as usize,
        );
        let rh = region_header(&tier, loc.region);
        assert_eq!(rh.format.layout, k);
        let seal = SlotSeal::of(rh.format, creation_id);
        let h = SlotHeader::decode(&h, g.layers, seal).expect("slot header at header(s)");
        assert_eq!((h.key, h.slot, h.region), (*key, loc.slot, loc.region));
        for layer in 0..g.layers {
            let got = peek(&path, piece_offset(&tier, loc, layer, 0), lb);
            let l = layer as usize;
            assert!(
                got == blocks.data[i][l * lb..(l + 1) * lb],
                "block {i} layer {l}"
            );
        }
    }
    check_all_hit(&tier, &blocks.keys).await;
}

async fn a_layer_major_extent_of_copied_blocks_is_one_run_per_row(kind: Kind) {
    let (_t, d) = dirs(1);
    let g = geometry();
    let tier = open(&d, kind, layout());
    // 10 blocks, the region's first extent: block-major one run of
    // 4096 + 10 x 20 KiB (two 128 KiB ops); layer-major the region header
    // with row 0 (4096 + 10 x 8 KiB) and rows 1..3 (10 x 4 KiB each), one
    // op each, since copied neighbours lie next to each other in the
    // buffer too.
    put_all(&tier, &Blocks::range(&g, 88, 0..10), 10).await;
    let want = match layout() {
        RegionLayout::Block => 2,
        RegionLayout::Layer => g.layers as u64,
    };
    assert_eq!(tier.stats().write_ios, want);
    // A later extent of 3 extends the same rows: 4 spans again.
    put_all(&tier, &Blocks::range(&g, 89, 0..3), 3).await;
    let more = match layout() {
        RegionLayout::Block => 1,
        RegionLayout::Layer => g.layers as u64,
    };
    assert_eq!(tier.stats().write_ios, want + more);
}

/// I16: a slot header that verifies and names the key and block sum, but
/// another slot, region or generation (as one copied from elsewhere would),
/// does not vouch for layer sums.
async fn layer_reads_trust_only_a_header_of_this_place_and_life(kind: Kind) {
    let (_t, d) = dirs(1);
    let g = geometry();
    let blocks = Blocks::range(&g, 90, 0..4);
    let tier = open(&d, kind, layout());
    put_all(&tier, &blocks, 4).await;
    let path = tier.data_file(0).unwrap();
    let id = meta(&d[0]).creation_id;
    let rh = region_header(&tier, 0);
    let seal = SlotSeal::of(rh.format, id);
    let lb = g.layer_bytes() as usize;
    // Block i's header rewritten, well sealed, with one field changed.
    let changes: [(u64, u32, u32); 3] = [(2, 0, 0), (1, 1, 1), (1, 0, 3)];
    for (i, (generation, region, slot)) in changes.iter().enumerate() {
        let loc = tier.location(blocks.keys[i]).unwrap();
        let slot = if *slot == 0 { loc.slot } else { *slot };
        let mut h = vec![0u8; 4096];
        let s = &blocks.sums[i];
        let place = (0, loc.region + region, slot);
        SlotHeader::encode_into(
            &mut h,
            seal,
            blocks.keys[i],
            s.block,
            *generation,
            place,
            g.block_bytes(),
            &s.layers,
        );
        poke(&path, header_offset(&tier, loc), &h);
    }
    tier.close().await.unwrap();
    drop(tier);
    // From the checkpoint (headers are not scanned), with a cold cache.
    let tier = open(&d, kind, layout());
    assert_eq!(tier.stats().recovered_from_checkpoint, 4);
    let reqs = blocks
        .keys
        .iter()
        .map(|k| (*k, kvtier_io::AlignedBuf::zeroed(lb, 4096)))
        .collect();
    let out: Vec<Lookup> = tier
        .read_layers(reqs, 1..2)
        .await
        .into_iter()
        .map(|r| r.1)
        .collect();
    assert_eq!(
        out,
        [
            Lookup::Corrupt,
            Lookup::Corrupt,
            Lookup::Corrupt,
            Lookup::Hit
        ]
    );
}

async fn a_v1_directory_opened_with_layer_keeps_its_blocks_and_becomes_v2(kind: Kind) {
    let (_t, d) = dirs(1);
    let g = geometry();
    let old = Blocks::range(&g, 82, 0..60);
    let tier = open(&d, kind, RegionLayout::Block);
    put_all(&tier, &old, 20).await;
    assert_eq!(region_header(&tier, 0).format, LifeFormat::V1);
    tier.close().await.unwrap();
    drop(tier);
    assert_eq!(meta(&d[0]).version, FORMAT_VERSION);
    // Opened with `layer`: v2 at once, the v1 lives still read.
    let tier = open(&d, kind, RegionLayout::Layer);
    assert_eq!(meta(&d[0]).version, FORMAT_VERSION_2);
    check_all_hit(&tier, &old.keys).await;
    let new = Blocks::range(&g, 83, 0..60);
    put_all(&tier, &new, 20).await;
    let r = tier.location(new.keys[59]).unwrap().region;
    let layer_v2 = LifeFormat {
        version: FORMAT_VERSION_2,
        layout: RegionLayout::Layer,
    };
    assert_eq!(region_header(&tier, r).format, layer_v2);
    tier.close().await.unwrap();
    drop(tier);
    // Back to `block`: stays v2, new lives are v2 block-major, all reads.
    let tier = open(&d, kind, RegionLayout::Block);
    assert_eq!(meta(&d[0]).version, FORMAT_VERSION_2);
    check_all_hit(&tier, &old.keys).await;
    check_all_hit(&tier, &new.keys).await;
    let more = Blocks::range(&g, 84, 0..10);
    put_all(&tier, &more, 10).await;
    let r = tier.location(more.keys[9]).unwrap().region;
    let block_v2 = LifeFormat {
        layout: RegionLayout::Block,
        ..layer_v2
    };
    assert_eq!(region_header(&tier, r).format, block_v2);
    // Without the checkpoint every life is scanned by its own layout.
    tier.close().await.unwrap();
    drop(tier);
    std::fs::remove_file(d[0].join("kvtier-disk.index")).unwrap();
    let tier = open(&d, kind, RegionLayout::Layer);
    assert_eq!(tier.stats().recovered_from_checkpoint, 0);
    for b in [&old, &new, &more] {
        check_all_hit(&tier, &b.keys).await;
    }
}

async fn a_v1_directory_opened_with_block_stays_v1(kind: Kind) {
    let (_t, d) = dirs(1);
    let g = geometry();
    let blocks = Blocks::range(&g, 85, 0..60);
    let tier = open(&d, kind, RegionLayout::Block);
    put_all(&tier, &blocks, 20).await;
    tier.close().await.unwrap();
    drop(tier);
    let meta_bytes = std::fs::read(d[0].join(META_FILE)).unwrap();
    let tier = open(&d, kind, RegionLayout::Block);
    assert_eq!(std::fs::read(d[0].join(META_FILE)).unwrap(), meta_bytes);
    let more = Blocks::range(&g, 86, 0..60);
    put_all(&tier, &more, 20).await;
    // Every header written is v1: region headers end at byte 64, slot
    // headers verify unseeded.
    let path = tier.data_file(0).unwrap();
    for key in blocks.keys.iter().chain(&more.keys) {
        let loc = tier.location(*key).unwrap();
        let rh = peek(&path, tier.layout().region_offset(loc.region), 4096);
        assert_eq!(rh[8..12], FORMAT_VERSION.to_le_bytes());
        assert!(rh[64..].iter().all(|&b| b == 0));
        let at = tier.layout().slot_offset(loc.region, loc.slot);
        let h = peek(&path, at, 4096);
        assert!(SlotHeader::decode(&h, g.layers, SlotSeal::V1).is_some());
    }
    check_all_hit(&tier, &more.keys).await;
}

/// Where, in a life of layout `from` of region 0, the bytes of the slot
/// header position `header(slot)` of layout `to` lie: (block, byte offset
/// in the block), or `None` if a header of `from` lies there.
fn covering_block(
    tier: &DiskTier,
    from: RegionLayout,
    to: RegionLayout,
    slot: u32,
) -> Option<(u32, usize)> {
    let l = tier.layout();
    let at = l.header_in_region(to, slot);
    (0..l.slots_per_region).find_map(|s| {
        (0..l.layers).find_map(|layer| {
            let p = l.piece_in_region(from, layer, s);
            (p..p + l.layer_bytes)
                .contains(&at)
                .then(|| (s, (layer as u64 * l.layer_bytes + at - p) as usize))
        })
    })
}

/// The case of crash case 11: life 1 of region 0 (layout `from`) holds
/// blocks whose bytes, at the other layout's `header(t)`, are a well-formed
/// slot header for slot `t` of life 2, naming a key of the client's choice.
/// Life 2 (layout `to`) got its region header on disk and then the process
/// died before slot `t` was written. Recovery must not index the forged
/// key. Forged with the directory's own seal (which clients never learn)
/// it would be: that control shows the forgery sits where recovery looks.
async fn a_header_forged_in_block_data_is_not_recovered_by_a_life_of_the_other_layout(kind: Kind) {
    let from = layout();
    let to = match from {
        RegionLayout::Block => RegionLayout::Layer,
        RegionLayout::Layer => RegionLayout::Block,
    };
    let guesses = |id: u128| {
        [
            SlotSeal::V1,
            SlotSeal::V2 {
                creation_id: 0,
                layout: to,
            },
            SlotSeal::V2 {
                creation_id: id,
                layout: from,
            },
        ]
    };
    // Each guess, then the directory's real seal (the control).
    for attempt in 0..4 {
        let (_t, d) = dirs(1);
        let g = geometry();
        // Both layouts in one directory: v2 from the start.
        let tier = open(&d, kind, RegionLayout::Layer);
        tier.close().await.unwrap();
        drop(tier);
        let creation_id = meta(&d[0]).creation_id;
        let seal = match guesses(creation_id).get(attempt) {
            Some(s) => *s,
            None => SlotSeal::of(
                LifeFormat {
                    version: FORMAT_VERSION_2,
                    layout: to,
                },
                creation_id,
            ),
        };
        let tier = open(&d, kind, from);
        let spr = tier.layout().slots_per_region;
        let forged_key = BlockHash(0xf0f0);
        let victim_sums = BlockSums::compute(
            forged_key,
            g.layer_bytes() as usize,
            &content(forged_key, g.block_bytes() as usize),
        );
        let mut blocks = Blocks::range(&g, 87, 0..spr as u64);
        let mut forged_slots = Vec::new();
        for t in 0..spr {
            let Some((s, at)) = covering_block(&tier, from, to, t) else {
                continue;
            };
            let h = &mut blocks.data[s as usize][at..at + 4096];
            h.fill(0);
            SlotHeader::encode_into(
                h,
                seal,
                forged_key,
                victim_sums.block,
                2,
                (0, 0, t),
                g.block_bytes(),
                &victim_sums.layers,
            );
            forged_slots.push(t);
        }
        assert!(!forged_slots.is_empty());
        for i in 0..blocks.keys.len() {
            let lb = g.layer_bytes() as usize;
            blocks.sums[i] = BlockSums::compute(blocks.keys[i], lb, &blocks.data[i]);
        }
        let puts: Vec<BlockPut<'_>> = blocks.puts();
        for r in tier.put_batch(&puts).await {
            r.unwrap();
        }
        assert_eq!(region_header(&tier, 0).generation, 1);
        let path = tier.data_file(0).unwrap();
        drop(puts);
        tier.close().await.unwrap();
        drop(tier);
        // Life 2 of region 0, layout `to`: its header landed, nothing else.
        let mut rh = vec![0u8; REGION_HEADER_BYTES as usize];
        RegionHeader {
            generation: 2,
            format: LifeFormat {
                version: FORMAT_VERSION_2,
                layout: to,
            },
            ..region_header_of(&path)
        }
        .encode(&mut rh);
        poke(&path, 0, &rh);
        let tier = open(&d, kind, to);
        let control = attempt == 3;
        assert_eq!(
            tier.contains(forged_key),
            control,
            "seal {seal:?} (attempt {attempt})"
        );
        if control {
            assert_eq!(get(&tier, &[forged_key]).await[0].0, Lookup::Corrupt);
        }
    }
}

fn region_header_of(path: &Path) -> RegionHeader {
    RegionHeader::decode(&peek(path, 0, REGION_HEADER_BYTES as usize)).expect("region header")
}
