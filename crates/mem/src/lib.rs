//! kvtier-mem (being written).
