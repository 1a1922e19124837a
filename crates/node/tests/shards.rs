//! Head shards over the real tiers: engines at different tensor-parallel
//! sizes share blocks stored as per-head-range objects
//! (`kvtier_core::HeadShards`, docs/block-identity.md "Head shards").
//!
//! Each rank's KV memory is simulated as vLLM's CPU backend lays it out:
//! one buffer per layer, each engine block in it the rank's heads one
//! after the other, each head's K and V of the block's tokens. A head's
//! bytes are a function of (block, layer, head) only, as a real model's
//! are, so whatever rank at whatever TP size computed them, they must
//! come back byte-exact wherever that head lives at the loading TP size.
//! The nodes are real (`kvtier_node::Node` behind its socket, arena, disk
//! log); restarts move the blocks to the disk log, so loads come from G3.

use std::ops::Range;

use kvtier_client::{
    BlockHash, BlockSource, Client, ClientConfig, Lookup, Namespace, StoreOutcome, Tier,
    WireGeometry,
};
use kvtier_core::{
    Attention, ByteSize, Dtype, Geometry, GeometryConfig, HeadShards, ModelPreset, SHARED_TP_RANK,
    SHARED_TP_SIZE, blocks_in_prefix,
};
use kvtier_node::test_support::{TestNode, small_config};

/// A small grouped-query model: 3 layers, `kv_heads` heads of 8, f32,
/// 16 tokens per block (one head's layer of a block: 1 KiB).
fn gqa(kv_heads: u32) -> Geometry {
    Geometry {
        layers: 3,
        attention: Attention::Mha {
            kv_heads,
            head_dim: 8,
        },
        dtype: Dtype::F32,
        tokens_per_block: 16,
        tp_size: 1,
        tp_rank: 0,
    }
}

/// DeepSeek-V3's latent (576 bf16 per token) over 4 of its layers.
fn deepseek_v3_cut() -> Geometry {
    let mut g = ModelPreset::DeepSeekV3.geometry(16);
    g.layers = 4;
    g
}

/// A model and how its blocks are sharded.
#[derive(Clone, Copy)]
struct Model {
    name: &'static str,
    geometry: Geometry,
    shards: HeadShards,
}

impl Model {
    fn new(name: &'static str, geometry: Geometry, shards: HeadShards) -> Self {
        Self {
            name,
            geometry,
            shards,
        }
    }

    /// The node's geometry: one shard.
    fn shard_geometry(&self) -> Geometry {
        self.shards
            .shard_geometry(&self.geometry)
            .expect("a shard geometry")
    }

    /// Bytes of one head's layer of one block.
    fn head_bytes(&self) -> usize {
        (self.shard_geometry().layer_bytes() / u64::from(self.shards.shard_heads())) as usize
    }

    /// The namespace every rank of every TP size stores shards in: no
    /// rank's own.
    fn namespace(&self) -> Namespace {
        Namespace {
            model: self.name.into(),
            dtype: self.geometry.dtype.name().into(),
            layout_version: 1,
            block_size_tokens: self.geometry.tokens_per_block,
            tp_rank: SHARED_TP_RANK,
            tp_size: SHARED_TP_SIZE,
            tenant_salt: None,
        }
    }
}

/// What the model computes for `head` in `layer` of the block the engine
/// keys `block`: the same at every TP size, distinct per (block, layer,
/// head) and per byte.
fn head_kv(block: u128, layer: u32, head: u32, len: usize) -> Vec<u8> {
    let id = (block as u64) << 16 ^ u64::from(layer) << 8 ^ u64::from(head);
    let seed = id.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len as u64)
        .map(|i| (seed.wrapping_mul(i + 3) >> 37) as u8)
        .collect()
}

/// A node whose geometry is one shard of `model`, with room for `slots`
/// blocks in the arena; restartable.
struct ShardNode {
    test: Option<TestNode>,
    _dir: tempfile::TempDir,
}

