//! [`Slab`]: a vector of reusable slots addressed by index, so an in-flight
//! operation can be named by a small integer (its io_uring `user_data`).

/// One slot: a value, or a link in the free list.
enum Entry<T> {
    Occupied(T),
    Vacant { next_free: Option<u32> },
}

/// Slots addressed by `u32` keys; freed keys are reused (last freed first, so
/// the hot slots stay in cache). Never shrinks.
pub(crate) struct Slab<T> {
    entries: Vec<Entry<T>>,
    free: Option<u32>,
    len: usize,
}

impl<T> Slab<T> {
    /// An empty slab with room for `n` values before it reallocates.
    pub(crate) fn with_capacity(n: usize) -> Self {
        Self {
            entries: Vec::with_capacity(n),
            free: None,
            len: 0,
        }
    }

    /// Number of occupied slots.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether no slot is occupied.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Stores `value` and returns its key.
    ///
    /// # Panics
    /// If more than `u32::MAX` values are live at once (the engines bound
    /// them by queue depth and batches in flight, far below that).
    pub(crate) fn insert(&mut self, value: T) -> u32 {
        self.len += 1;
        match self.free {
            Some(key) => {
                let slot = &mut self.entries[key as usize];
                let Entry::Vacant { next_free } = *slot else {
                    unreachable!("free list points at an occupied slot");
                };
                self.free = next_free;
                *slot = Entry::Occupied(value);
                key
            }
            None => {
                let key = u32::try_from(self.entries.len()).expect("slab key overflow");
                self.entries.push(Entry::Occupied(value));
                key
            }
        }
    }

    /// The value at `key`, if occupied.
    pub(crate) fn get_mut(&mut self, key: u32) -> Option<&mut T> {
        match self.entries.get_mut(key as usize) {
            Some(Entry::Occupied(v)) => Some(v),
            _ => None,
        }
    }

    /// Removes and returns the value at `key`, if occupied.
    pub(crate) fn remove(&mut self, key: u32) -> Option<T> {
        let slot = self.entries.get_mut(key as usize)?;
        if matches!(slot, Entry::Vacant { .. }) {
            return None;
        }
        let old = std::mem::replace(
            slot,
            Entry::Vacant {
                next_free: self.free,
            },
        );
        self.free = Some(key);
        self.len -= 1;
        match old {
            Entry::Occupied(v) => Some(v),
            Entry::Vacant { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_remove_reuse() {
        let mut s = Slab::with_capacity(2);
        let a = s.insert("a");
        let b = s.insert("b");
        assert_ne!(a, b);
        assert_eq!(s.len(), 2);
        assert_eq!(s.remove(a), Some("a"));
        assert_eq!(s.remove(a), None);
        assert_eq!(s.get_mut(a), None);
        let c = s.insert("c");
        assert_eq!(c, a, "freed keys are reused");
        assert_eq!(s.get_mut(b).copied(), Some("b"));
        assert_eq!(s.remove(b), Some("b"));
        assert_eq!(s.remove(c), Some("c"));
        assert!(s.is_empty());
        assert_eq!(s.remove(99), None);
    }
}
