//! Measures the memory tier's verified copy (`get`) against a plain
//! single-thread `memcpy` of the same blocks from the same arena.
//!
//! ```text
//! cargo run --release -p kvtier-mem --example get_bandwidth -- [arena MiB] [passes]
//! ```
//!
//! The arena (default 1024 MiB) is much larger than any last-level cache,
//! so both copies stream the source from DRAM. Blocks are Llama-3-8B's
//! 16-token blocks (2 MiB, 32 layers of 64 KiB). Each pass reads every
//! block once in slot order into one destination buffer; the best pass of
//! each kind is reported (the least disturbed by other work on the machine).

use std::hint::black_box;
use std::time::Instant;

use kvtier_arena::ArenaReader;
use kvtier_core::{BlockHash, BlockSums, Lookup, ModelPreset};
use kvtier_mem::{MemoryTier, MemoryTierConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let arena_mib: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(1024);
    let passes: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(5);
    let g = ModelPreset::Llama3_8B.geometry(16);
    let block = g.block_bytes() as usize;
    let layer = g.layer_bytes() as usize;
    let tier = MemoryTier::create(MemoryTierConfig {
        shm_name: format!("kvtier-bench-{}", std::process::id()),
        capacity_bytes: arena_mib << 20,
        block_bytes: block,
        layer_bytes: layer,
        hugepages: false,
        table_key: None,
        access_group: None,
    })?;
    let n = tier.capacity_blocks();
    let mut data = vec![0u8; block];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for k in 0..n as u128 {
        for chunk in data.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
        }
        let sums = BlockSums::compute(BlockHash(k), layer, &data);
        tier.put(BlockHash(k), &data, &sums)?;
    }
    let (arena, _) = tier.arena();
    let slot = tier.slot_bytes();
    let mut dst = vec![0u8; block];
    let bytes = (n * block) as f64;
    let gbps = |secs: f64| bytes / secs / 1e9;

    let time = |f: &mut dyn FnMut()| {
        (0..passes)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min)
    };
    let memcpy = time(&mut || {
        for s in 0..n {
            // SAFETY: slot `s` is resident and nothing writes the arena
            // during the measurement; `dst` is private and block bytes long.
            unsafe { std::ptr::copy_nonoverlapping(arena.add(s * slot), dst.as_mut_ptr(), block) };
            black_box(&mut dst);
        }
    });
    let get = time(&mut || {
        for k in 0..n as u128 {
            assert_eq!(tier.get(BlockHash(k), &mut dst), Lookup::Hit);
        }
    });
    let reader = ArenaReader::open(tier.shm_name())?;
    let reader_get = time(&mut || {
        for k in 0..n as u128 {
            assert_eq!(reader.get(BlockHash(k), &mut dst), Lookup::Hit);
        }
    });
    let hash_only = time(&mut || {
        for s in 0..n {
            // SAFETY: as for the memcpy pass; read-only.
            let src = unsafe { std::slice::from_raw_parts(arena.add(s * slot), block) };
            black_box(BlockSums::compute(BlockHash(s as u128), layer, src));
        }
    });
    println!(
        "blocks: {n} x {} KiB ({} MiB), {passes} passes, best of each",
        block >> 10,
        (n * block) >> 20
    );
    println!("memcpy (1 thread)        {:6.2} GB/s", gbps(memcpy));
    println!(
        "MemoryTier::get          {:6.2} GB/s  ratio {:.2}",
        gbps(get),
        memcpy / get
    );
    println!(
        "ArenaReader::get         {:6.2} GB/s  ratio {:.2}",
        gbps(reader_get),
        memcpy / reader_get
    );
    println!("checksum only (in place) {:6.2} GB/s", gbps(hash_only));
    Ok(())
}
