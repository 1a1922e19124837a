//! Generated Tair-KVCM wire types: messages, gRPC stubs and their JSON
//! (serde) form, from `proto/` (see docs/meta-api.md). The transport layer
//! maps them to and from [`crate::model`].
#![allow(missing_docs, clippy::all, clippy::pedantic, rustdoc::all)]

/// `kv_cache_manager.proto.meta`: the meta service.
pub mod meta {
    tonic::include_proto!("kv_cache_manager.proto.meta");
    include!(concat!(
        env!("OUT_DIR"),
        "/kv_cache_manager.proto.meta.serde.rs"
    ));
}

/// `kv_cache_manager.proto.admin`: the admin service.
pub mod admin {
    tonic::include_proto!("kv_cache_manager.proto.admin");
    include!(concat!(
        env!("OUT_DIR"),
        "/kv_cache_manager.proto.admin.serde.rs"
    ));
}
