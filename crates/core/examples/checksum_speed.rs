//! How fast a 2 MiB block is checksummed, hot in cache and cold from DRAM,
//! against a cold memcpy of the same size: the floor of verifying a block
//! that the disk has just written into memory.
//!
//! ```text
//! cargo run --release -p kvtier-core --example checksum_speed -- [POOL_MIB]
//! ```
//!
//! Cold: blocks picked across a pool (default 1024 MiB, far past the
//! last-level cache). Hot: one block hashed again and again. `xxhash_rust`
//! is the crate as built (its kernel is chosen at compile time: SSE2 for a
//! portable x86-64 build); kvtier-core picks AVX-512F or AVX2 at run time.

use std::time::Instant;

use kvtier_core::{BlockHash, block_checksum};

const BLOCK: usize = 2 << 20;
const LAYER: usize = 64 << 10;

fn main() {
    let pool_mib: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1024);
    let n = (pool_mib << 20) / BLOCK;
    let pool: Vec<u8> = (0..n * BLOCK).map(|i| (i * 31 + i / 4093) as u8).collect();
    let key = BlockHash(5);
    let mut dst = vec![0u8; BLOCK];
    let block = |i: usize| {
        let j = (i * 7919) % n;
        &pool[j * BLOCK..(j + 1) * BLOCK]
    };
    let per_block = |t: Instant| t.elapsed().as_secs_f64() / n as f64 * 1e6;
    println!("{n} blocks of 2 MiB, 32 layers of 64 KiB; microseconds per block");
    for round in 0..3 {
        let mut acc = 0u64;
        let t = Instant::now();
        for i in 0..n {
            acc ^= block_checksum(key, LAYER, block(i));
        }
        let cold = per_block(t);
        let t = Instant::now();
        for i in 0..n {
            dst.copy_from_slice(block(i));
            std::hint::black_box(&dst);
        }
        let memcpy = per_block(t);
        let t = Instant::now();
        for _ in 0..n {
            acc ^= block_checksum(key, LAYER, &dst);
        }
        let hot = per_block(t);
        let t = Instant::now();
        for i in 0..n {
            for (l, layer) in dst.chunks(LAYER).enumerate() {
                acc ^= xxhash_rust::xxh3::xxh3_64_with_seed(layer, i as u64 + l as u64);
            }
        }
        let crate_hot = per_block(t);
        println!(
            "round {round}: kvtier-core cold {cold:.0}, hot {hot:.0}; xxhash_rust hot {crate_hot:.0}; memcpy cold {memcpy:.0}  ({acc:x})"
        );
    }
}
