//! kvtier-disk (being written).
