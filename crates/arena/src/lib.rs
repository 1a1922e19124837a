//! # kvtier-arena
//!
//! The shared-memory arena of the memory tier (G2), as every process sees
//! it: one file, `/dev/shm/<name>`, of a header, a slot table and slot
//! data, and the views of the processes that map it without owning it.
//! Engines link this crate (through `kvtier-client`); the owner, the node
//! daemon's `kvtier_mem::MemoryTier`, builds on it, so the engine side
//! carries neither the owner's book and adoption nor any eviction policy.
//!
//! - [`ArenaReader`] is any other process: it maps the arena read-only by
//!   name and copies blocks out under the slot table's seqlock, verifying
//!   each against its checksums.
//! - [`ArenaClient`] is an engine process talking to the node daemon that
//!   owns the arena: it maps the slot data read-write (the header and slot
//!   table read-only), fills the slots the daemon reserves for it
//!   ([`fill`](ArenaClient::fill), checksums computed in the same pass as
//!   the copy) and reads the slots the daemon pins for it
//!   ([`read`](ArenaClient::read), verified against the checksums the
//!   daemon sent).
//! - The format itself, public for the owner that writes it: the file's
//!   [`layout`], its [`header`], the slot [`table`] and its [`seqlock`],
//!   the [`shm`] file naming and mapping, and the checksummed copies of
//!   [`verify`].
//!
//! Every block carries the [`BlockSums`](kvtier_core::BlockSums) it was
//! first stored with; every copy out of shared memory is hashed as it is
//! copied, and a block that fails is a miss, never an answer. The shared
//! layout and its invariants are in `docs/memory-arena.md`.

#![deny(missing_docs)]

pub mod header;
pub mod layout;
pub mod seqlock;
pub mod shm;
pub mod table;
pub mod verify;

mod client;
mod error;
mod reader;
mod view;

pub use client::ArenaClient;
pub use error::{MemError, Result};
pub use reader::{ArenaReader, ReaderStats};
