//! kvtier's benches that drive the node's libraries end to end, kept out of
//! the libraries so their users do not build the optimizer, temporary
//! directories or trace readers.
//!
//! - [`trace`]: `kvtier bench trace`, a request trace served by a real
//!   [`BlockManager`](kvtier_manager::manager::BlockManager) over real tiers
//!   with real bytes. Its tests check that the optimizer's replay
//!   (`kvtier-sim`) predicts the hit rates the manager gets, policy by
//!   policy and layout by layout.

pub mod trace;
