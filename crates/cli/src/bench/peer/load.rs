//! `kvtier bench peer --load`: a node's `Load` of blocks another node
//! holds (docs/peer-protocol.md §11), read whole before the answer against
//! streamed in groups of layers, in the same run.
//!
//! Two real nodes in this process, each on its own runtime: A (the
//! serving node of `kvtier bench peer`, its blocks in G2, served by a
//! `PeerServer` over `NodeSource`) and B, listening on its node socket
//! with a `PeerReader` and a cluster lookup that locates every key on A.
//! A client of B looks the keys up and loads them; the clock runs from
//! the `Load` to `LoadOk`, to the first layer ready and to the last. Each
//! round runs every mode once, in an order turned every round; after each
//! load the client reads every block (verified, exact, not timed),
//! releases and removes them, so the next load reads them from A again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use serde::Serialize;

use kvtier_client::{Client, ClientConfig, Lookup, Namespace, WireGeometry};
use kvtier_core::{BlockHash, BlockSums, Geometry, ModelPreset};
use kvtier_node::{
    ClusterBlock, ClusterLookup, CommittedKey, Node, NodeServer, PeerLocation, PeerReader,
    SessionNamespace,
};
use kvtier_peer::{Identity, PeerPool, PoolConfig};
use kvtier_tier::BoxFuture;

use super::super::measure::process_cpu_time;
use super::super::node::bench_node_config;
use super::super::node::report::{Spread, spread};
use super::{CLIENT_THREADS, PeerBenchArgs, SERVER_THREADS, Serving, block_content, identity};

/// The cluster as B sees it: client key `i` is A's block `i`.
struct OnA {
    addr: std::net::SocketAddr,
    blocks: Vec<(BlockHash, BlockSums)>,
}

impl ClusterLookup for OnA {
    fn lookup<'a>(
        &'a self,
        _ns: &'a SessionNamespace,
        keys: &'a [CommittedKey],
    ) -> BoxFuture<'a, Vec<ClusterBlock>> {
        let found = (keys.iter())
            .map_while(|k| {
                let (stored, sums) = self.blocks.get(usize::try_from(k.client.0).ok()?)?;
                Some(ClusterBlock::Peer(PeerLocation {
                    node: "server".into(),
                    addr: self.addr,
                    stored: *stored,
                    sum: sums.block,
                }))
            })
            .collect();
        Box::pin(async move { found })
    }
}

/// Node B, its socket and its reader.
struct Reading {
    node: Arc<Node>,
    server: NodeServer,
    reader: Arc<PeerReader>,
    socket: std::path::PathBuf,
}

impl Reading {
    async fn start(config: &kvtier_node::NodeConfig, served: &Serving) -> Result<Self> {
        let node = Node::open(config, Vec::new()).await.context("opening B")?;
        let socket = config.node_socket();
        let server = NodeServer::bind(node.clone(), &socket).await?;
        let me = Identity {
            secret: served.secret.clone(),
            ..identity("reader")
        };
        let pool = PeerPool::new(me, PoolConfig::default());
        let reader = Arc::new(PeerReader::new(pool, Duration::from_secs(30)));
        ensure!(node.set_peer_reader(reader.clone()), "B has a reader");
        let cluster = OnA {
            addr: served.peer.local_addr(),
            blocks: served.blocks.clone(),
        };
        ensure!(node.set_cluster_lookup(Arc::new(cluster)), "B has a lookup");
        Ok(Self {
            node,
            server,
            reader,
            socket,
        })
    }

    async fn stop(self) -> Result<()> {
        self.server.shutdown().await;
        self.node.close().await.context("closing B")
    }
}

/// One timed `Load`.
#[derive(Debug, Clone, Copy)]
struct Sample {
    load_ok: Duration,
    first_layer: Duration,
    last_layer: Duration,
    cpu: Duration,
}

/// The figures of one mode, median [min .. max] over rounds.
#[derive(Debug, Serialize)]
struct ModeFigures {
    /// Layer groups a streamed load reads in; 0: whole blocks.
    layer_groups: u32,
    load_ok_ms: Spread,
    first_layer_ms: Spread,
    last_layer_ms: Spread,
    /// The whole process's CPU (both nodes, the client) per block, µs.
    process_cpu_us_per_block: Spread,
}