impl ShardNode {
    fn start(model: &Model, slots: u64) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let shard = model.shard_geometry();
        let mut config = small_config(dir.path(), slots);
        config.geometry = Some(geometry_config(&shard));
        config.memory.capacity = ByteSize(slots * shard.block_bytes());
        let test = TestNode::start(config, Vec::new());
        assert_eq!(*test.node.geometry(), shard);
        Self {
            test: Some(test),
            _dir: dir,
        }
    }

    fn node(&self) -> &TestNode {
        self.test.as_ref().expect("a running node")
    }

    /// A clean stop (G2 moves to the disk log) and a start from the same
    /// data directory, which adopts the disk log: everything is in G3.
    fn restart(&mut self) {
        let config = self.test.take().expect("a running node").stop();
        self.test = Some(TestNode::start(config, Vec::new()));
    }

    fn client(&self, model: &Model) -> Client {
        let geometry = WireGeometry::from(self.node().node.geometry());
        let config = ClientConfig::new(self.node().socket(), model.namespace(), geometry);
        Client::connect(config).expect("connect")
    }

    /// The tier of each key of the stored prefix of `keys`.
    fn tiers(&self, model: &Model, keys: &[BlockHash]) -> Vec<Tier> {
        self.client(model).lookup(keys).expect("lookup")
    }
}

/// `[geometry]` spelling out `g` field by field.
fn geometry_config(g: &Geometry) -> GeometryConfig {
    let (kv_heads, head_dim, latent_dim) = match g.attention {
        Attention::Mha { kv_heads, head_dim } => (Some(kv_heads), Some(head_dim), None),
        Attention::Mla { latent_dim } => (None, None, Some(latent_dim)),
    };
    GeometryConfig {
        preset: None,
        tokens_per_block: g.tokens_per_block,
        layers: Some(g.layers),
        kv_heads,
        head_dim,
        latent_dim,
        dtype: Some(g.dtype.name().into()),
        tp_size: g.tp_size,
        tp_rank: g.tp_rank,
    }
}

/// One rank of an engine: its client, the heads it holds and its KV
/// memory (per layer, `slots` engine blocks of its heads one after the
/// other).
struct Rank {
    model: Model,
    tp_rank: u32,
    tp_size: u32,
    heads: Range<u32>,
    layers: Vec<Vec<u8>>,
    client: Client,
}

impl Rank {
    fn connect(node: &ShardNode, model: &Model, tp_rank: u32, tp_size: u32, slots: usize) -> Self {
        let heads = model.shards.rank_heads(tp_rank, tp_size).expect("heads");
        let block = heads.len() * model.head_bytes();
        Self {
            model: *model,
            tp_rank,
            tp_size,
            heads,
            layers: vec![vec![0u8; slots * block]; model.geometry.layers as usize],
            client: node.client(model),
        }
    }

    /// Where `head` of engine block `slot` lies in a layer buffer.
    fn head_range(&self, slot: usize, head: u32) -> Range<usize> {
        let hb = self.model.head_bytes();
        let at = (slot * self.heads.len() + (head - self.heads.start) as usize) * hb;
        at..at + hb
    }

    /// Runs the "model": block `blocks[i]`'s KV of this rank's heads into
    /// engine block `slots[i]`.
    fn compute(&mut self, blocks: &[u128], slots: &[usize]) {
        for (&b, &slot) in blocks.iter().zip(slots) {
            for layer in 0..self.layers.len() {
                for head in self.heads.clone() {
                    let at = self.head_range(slot, head);
                    let kv = head_kv(b, layer as u32, head, at.len());
                    self.layers[layer][at].copy_from_slice(&kv);
                }
            }
        }
    }

    fn keys(&self, blocks: &[u128]) -> Vec<BlockHash> {
        let hashes: Vec<BlockHash> = blocks.iter().copied().map(BlockHash).collect();
        let shards = self.model.shards;
        shards
            .rank_keys(&hashes, self.tp_rank, self.tp_size)
            .expect("rank keys")
    }

    fn shards_per_block(&self) -> usize {
        let shards = self.model.shards;
        shards.for_rank(self.tp_rank, self.tp_size).unwrap().len()
    }

    /// Where each of [`keys`](Self::keys)'s shards lies: the byte offset
    /// of its virtual block in a layer buffer.
    fn offsets(&self, slots: &[usize]) -> Vec<usize> {
        let shards = self.model.shards;
        let vids = shards
            .rank_block_ids(slots, self.tp_rank, self.tp_size)
            .expect("virtual ids");
        let shard_bytes = self.model.shard_geometry().layer_bytes() as usize;
        vids.into_iter().map(|v| v * shard_bytes).collect()
    }

