//! kvtier-store (being written).
