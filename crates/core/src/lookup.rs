//! [`Lookup`]: the outcome of reading a block from a tier.

/// What a tier found when asked for a block. `Corrupt` is a miss to the
/// caller (the bytes are never served) but is counted separately so
/// operators see failing media.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lookup {
    /// The block was found and its bytes verified.
    Hit,
    /// The tier does not hold the block.
    Miss,
    /// The tier held the block but its bytes failed verification (or the read
    /// failed); the tier dropped it. Treat as a miss.
    Corrupt,
}

impl Lookup {
    /// Whether the bytes may be used.
    pub const fn is_hit(self) -> bool {
        matches!(self, Lookup::Hit)
    }
}