    /// Stores this rank's shards of `blocks` from engine blocks `slots`.
    fn store(&mut self, blocks: &[u128], slots: &[usize]) -> Vec<StoreOutcome> {
        let src = Shards {
            keys: self.keys(blocks),
            offsets: self.offsets(slots),
            layers: &self.layers,
        };
        self.client.store_from(&src).expect("store")
    }

    /// Loads this rank's shards of `blocks` into engine blocks `slots`,
    /// layer by layer; returns how many leading blocks arrived whole.
    fn load(&mut self, blocks: &[u128], slots: &[usize]) -> usize {
        let keys = self.keys(blocks);
        let offsets = self.offsets(slots);
        let load = self.client.load(&keys).expect("load");
        let whole = blocks_in_prefix(load.prefix_len(), self.shards_per_block());
        let shard_keys = whole * self.shards_per_block();
        let shard_bytes = self.model.shard_geometry().layer_bytes() as usize;
        for layer in 0..self.layers.len() as u32 {
            self.client.wait_layer(&load, layer).expect("wait");
            let dst = &mut self.layers[layer as usize];
            for (i, &at) in offsets.iter().enumerate().take(shard_keys) {
                let shard = &mut dst[at..at + shard_bytes];
                let got = load.read_layer(i, layer, shard).expect("read a layer");
                assert_eq!(got, Lookup::Hit, "shard {i} layer {layer}");
            }
        }
        self.client.release_load(load).expect("release");
        whole
    }

    /// Checks that every head of this rank in engine block `slots[i]` is
    /// what the model computes for `blocks[i]`.
    fn check(&self, blocks: &[u128], slots: &[usize]) {
        for (&b, &slot) in blocks.iter().zip(slots) {
            for (layer, buf) in self.layers.iter().enumerate() {
                for head in self.heads.clone() {
                    let at = self.head_range(slot, head);
                    let want = head_kv(b, layer as u32, head, at.len());
                    assert!(
                        buf[at] == want[..],
                        "rank {} of {}: block {b:#x} layer {layer} head {head} differs",
                        self.tp_rank,
                        self.tp_size
                    );
                }
            }
        }
    }

    /// Whether engine block `slot` is still all zeros (nothing loaded).
    fn untouched(&self, slot: usize) -> bool {
        self.heads.clone().all(|head| {
            let at = self.head_range(slot, head);
            self.layers
                .iter()
                .all(|buf| buf[at.clone()].iter().all(|&x| x == 0))
        })
    }
}

/// A rank's shards to store: key `i`'s layer `l` is one shard's layer at
/// `offsets[i]` of layer buffer `l`.
struct Shards<'a> {
    keys: Vec<BlockHash>,
    offsets: Vec<usize>,
    layers: &'a [Vec<u8>],
}

impl BlockSource for Shards<'_> {
    fn len(&self) -> usize {
        self.keys.len()
    }
    fn key(&self, i: usize) -> BlockHash {
        self.keys[i]
    }
    fn layer(&self, i: usize, layer: usize, within: Range<usize>) -> &[u8] {
        let at = self.offsets[i];
        &self.layers[layer][at..at + within.len()]
    }
}

fn hashes(blocks: &[u128]) -> Vec<BlockHash> {
    blocks.iter().copied().map(BlockHash).collect()
}

/// Engine blocks for `n` blocks, not in order (an engine's free list).
fn scattered(n: usize, slots: usize, seed: usize) -> Vec<usize> {
    (0..n).map(|i| (i * 5 + seed) % slots).collect()
}

fn stores(n: usize) -> Vec<StoreOutcome> {
    vec![StoreOutcome::Stored; n]
}

#[test]
fn blocks_saved_at_tp1_load_at_tp2_and_tp4_from_disk() {
    // One head per shard, and the largest shards TP 1, 2 and 4 share (2).
    for shards in [
        HeadShards::new(8, 1).unwrap(),
        HeadShards::for_tp_sizes(8, &[1, 2, 4]).unwrap(),
    ] {
        let model = Model::new("gqa-8", gqa(8), shards);
        let mut node = ShardNode::start(&model, 64);
        let blocks: Vec<u128> = (0..4).map(|i| 0x5eed_0000 + i).collect();
        let mut saver = Rank::connect(&node, &model, 0, 1, 8);
        let slots = scattered(blocks.len(), 8, 3);
        saver.compute(&blocks, &slots);
        let n = blocks.len() * shards.count() as usize;
        assert_eq!(saver.store(&blocks, &slots), stores(n));
        drop(saver);

        for tp in [2, 4] {
            node.restart();
            let all = shards.all_keys(&hashes(&blocks));
            assert_eq!(node.tiers(&model, &all), vec![Tier::G3; all.len()]);
            for r in 0..tp {
                let mut rank = Rank::connect(&node, &model, r, tp, 8);
                let slots = scattered(blocks.len(), 8, r as usize);
                assert_eq!(rank.load(&blocks, &slots), blocks.len());
                rank.check(&blocks, &slots);
            }
        }
    }
}

