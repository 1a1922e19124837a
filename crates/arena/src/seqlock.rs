//! The seqlock protocol that lets other processes read slots while the owner
//! changes them, without a lock the owner could be made to wait on.
//!
//! Each slot table entry starts with a version counter:
//!
//! - even: the entry and the slot's bytes are stable;
//! - odd: the owner is changing them (filling the slot, publishing or
//!   clearing the entry).
//!
//! Writer (the owner only, serialised by its own lock):
//! `begin_write` (version -> odd, then a release fence), change the bytes,
//! `end_write` (version -> next even, release store).
//!
//! Reader (any process): load the version with acquire; if odd, retry; read
//! the entry and the bytes into private memory; acquire fence; load the
//! version again; if it changed, the copy may be torn: retry. A reader never
//! trusts what it copied unless both loads saw the same even version, and it
//! still verifies the copy's checksum, so a stale or torn copy is never
//! served.
//!
//! The protocol is written against [`SeqWord`] so the tests can run it on
//! [shuttle]'s atomics and explore interleavings; the arena runs it on
//! `AtomicU64`s placed in the shared mapping.
//!
//! [shuttle]: https://docs.rs/shuttle

use std::sync::atomic::{AtomicU64, Ordering};

/// A 64-bit atomic word and the fence that goes with it.
pub trait SeqWord {
    /// Atomic load.
    fn load(&self, order: Ordering) -> u64;
    /// Atomic store.
    fn store(&self, value: u64, order: Ordering);
    /// A memory fence of the same family of atomics.
    fn fence(order: Ordering);
}

impl SeqWord for AtomicU64 {
    fn load(&self, order: Ordering) -> u64 {
        AtomicU64::load(self, order)
    }
    fn store(&self, value: u64, order: Ordering) {
        AtomicU64::store(self, value, order)
    }
    fn fence(order: Ordering) {
        std::sync::atomic::fence(order)
    }
}

/// Marks the protected data as changing: the version becomes odd. Only the
/// single writer calls this, with the version even.
pub fn begin_write<W: SeqWord>(version: &W) {
    let v = version.load(Ordering::Relaxed);
    debug_assert!(v & 1 == 0, "begin_write on a version already odd");
    version.store(v.wrapping_add(1), Ordering::Relaxed);
    // Orders the odd version before every later write of the data: a reader
    // that sees any of those writes then sees the odd (or a later) version
    // on its second load.
    W::fence(Ordering::Release);
}

/// Marks the protected data stable again: the version becomes the next
/// even number; the release store publishes every write made since
/// [`begin_write`].
pub fn end_write<W: SeqWord>(version: &W) {
    let v = version.load(Ordering::Relaxed);
    debug_assert!(v & 1 == 1, "end_write on an even version");
    version.store(v.wrapping_add(1), Ordering::Release);
}

/// Whether the data is being written right now (a snapshot).
#[cfg(test)]
pub fn is_writing<W: SeqWord>(version: &W) -> bool {
    version.load(Ordering::Acquire) & 1 == 1
}

/// Runs `read` (which copies the protected data into private memory) until
/// one run happens entirely inside one even version, at most `tries` times.
/// Returns that run's result, or `None` when every try met a writer.
///
/// `read` may see torn data on the runs that are discarded, so it must only
/// copy and compute, never act on what it sees.
pub fn read<W: SeqWord, T>(version: &W, tries: usize, mut read: impl FnMut() -> T) -> Option<T> {
    for _ in 0..tries {
        let before = version.load(Ordering::Acquire);
        if before & 1 == 0 {
            let value = read();
            // Orders the data loads in `read` before the second version load.
            W::fence(Ordering::Acquire);
            if version.load(Ordering::Relaxed) == before {
                return Some(value);
            }
        }
        std::hint::spin_loop();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use shuttle::sync::Arc;
    use shuttle::sync::atomic::AtomicU64 as ShuttleU64;

    impl SeqWord for ShuttleU64 {
        fn load(&self, order: Ordering) -> u64 {
            ShuttleU64::load(self, order)
        }
        fn store(&self, value: u64, order: Ordering) {
            ShuttleU64::store(self, value, order)
        }
        fn fence(order: Ordering) {
            shuttle::sync::atomic::fence(order)
        }
    }

    /// A model slot: a version word, a key word and four data words. The
    /// writer keeps `data[i] == key * 10 + i` whenever the version is even,
    /// and changes the key (the slot is reused for another block) under
    /// `begin_write`/`end_write`, one word at a time.
    struct Slot {
        version: ShuttleU64,
        key: ShuttleU64,
        data: [ShuttleU64; 4],
    }

    impl Slot {
        fn new() -> Self {
            Self {
                version: ShuttleU64::new(0),
                key: ShuttleU64::new(1),
                data: std::array::from_fn(|i| ShuttleU64::new(10 + i as u64)),
            }
        }

        fn rewrite(&self, key: u64) {
            begin_write(&self.version);
            self.key.store(key, Ordering::Relaxed);
            for (i, d) in self.data.iter().enumerate() {
                d.store(key * 10 + i as u64, Ordering::Relaxed);
            }
            end_write(&self.version);
        }

        fn snapshot(&self) -> (u64, [u64; 4]) {
            (
                self.key.load(Ordering::Relaxed),
                std::array::from_fn(|i| self.data[i].load(Ordering::Relaxed)),
            )
        }
    }

    fn consistent((key, data): (u64, [u64; 4])) -> bool {
        data.iter()
            .enumerate()
            .all(|(i, d)| *d == key * 10 + i as u64)
    }

    /// What a reader returns: the key and data words it saw, if it trusts them.
    type Seen = Option<(u64, [u64; 4])>;

    fn writer_and_reader(reader: fn(&Slot) -> Seen) {
        let slot = Arc::new(Slot::new());
        let w = {
            let slot = Arc::clone(&slot);
            shuttle::thread::spawn(move || {
                slot.rewrite(2);
                slot.rewrite(3);
            })
        };
        for _ in 0..2 {
            if let Some(seen) = reader(&slot) {
                assert!(consistent(seen), "reader saw a torn slot: {seen:?}");
            }
        }
        w.join().unwrap();
        // Once the writer is done, a read always succeeds and sees the last key.
        assert_eq!(reader(&slot), Some((3, [30, 31, 32, 33])));
    }

    #[test]
    fn readers_never_see_a_torn_slot() {
        shuttle::check_random(
            || writer_and_reader(|slot| read(&slot.version, 3, || slot.snapshot())),
            2000,
        );
    }

    #[test]
    fn readers_never_see_a_torn_slot_exhaustive_pct() {
        shuttle::check_pct(
            || writer_and_reader(|slot| read(&slot.version, 3, || slot.snapshot())),
            2000,
            3,
        );
    }

    /// The test has teeth: a reader that skips the second version check is
    /// caught returning a torn slot.
    #[test]
    #[should_panic(expected = "torn")]
    fn a_reader_without_the_recheck_is_caught() {
        shuttle::check_random(
            || {
                writer_and_reader(|slot| {
                    let before = slot.version.load(Ordering::Acquire);
                    (before & 1 == 0).then(|| slot.snapshot())
                })
            },
            2000,
        );
    }
}
