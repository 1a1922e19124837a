//! The lock around a pool's state, as a seam.
//!
//! A pool keeps all of its bookkeeping in one [`PoolState`] behind one lock
//! and never holds it across a call out of the pool. Production uses
//! `parking_lot::Mutex`; the shuttle tests plug in `shuttle::sync::Mutex`
//! through this trait so the scheduler explores the real pool's
//! interleavings, without shuttle becoming a dependency of the library.

use super::state::PoolState;

/// A mutual-exclusion lock around a [`PoolState`].
pub trait PoolLock: Send + Sync + 'static {
    /// Wraps the state.
    fn new(state: PoolState) -> Self;
    /// Runs `f` with the state locked.
    fn with<R>(&self, f: impl FnOnce(&mut PoolState) -> R) -> R;
}

/// The lock production pools use.
pub type DefaultLock = parking_lot::Mutex<PoolState>;

impl PoolLock for parking_lot::Mutex<PoolState> {
    fn new(state: PoolState) -> Self {
        parking_lot::Mutex::new(state)
    }

    fn with<R>(&self, f: impl FnOnce(&mut PoolState) -> R) -> R {
        f(&mut self.lock())
    }
}