#[test]
fn blocks_saved_at_tp4_and_tp2_load_at_tp1() {
    for shards in [
        HeadShards::new(8, 1).unwrap(),
        HeadShards::for_tp_sizes(8, &[1, 2, 4]).unwrap(),
    ] {
        let model = Model::new("gqa-8", gqa(8), shards);
        let mut node = ShardNode::start(&model, 96);
        let at_tp4: Vec<u128> = (0..3).map(|i| 0x4000 + i).collect();
        let at_tp2: Vec<u128> = (0..3).map(|i| 0x2000 + i).collect();
        for (tp, blocks) in [(4, &at_tp4), (2, &at_tp2)] {
            for r in 0..tp {
                let mut rank = Rank::connect(&node, &model, r, tp, 4);
                let slots = scattered(blocks.len(), 4, r as usize + 1);
                rank.compute(blocks, &slots);
                let n = blocks.len() * rank.shards_per_block();
                assert_eq!(rank.store(blocks, &slots), stores(n), "rank {r} of {tp}");
            }
        }
        node.restart();
        let both: Vec<u128> = at_tp4.iter().chain(&at_tp2).copied().collect();
        let all = shards.all_keys(&hashes(&both));
        assert_eq!(node.tiers(&model, &all), vec![Tier::G3; all.len()]);
        let mut rank = Rank::connect(&node, &model, 0, 1, 8);
        let slots = scattered(both.len(), 8, 2);
        assert_eq!(rank.load(&both, &slots), both.len());
        rank.check(&both, &slots);
        // And from TP 4 to TP 2, without TP 1 in between.
        for r in 0..2 {
            let mut rank = Rank::connect(&node, &model, r, 2, 4);
            let slots = scattered(at_tp4.len(), 4, 0);
            assert_eq!(rank.load(&at_tp4, &slots), at_tp4.len());
            rank.check(&at_tp4, &slots);
        }
    }
}

#[test]
fn a_rank_missing_one_shard_of_a_block_loads_up_to_that_block() {
    let shards = HeadShards::new(8, 1).unwrap();
    let model = Model::new("gqa-8", gqa(8), shards);
    let node = ShardNode::start(&model, 64);
    let blocks: Vec<u128> = (0..4).map(|i| 0xb10c_0000 + i).collect();
    let mut saver = Rank::connect(&node, &model, 0, 1, 4);
    let slots = [0, 1, 2, 3];
    saver.compute(&blocks, &slots);
    saver.store(&blocks, &slots);
    // Block 2 loses head 5 (say, evicted on its own).
    let lost = shards.key(BlockHash(blocks[2]), 5);
    saver.client.remove(&[lost]).unwrap();

    // A scheduler's lookup of every shard sees two whole blocks.
    let all = shards.all_keys(&hashes(&blocks));
    let prefix = node.tiers(&model, &all).len();
    assert_eq!(prefix, 2 * 8 + 5);
    assert_eq!(blocks_in_prefix(prefix, 8), 2);

    // At TP 2, rank 0 (heads 0..4) has all four blocks; rank 1 (heads
    // 4..8) stops at block 2 although its head 4 is there.
    let mut rank0 = Rank::connect(&node, &model, 0, 2, 4);
    assert_eq!(rank0.load(&blocks, &slots), 4);
    rank0.check(&blocks, &slots);
    let mut rank1 = Rank::connect(&node, &model, 1, 2, 4);
    assert_eq!(rank1.load(&blocks, &slots), 2);
    rank1.check(&blocks[..2], &slots[..2]);
    assert!(rank1.untouched(slots[2]) && rank1.untouched(slots[3]));
}

