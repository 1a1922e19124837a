//! # kvtier-sim (being written)
//!
//! The optimizer: [`trace`] readers, [`replay`] of request traces through
//! [`policy`] eviction policies and a multi-tier hierarchy, the TTFT and cost
//! [`model`], capacity [`sweep`]s and the HTML [`report`].

pub mod model;
pub mod policy;
pub mod replay;
pub mod report;
pub mod sweep;
pub mod trace;
