//! Integration tests of the disk tier. One binary (to keep link time down on
//! small machines); I/O-touching tests run on both engines (`psync` and
//! `uring` submodules). `crash` re-executes this binary as a child process.

mod common;

mod basic;
mod corruption;
mod crash;
mod direct;
mod layout;
mod listener;
mod lock;
mod reclaim;
mod recovery;
mod runs;
mod store;
mod sync_latch;
