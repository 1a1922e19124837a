//! # kvtier-remote
//!
//! The remote tier (G4) data plane: KV blocks as objects in an S3-compatible
//! object store (MinIO, Ceph RGW, AWS S3) or a shared file system (NFS,
//! 3FS), through [`object_store`]. The block manager cascades blocks from
//! the disk tier (G3) here and onboards them back. `docs/remote-format.md`
//! describes the bytes of an object, its name, the verification rules and
//! what a crash leaves behind.
//!
//! ## Main types
//!
//! - [`RemoteTier`] is the tier: [`open`](RemoteTier::open) it from a
//!   [`RemoteConfig`] (`s3://bucket/prefix` or `file:///dir`), or build it
//!   over any `Arc<dyn ObjectStore>` with [`with_store`](RemoteTier::with_store)
//!   (the seam tests and other stores use). Then
//!   [`put_batch`](RemoteTier::put_batch) [`BlockPut`](kvtier_tier::BlockPut)s (kvtier-tier's),
//!   [`get_batch`](RemoteTier::get_batch) whole blocks,
//!   [`read_layers`](RemoteTier::read_layers) a layer range with one ranged
//!   request per object, [`remove_batch`](RemoteTier::remove_batch), and
//!   [`list`](RemoteTier::list) what is stored after a restart.
//! - Reads answer a [`RemoteRead`] per block: `Hit` (every byte verified
//!   against the checksums the block carries since it entered kvtier),
//!   `Miss`, `Corrupt` (the object failed verification; the tier deletes it;
//!   never served) or `Failed` (the store did not answer in time, or
//!   refused).
//! - [`ObjectBlocks`] puts and gets one block object at a path someone
//!   else chose (the cluster's shared G4: the metadata service's write
//!   sessions name the paths), under a key given per call, with the same
//!   bytes and checks; its reads never delete.
//! - [`PrivateDir`] is the store of a `file://` URL: a directory whose
//!   files (`0600`) and directories (`0700`) only their owner can reach.
//! - [`format`](mod@format) is the object header and naming; [`RemoteStats`] the
//!   counters; [`RemoteError`] the one error type.
//!
//! ```no_run
//! use kvtier_core::{BlockHash, BlockSums, Geometry};
//! use kvtier_remote::{RemoteConfig, RemoteRead, RemoteTier};
//! use kvtier_tier::BlockPut;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let geometry = Geometry::raw(4, 64 << 10)?;
//! let cfg = RemoteConfig { url: "file:///mnt/shared/kvtier".into(), ..Default::default() };
//! let tier = RemoteTier::open(&cfg, geometry)?;
//! let key = BlockHash(7);
//! let data = vec![1u8; 64 << 10];
//! let sums = BlockSums::compute(key, geometry.layer_bytes() as usize, &data);
//! for r in tier.put_batch(&[BlockPut { key, data: &data, sums: &sums, pinned: None }]).await {
//!     r?;
//! }
//! match &tier.read_layers(&[key], 1..3).await[0] {
//!     RemoteRead::Hit { bytes, .. } => assert_eq!(bytes.len(), 2 * (16 << 10)),
//!     other => println!("not served: {other:?}"),
//! }
//! # Ok(()) }
//! ```

mod config;
mod dir;
mod error;
pub mod format;
mod object;
mod stats;
mod store;
#[cfg(feature = "test-support")]
pub mod test_support;
mod tier;

pub use config::RemoteConfig;
pub use dir::PrivateDir;
pub use error::RemoteError;
pub use object::ObjectBlocks;
pub use stats::RemoteStats;
pub use tier::{RemoteRead, RemoteTier};
