//! TODO(io helper)