/// Runs the `--load` bench: A holds `args.blocks` blocks; every mode of
/// `args.layer_groups` loads them all into B once a round.
pub(super) fn run(args: &PeerBenchArgs, preset: ModelPreset, geometry: Geometry) -> Result<()> {
    ensure!(geometry.layers > 1, "--load needs blocks of several layers");
    let server_rt = super::runtime(SERVER_THREADS)?;
    let reader_rt = super::runtime(CLIENT_THREADS)?;
    let dir = tempfile::Builder::new()
        .prefix("kvtier-bench-peer-load-")
        .tempdir()
        .context("creating the nodes' directory")?;
    let slots = args.blocks as u64 + 8;
    let (da, db) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir_all(&da)?;
    std::fs::create_dir_all(&db)?;
    let config_a = bench_node_config(preset, geometry, slots, "peer-a", &da);
    let config_b = bench_node_config(preset, geometry, slots, "peer-b", &db);
    let served = server_rt.block_on(Serving::start(&config_a, geometry, args.blocks))?;
    let reading = reader_rt.block_on(Reading::start(&config_b, &served))?;
    let measured = measure(args, geometry, &reading);
    reader_rt.block_on(reading.stop())?;
    server_rt.block_on(served.stop())?;
    let figures = measured?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&figures)?);
    } else {
        print(args, preset, geometry, &figures);
    }
    Ok(())
}

/// Warms up, then `args.rounds` rounds of every mode.
fn measure(args: &PeerBenchArgs, g: Geometry, reading: &Reading) -> Result<Vec<ModeFigures>> {
    let namespace = Namespace {
        model: "kvtier-bench-peer-load".into(),
        dtype: "bf16".into(),
        layout_version: 1,
        block_size_tokens: g.tokens_per_block,
        tp_rank: 0,
        tp_size: 1,
        tenant_salt: None,
    };
    let config = ClientConfig::new(reading.socket.clone(), namespace, WireGeometry::from(&g));
    let mut client = Client::connect(config).context("connecting to B")?;
    let keys: Vec<BlockHash> = (0..args.blocks as u128).map(BlockHash).collect();
    let modes = &args.layer_groups;
    let mut samples: Vec<Vec<Sample>> = modes.iter().map(|_| Vec::new()).collect();
    for round in 0..=args.rounds {
        for j in 0..modes.len() {
            let m = (j + round) % modes.len();
            reading.reader.set_layer_groups(modes[m]);
            let sample = one_load(&mut client, &keys, g)?;
            // Round 0 warms up: connections, page faults, caches.
            if round > 0 {
                samples[m].push(sample);
            }
        }
    }
    let per_block = 1e6 / args.blocks.max(1) as f64;
    Ok((modes.iter().zip(&samples))
        .map(|(&layer_groups, s)| {
            let ms = |f: fn(&Sample) -> Duration| {
                Spread::of(s.iter().map(|x| f(x).as_secs_f64() * 1e3).collect())
            };
            ModeFigures {
                layer_groups,
                load_ok_ms: ms(|x| x.load_ok),
                first_layer_ms: ms(|x| x.first_layer),
                last_layer_ms: ms(|x| x.last_layer),
                process_cpu_us_per_block: Spread::of(
                    s.iter().map(|x| x.cpu.as_secs_f64() * per_block).collect(),
                ),
            }
        })
        .collect())
}

/// Looks `keys` up and loads them into B (timed), then checks every block
/// and leaves B without them.
fn one_load(client: &mut Client, keys: &[BlockHash], g: Geometry) -> Result<Sample> {
    let tiers = client.lookup(keys)?;
    ensure!(tiers.len() == keys.len(), "B located {} keys", tiers.len());
    let cpu = process_cpu_time();
    let start = Instant::now();
    let load = client.load(keys)?;
    let load_ok = start.elapsed();
    client.wait_layer(&load, 0)?;
    let first_layer = start.elapsed();
    client.wait_layer(&load, g.layers - 1)?;
    let last_layer = start.elapsed();
    let cpu = process_cpu_time().saturating_sub(cpu);
    let len = g.block_bytes() as usize;
    let mut buf = vec![0u8; len];
    for i in 0..keys.len() {
        ensure!(load.read(i, &mut buf)? == Lookup::Hit, "block {i} missed");
        ensure!(buf == block_content(i, len), "block {i} differs");
    }
    client.release_load(load)?;
    client.remove(keys)?;
    Ok(Sample {
        load_ok,
        first_layer,
        last_layer,
        cpu,
    })
}

fn print(args: &PeerBenchArgs, preset: ModelPreset, g: Geometry, figures: &[ModeFigures]) {
    println!(
        "kvtier bench peer --load: a Load on node B of {} blocks of {} B ({} layers) node A holds, \
         preset {}, {} rounds; both nodes in this process; median [min .. max] over rounds",
        args.blocks,
        g.block_bytes(),
        g.layers,
        preset.name(),
        args.rounds
    );
    for f in figures {
        let mode = match f.layer_groups {
            0 => "whole".to_owned(),
            n => format!("streamed, {n} groups"),
        };
        println!(
            "  {mode:20} LoadOk ms {}  first layer ms {}  last layer ms {}  cpu us/block {}",
            spread(f.load_ok_ms, 1),
            spread(f.first_layer_ms, 1),
            spread(f.last_layer_ms, 1),
            spread(f.process_cpu_us_per_block, 1),
        );
    }
}