#[test]
fn replicated_kv_heads_are_stored_once() {
    // 2 KV heads at TP 4: ranks 0 and 1 hold head 0, ranks 2 and 3 head 1.
    let shards = HeadShards::for_tp_sizes(2, &[1, 4]).unwrap();
    let model = Model::new("gqa-2", gqa(2), shards);
    let node = ShardNode::start(&model, 32);
    let blocks: Vec<u128> = (0..3).map(|i| 0x7e9 + i).collect();
    let slots = [2, 0, 1];
    for r in 0..4 {
        let mut rank = Rank::connect(&node, &model, r, 4, 3);
        rank.compute(&blocks, &slots);
        let want = if r % 2 == 0 {
            StoreOutcome::Stored
        } else {
            StoreOutcome::AlreadyStored
        };
        assert_eq!(
            rank.store(&blocks, &slots),
            vec![want; blocks.len()],
            "rank {r}"
        );
    }
    let stats = node.node().node.stats();
    assert_eq!(stats.committed, 2 * blocks.len() as u64);
    assert_eq!(node.node().node.g2_blocks(), 2 * blocks.len());
    let mut whole = Rank::connect(&node, &model, 0, 1, 3);
    assert_eq!(whole.load(&blocks, &slots), blocks.len());
    whole.check(&blocks, &slots);
}

#[test]
fn an_mla_latent_is_stored_once_and_any_rank_loads_it() {
    let geometry = deepseek_v3_cut();
    let shards = HeadShards::from_geometry(&geometry, 1).unwrap();
    let model = Model::new("deepseek-v3", geometry, shards);
    let mut node = ShardNode::start(&model, 16);
    // The daemon holds a latent block whole.
    assert_eq!(model.shard_geometry(), geometry);
    let first: Vec<u128> = (0..3).map(|i| 0xd5_0000 + i).collect();
    let slots = [1, 0, 2];
    let mut ranks: Vec<Rank> = (0..2)
        .map(|r| Rank::connect(&node, &model, r, 2, 3))
        .collect();
    for rank in &mut ranks {
        rank.compute(&first, &slots);
    }
    // One after the other: the second rank's store is a dedup hit.
    assert_eq!(ranks[0].store(&first, &slots), stores(first.len()));
    assert_eq!(
        ranks[1].store(&first, &slots),
        vec![StoreOutcome::AlreadyStored; first.len()]
    );

    // Both at once: per block, one rank stores it and the other finds it
    // stored or being stored.
    let second: Vec<u128> = (0..3).map(|i| 0xd6_0000 + i).collect();
    let more = [2, 1, 0];
    for rank in &mut ranks {
        rank.compute(&second, &more);
    }
    let (blocks_ref, slots_ref) = (&second, &more);
    let outcomes: Vec<Vec<StoreOutcome>> = std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .iter_mut()
            .map(|rank| s.spawn(move || rank.store(blocks_ref, slots_ref)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!((outcomes[0].len(), outcomes[1].len()), (3, 3));
    for (i, (&a, &b)) in outcomes[0].iter().zip(&outcomes[1]).enumerate() {
        let mut got = [a, b];
        got.sort_by_key(|o| *o != StoreOutcome::Stored);
        assert_eq!(got[0], StoreOutcome::Stored, "block {i}: {got:?}");
        assert!(
            matches!(
                got[1],
                StoreOutcome::AlreadyStored | StoreOutcome::InFlightElsewhere
            ),
            "block {i}: {got:?}"
        );
    }
    let blocks: Vec<u128> = first.iter().chain(&second).copied().collect();
    let stats = node.node().node.stats();
    assert_eq!(stats.committed, blocks.len() as u64);
    // Every second copy was turned away at reserve (one reservation per key).
    let dedup = stats.reserve_already_stored + stats.reserve_in_flight;
    assert_eq!(dedup, blocks.len() as u64, "{stats:?}");
    assert_eq!(node.node().node.g2_blocks(), blocks.len());
    drop(ranks);

    // Either rank loads every latent, from the disk log after a restart.
    node.restart();
    let keys = shards.all_keys(&hashes(&blocks));
    assert_eq!(node.tiers(&model, &keys), vec![Tier::G3; keys.len()]);
    let at: Vec<usize> = (0..blocks.len()).rev().collect();
    for r in 0..2 {
        let mut rank = Rank::connect(&node, &model, r, 2, blocks.len());
        assert_eq!(rank.load(&blocks, &at), blocks.len());
        rank.check(&blocks, &at);
    }
}
